// The experts split over ranks as the multi-GPU layouts run them (kernels/cuda_model/gpu_sharded.cpp),
// on one GPU with the collectives done on the host: TP (each rank's per-slot outputs for the
// experts it holds, zeros elsewhere, summed over ranks) and DEP (each slot run alone as a row
// of one slot on its expert's owner, with the other slots of that owner) both give moe_ffn's
// output bit for bit after moe_combine, on the decode tiles and on the prefill paths.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/fast/fast_ops.hpp"
#include "tests/gpu/gpu_test_util.hpp"

using namespace cedar;
using namespace cedar::gpu_test;
namespace ref = cedar::op_reference;
namespace fast = cedar::cuda::fast;

TEST_CASE("fast experts split over ranks (TP slots summed, DEP slots one by one) give moe_ffn's bits") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(71);
  const int d = 512, inter = 256, num_experts = 16, topk = 4, ranks = 2;
  std::vector<ref::owned_fp4> host_w;
  std::vector<std::unique_ptr<dev_fp4>> dev_w;
  for (int e = 0; e < num_experts; ++e)
    for (auto [out, in] : {std::pair{inter, d}, {inter, d}, {d, inter}})
      host_w.push_back(ref::random_fp4(rng, out, in));
  for (auto& w : host_w) dev_w.push_back(std::make_unique<dev_fp4>(w));
  std::vector<cpu::expert_weights> all(num_experts);
  std::vector<std::vector<cpu::expert_weights>> held(ranks, std::vector<cpu::expert_weights>(num_experts));
  for (int e = 0; e < num_experts; ++e) {
    all[e] = {dev_w[3 * e]->view, dev_w[3 * e + 1]->view, dev_w[3 * e + 2]->view};
    held[e % ranks][e] = all[e];
  }
  const auto s1 = ref::random_fp8(rng, inter, d), s3 = ref::random_fp8(rng, inter, d);
  const auto s2 = ref::random_fp8(rng, d, inter);
  dev_fp8 g1(s1), g3(s3), g2(s2);
  const cpu::shared_expert_weights shared{g1.view, g3.view, g2.view};
  std::normal_distribution<float> nd;
  const fast::tuning saved = fast::tuning_now();
  for (bool wgmma : {true, false})
    for (int m : {1, 3, 20, 150, 300, 700}) {
      fast::tuning_now().expert_wgmma = wgmma;
      const std::string what = "m=" + std::to_string(m) + (wgmma ? "" : " (no wgmma experts)");
      std::vector<float> y(std::size_t(m) * d);
      for (float& v : y) v = nd(rng);
      std::vector<int32_t> sel;
      std::vector<float> wts;
      random_routing(rng, m, topk, num_experts, sel, wts);
      dev<float> dy(y), dw(wts);
      dev<int32_t> ds(sel);
      dev<float> want(y.size());
      fast::moe_ffn(dy.get(), m, d, ds.get(), dw.get(), topk, all.data(), num_experts, &shared, 10.0f, want.get(),
                    true);
      const std::vector<float> expect = want.host();

      // TP: every rank every row; rank 0 also runs the shared expert
      std::vector<float> slots(std::size_t(m) * topk * d, 0.0f), shared_sum(std::size_t(m) * d, 0.0f);
      for (int r = 0; r < ranks; ++r) {
        dev<float> s(slots.size()), sh(shared_sum.size());
        fast::moe_slots(dy.get(), m, d, ds.get(), dw.get(), topk, held[r].data(), num_experts,
                        r == 0 ? &shared : nullptr, 10.0f, s.get(), sh.get());
        const auto hs = s.host();
        for (std::size_t i = 0; i < slots.size(); ++i) slots[i] += hs[i];
        if (r == 0) shared_sum = sh.host();
      }
      {
        dev<float> s(slots), sh(shared_sum), out(y.size());
        fast::moe_combine(s.get(), sh.get(), m, topk, d, true, out.get());
        CHECK_MESSAGE(ref::same_bits(out.host().data(), expect.data(), expect.size()), ("TP split " + what));
      }

      // DEP: rank r runs the slots of its experts as rows of one slot each
      std::vector<float> dep(std::size_t(m) * topk * d, 0.0f);
      for (int r = 0; r < ranks; ++r) {
        std::vector<int> mine;
        for (int s = 0; s < m * topk; ++s)
          if (sel[s] % ranks == r) mine.push_back(s);
        if (mine.empty()) continue;
        const int R = int(mine.size());
        std::vector<float> rows(std::size_t(R) * d), rw(R);
        std::vector<int32_t> rs(R);
        for (int j = 0; j < R; ++j) {
          std::copy_n(y.data() + std::size_t(mine[j] / topk) * d, d, rows.data() + std::size_t(j) * d);
          rs[j] = sel[mine[j]], rw[j] = wts[mine[j]];
        }
        dev<float> drows(rows), drw(rw), res(std::size_t(R) * d);
        dev<int32_t> drs(rs);
        fast::moe_slots(drows.get(), R, d, drs.get(), drw.get(), 1, held[r].data(), num_experts, nullptr, 10.0f,
                        res.get(), nullptr);
        const auto h = res.host();
        for (int j = 0; j < R; ++j)
          std::copy_n(h.data() + std::size_t(j) * d, d, dep.data() + std::size_t(mine[j]) * d);
      }
      {
        dev<float> s(dep), sh(y.size()), out(y.size());
        fast::shared_ffn(dy.get(), m, shared, 10.0f, sh.get());
        fast::moe_combine(s.get(), sh.get(), m, topk, d, true, out.get());
        CHECK_MESSAGE(ref::same_bits(out.host().data(), expect.data(), expect.size()), ("DEP split " + what));
      }
    }
  fast::tuning_now() = saved;
}
