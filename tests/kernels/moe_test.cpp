// MoE routing and experts against slow versions over whole dequantized weights (spec §2.7):
// exact expert selection with ties to the lowest expert, the clamped SwiGLU with the route
// weight applied before W2, and a combine whose per-row bits do not depend on the batch.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cuda/fast/experts_wg.hpp"
#include "kernels/ops.hpp"
#include "tests/kernels/op_reference.hpp"

using namespace cedar;
using namespace cedar::op_reference;

namespace {

/// out += W2 q8(w * silu(min(W1 q8(y), L)) * clamp(W3 q8(y), -L, L)), all in double.
void swiglu_reference(const float* y, int m, const std::vector<float>& w1,
                      const std::vector<float>& w3, const std::vector<float>& w2, int d,
                      int inter, const float* weight, float limit, std::vector<double>& out) {
  const auto g = dense_linear(y, m, w1, inter, d, true);
  const auto u = dense_linear(y, m, w3, inter, d, true);
  std::vector<float> h(size_t(m) * inter);
  for (int r = 0; r < m; ++r)
    for (int i = 0; i < inter; ++i) {
      const double gi = std::min(g[size_t(r) * inter + i], double(limit));
      const double ui = std::clamp(u[size_t(r) * inter + i], -double(limit), double(limit));
      h[size_t(r) * inter + i] = float((weight ? weight[r] : 1.0) * gi / (1 + std::exp(-gi)) * ui);
    }
  const auto down = dense_linear(h.data(), m, w2, d, inter, true);
  for (size_t i = 0; i < down.size(); ++i) out[i] += down[i];
}

}  // namespace

