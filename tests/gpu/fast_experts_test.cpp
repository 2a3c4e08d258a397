// GPU test of the routed experts' wgmma products (kernels/cuda/fast/experts_wg.cu) on their own:
// experts of zero, one, 129 and 300 rows (whole and partial pieces of each token tile: 64, 128 and
// 256 rows), an expert another shard holds, weight scales from 2^-7 to 2^4, K over more steps
// than any tile's pipeline has slots.
// Each output within 2^-16 of sum_k |x_k w_k| of the CPU's W4A8 linear (the products are exact,
// only the order of the fp32 sums differs), every row of every expert written, nothing past the
// last row.
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cuda/fast/experts_wg.hpp"
#include "kernels/formats.hpp"
#include "tests/gpu/gpu_test_util.hpp"

namespace {

using namespace cedar;
using namespace cedar::gpu_test;
namespace ref = cedar::op_reference;

}  // namespace

TEST_CASE("fast experts wgmma: every expert's rows within 2^-16 of sum|xw| of the CPU op, no row past them") {
  if (!have_gpu()) return;
  const int d = 1024, inter = 256;  // d: 16 steps of 64, past every tile's 5 or 8 slots
  const std::vector<int> counts = {300, 0, 129, 1, 200};
  const int experts = int(counts.size()), held_elsewhere = 1, large_scales = 2;
  std::mt19937_64 rng(71);
  std::vector<ref::owned_fp4> host_w;
  std::vector<std::unique_ptr<dev_fp4>> dev_w;
  std::vector<cpu::expert_weights> host_e(experts), dev_e(experts);
  for (int e = 0; e < experts; ++e) {
    if (e == held_elsewhere) continue;
    for (auto [out, in] : {std::pair{inter, d}, {inter, d}, {d, inter}}) {
      host_w.push_back(ref::random_fp4(rng, out, in));
      if (e == large_scales)
        for (uint8_t& c : host_w.back().scale) c = uint8_t(127 + 2 + rng() % 3);  // 2^2 .. 2^4
      host_w.back().view.scale = host_w.back().scale.data();
    }
  }
  for (auto& w : host_w) dev_w.push_back(std::make_unique<dev_fp4>(w));
  for (int e = 0, i = 0; e < experts; ++e) {
    if (e == held_elsewhere) continue;
    host_e[e] = {host_w[i].view, host_w[i + 1].view, host_w[i + 2].view};
    dev_e[e] = {dev_w[i]->view, dev_w[i + 1]->view, dev_w[i + 2]->view};
    i += 3;
  }
  if (!cuda::fast::detail::experts_wg_supports(dev_e.data(), experts, d, inter)) {
    MESSAGE("no sm_90a device: the wgmma experts are not built for this one");
    return;
  }
  int rows = 0;
  std::vector<int> first(experts);
  for (int e = 0; e < experts; ++e) first[e] = rows, rows += counts[e];
  dev<cpu::expert_weights> table(dev_e);
  dev<int> dcounts(counts);

  for (int which : {0, 1}) {
    const int k = which == 0 ? d : inter, n = which == 0 ? 2 * inter : d;
    // rows already on the FP8 grid (so the CPU's W4A8 linear takes them as they are), as bf16
    std::vector<float> x = activations(rng, rows, k);
    for (int r = 0; r < rows; ++r) fmt::fake_quant_fp8(x.data() + std::size_t(r) * k, k);
    std::vector<uint16_t> xb(x.size());  // each row's columns in the kernel's order
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < k; ++c)
        xb[std::size_t(r) * k + cuda::fast::detail::wg_column(c)] = fmt::f32_to_bf16(x[std::size_t(r) * k + c]);
    dev<uint16_t> a(xb);

    std::vector<float> want(std::size_t(rows) * n);
    std::vector<double> sabs(want.size());
    for (int e = 0; e < experts; ++e) {
      if (counts[e] == 0) continue;
      const cpu::expert_weights& w = host_e[e];
      const fp4_weight* parts[2] = {which == 0 ? &w.w1 : &w.w2, which == 0 ? &w.w3 : nullptr};
      for (int part = 0, col = 0; part < 2 && parts[part] != nullptr; col += parts[part]->out, ++part) {
        const fp4_weight& wp = *parts[part];
        const std::vector<float> wd = ref::dequant(wp);
        std::vector<float> yp(std::size_t(counts[e]) * wp.out);
        const float* xe = x.data() + std::size_t(first[e]) * k;
        cpu::linear_fp4(xe, counts[e], wp, yp.data());
        for (int r = 0; r < counts[e]; ++r)
          for (int c = 0; c < wp.out; ++c) {
            double s = 0;
            for (int i = 0; i < k; ++i) s += std::fabs(double(xe[std::size_t(r) * k + i]) * wd[std::size_t(c) * k + i]);
            const std::size_t at = std::size_t(first[e] + r) * n + col + c;
            want[at] = yp[std::size_t(r) * wp.out + c];
            sabs[at] = s;
          }
      }
    }
    std::vector<float> first_tile;  // a row's sums do not depend on the tile: every tile's bits equal
    for (int tile : {16, 32, 64, 128, 256}) {
      const int spare = 8;  // rows past the last, which must stay as they are (0xFF bytes)
      dev<float> y(std::size_t(rows + spare) * n);
      cuda::fast::detail::experts_wg(a.get(), dcounts.get(), table.get(), experts, which, n, k, rows, y.get(), n, tile);
      const std::vector<float> got = y.host();
      if (first_tile.empty()) first_tile = got;
      CHECK_MESSAGE(ref::same_bits(got.data(), first_tile.data(), want.size()),
                    "experts_wg which=" << which << " tile " << tile << ": the 16-token tile's bits");
      check_bound("experts_wg which=" + std::to_string(which) + " tile " + std::to_string(tile),
                  std::vector<float>(got.begin(), got.begin() + std::ptrdiff_t(want.size())), want, sabs,
                  1.0 / 65536);
      bool untouched = true;
      for (std::size_t i = want.size(); i < got.size(); ++i) {
        uint32_t bits;
        std::memcpy(&bits, &got[i], 4);
        untouched = untouched && bits == 0xFFFFFFFFu;
      }
      CHECK_MESSAGE(untouched, "experts_wg which=" << which << " tile " << tile << " wrote past the last row");
    }
  }
}