TEST_CASE("moe_route: sqrt-softplus scores, biased top-k with ties to the lowest expert") {
  std::mt19937_64 rng(51);
  const int m = 6, d = 64, experts = 12, topk = 3;
  auto y = random_floats(rng, size_t(m) * d, -1, 1);
  auto gate = random_bf16(rng, experts, d, 0.3f);
  // Experts 7 and 9 copy expert 2's gate row: equal scores, so 2 must win before 7 before 9.
  std::copy_n(gate.data.begin() + 2 * d, d, gate.data.begin() + 7 * d);
  std::copy_n(gate.data.begin() + 2 * d, d, gate.data.begin() + 9 * d);
  std::vector<float> bias(experts, 0.0f);
  bias[2] = bias[7] = bias[9] = 5.0f;  // the tied trio is always selected
  std::vector<int32_t> sel(size_t(m) * topk);
  std::vector<float> w(size_t(m) * topk);
  cpu::moe_route(y.data(), m, gate.view, bias.data(), topk, 1.5f, sel.data(), w.data());
  std::vector<int32_t> sel_one(topk);
  std::vector<float> w_one(topk);
  cpu::moe_route(y.data() + size_t(m - 1) * d, 1, gate.view, bias.data(), topk, 1.5f,
                 sel_one.data(), w_one.data());
  CHECK(std::equal(sel_one.begin(), sel_one.end(), sel.begin() + size_t(m - 1) * topk));
  CHECK(same_bits(w_one.data(), w.data() + size_t(m - 1) * topk, topk));
  for (int r = 0; r < m; ++r) {
    CHECK(sel[size_t(r) * topk + 0] == 2);
    CHECK(sel[size_t(r) * topk + 1] == 7);
    CHECK(sel[size_t(r) * topk + 2] == 9);
    for (int i = 0; i < topk; ++i) CHECK(w[size_t(r) * topk + i] == doctest::Approx(0.5).epsilon(1e-6));
  }

  SUBCASE("random scores: the selection and weights of a double-precision version") {
    std::fill(bias.begin(), bias.end(), 0.0f);
    auto gate2 = random_bf16(rng, experts, d, 0.3f);
    auto b = random_floats(rng, experts, -0.2f, 0.2f);
    cpu::moe_route(y.data(), m, gate2.view, b.data(), topk, 1.5f, sel.data(), w.data());
    const auto logits = dense_linear(y.data(), m, dequant(gate2.view), experts, d, false);
    for (int r = 0; r < m; ++r) {
      std::vector<double> s(experts), biased(experts);
      for (int e = 0; e < experts; ++e) {
        s[e] = std::sqrt(std::log1p(std::exp(logits[size_t(r) * experts + e])));
        biased[e] = s[e] + b[e];
      }
      std::vector<int> order(experts);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return biased[a] > biased[c]; });
      double sum = 0;
      for (int i = 0; i < topk; ++i) sum += s[order[i]];
      for (int i = 0; i < topk; ++i) {
        CHECK(sel[size_t(r) * topk + i] == order[i]);
        CHECK(w[size_t(r) * topk + i] == doctest::Approx(s[order[i]] / sum * 1.5).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("expert_ffn_fp4 and expert_ffn_fp8 match the SwiGLU over dequantized weights") {
  std::mt19937_64 rng(52);
  const int m = 4, d = 64, inter = 96;
  auto y = random_floats(rng, size_t(m) * d, -2, 2);
  auto weight = random_floats(rng, m, 0.1f, 1.0f);
  for (float limit : {10.0f, 0.05f}) {  // 0.05 makes both clamps bite
    CAPTURE(limit);
    auto w1 = random_fp4(rng, inter, d), w3 = random_fp4(rng, inter, d), w2 = random_fp4(rng, d, inter);
    const cpu::expert_weights e{w1.view, w3.view, w2.view};
    auto base = random_floats(rng, size_t(m) * d, -1, 1);
    std::vector<float> out = base;
    cpu::expert_ffn_fp4(y.data(), m, e, weight.data(), limit, out.data());
    std::vector<double> ref(base.begin(), base.end());
    swiglu_reference(y.data(), m, dequant(w1.view), dequant(w3.view), dequant(w2.view), d, inter,
                     weight.data(), limit, ref);
    CHECK(rel_error(out.data(), ref.data(), out.size()) < 5e-3);

    auto s1 = random_fp8(rng, inter, d), s3 = random_fp8(rng, inter, d), s2 = random_fp8(rng, d, inter);
    out = base;
    cpu::expert_ffn_fp8(y.data(), m, {s1.view, s3.view, s2.view}, limit, out.data());
    ref.assign(base.begin(), base.end());
    swiglu_reference(y.data(), m, dequant(s1.view), dequant(s3.view), dequant(s2.view), d, inter,
                     nullptr, limit, ref);
    CHECK(rel_error(out.data(), ref.data(), out.size()) < 5e-3);
  }
}

TEST_CASE("moe_ffn sums routed experts in top-k order plus the shared expert, batch-invariant") {
  std::mt19937_64 rng(53);
  const int m = 1030, d = 64, inter = 32, num_experts = 5, topk = 2;  // rows span two chunks
  std::vector<owned_fp4> owned;
  std::vector<cpu::expert_weights> experts(num_experts);
  for (int e = 0; e < num_experts; ++e) {
    owned.push_back(random_fp4(rng, inter, d));
    owned.push_back(random_fp4(rng, inter, d));
    owned.push_back(random_fp4(rng, d, inter));
  }
  for (int e = 0; e < num_experts; ++e)
    experts[e] = {owned[3 * e].view, owned[3 * e + 1].view, owned[3 * e + 2].view};
  experts[4] = {};  // held by another shard: contributes nothing
  auto s1 = random_fp8(rng, inter, d), s3 = random_fp8(rng, inter, d), s2 = random_fp8(rng, d, inter);
  const cpu::shared_expert_weights shared{s1.view, s3.view, s2.view};
  auto y = random_floats(rng, size_t(m) * d, -1, 1);
  std::vector<int32_t> sel(size_t(m) * topk);
  for (auto& e : sel) e = int32_t(rng() % num_experts);
  auto w = random_floats(rng, sel.size(), 0.1f, 1.0f);

  std::vector<float> out(size_t(m) * d);
  cpu::moe_ffn(y.data(), m, d, sel.data(), w.data(), topk, experts.data(), num_experts, &shared,
               10.0f, out.data());
  for (int r = 0; r < m; ++r) {
    // The same row alone, expert by expert in top-k order, then the shared expert.
    std::vector<float> part(d), expect(d, 0.0f);
    for (int i = 0; i < topk; ++i) {
      std::fill(part.begin(), part.end(), 0.0f);
      const int e = sel[size_t(r) * topk + i];
      if (e != 4) cpu::expert_ffn_fp4(y.data() + size_t(r) * d, 1, experts[e], &w[size_t(r) * topk + i], 10.0f, part.data());
      for (int c = 0; c < d; ++c) expect[c] += part[c];
    }
    std::fill(part.begin(), part.end(), 0.0f);
    cpu::expert_ffn_fp8(y.data() + size_t(r) * d, 1, shared, 10.0f, part.data());
    for (int c = 0; c < d; ++c) expect[c] += part[c];
    CHECK(same_bits(expect.data(), out.data() + size_t(r) * d, d));
  }
}

TEST_CASE("the wgmma experts' column order: a permutation of each 64-column block that keeps pairs") {
  // (kernels/cuda/fast/experts_wg.hpp: the activations' writers and the kernel's weight
  // fragments agree on it; a thread's 16 columns 16 l .. 16 l + 15 are its fragments' pairs)
  for (int block = 0; block < 3; ++block) {
    std::vector<int> seen(64, 0);
    for (int p = 0; p < 64; ++p) {
      const int at = cuda::fast::detail::wg_column(64 * block + p);
      REQUIRE(at / 64 == block);
      ++seen[at % 64];
      if (p % 2 == 1) CHECK(at == cuda::fast::detail::wg_column(64 * block + p - 1) + 1);  // pairs adjacent
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  }
  // thread l's pair 2 kk + h (its codes' byte) lands where k16 step kk's fragment register a0
  // (h = 0) or a2 (h = 1) takes columns 2 l, 2 l + 1 (+ 8 for a2) of that step
  for (int l = 0; l < 4; ++l)
    for (int kk = 0; kk < 4; ++kk)
      for (int h = 0; h < 2; ++h)
        CHECK(cuda::fast::detail::wg_column(16 * l + 4 * kk + 2 * h) == 16 * kk + 8 * h + 2 * l);
}
