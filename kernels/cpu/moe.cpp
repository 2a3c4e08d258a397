// CPU reference of the MoE (spec §2.7): sqrt-softplus routing with a selection-only bias,
// the clamped SwiGLU experts (FP4 routed, FP8 shared) and the combine. Each selected expert
// runs once over the rows routed to it; a row's outputs are summed in its top-k order, then
// the shared expert, so a row's bits never depend on the other rows of the batch.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/op_check.hpp"
#include "kernels/ops.hpp"
#include "kernels/parallel.hpp"

namespace cedar::cpu {
namespace {

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
float silu(float x) { return x / (1.0f + std::exp(-x)); }

/// Top-k experts of one row by biased score, best first, ties to the lowest expert.
void route_row(const float* s /*[n]*/, const float* bias /*[n]*/, int n, int topk,
               float route_scale, int32_t* sel /*[topk]*/, float* weights /*[topk]*/) {
  std::vector<float> biased(n);
  for (int e = 0; e < n; ++e) biased[e] = s[e] + bias[e];
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + topk, order.end(), [&](int32_t a, int32_t b) {
    return biased[a] > biased[b] || (biased[a] == biased[b] && a < b);
  });
  float sum = 0.0f;
  for (int i = 0; i < topk; ++i) sum += s[order[i]];
  for (int i = 0; i < topk; ++i) {
    sel[i] = order[i];
    weights[i] = s[order[i]] / (sum + 1e-20f) * route_scale;
  }
}

/// out += W2 (scale * silu(min(W1 y, limit)) * clamp(W3 y, -limit, limit)); scale = weight[r]
/// or 1 when weight is null. `lin` is the GEMM of the weight format.
template <class Weight, class Linear>
void swiglu_expert(const float* y /*[m, d]*/, int m, const Weight& w1, const Weight& w3,
                   const Weight& w2, const float* weight /*[m] or null*/, float limit,
                   float* out /*[m, d]*/, Linear lin) {
  CEDAR_OP_CHECK(w1.out == w3.out && w2.in == w1.out && w1.in == w2.out, "SwiGLU shapes");
  const int inter = w1.out;
  const int d = w2.out;
  std::vector<float> g(static_cast<size_t>(m) * inter), u(g.size());
  lin(y, m, w1, g.data());
  lin(y, m, w3, u.data());
  for (int r = 0; r < m; ++r) {
    const float scale = weight ? weight[r] : 1.0f;
    float* g_r = g.data() + static_cast<int64_t>(r) * inter;
    const float* u_r = u.data() + static_cast<int64_t>(r) * inter;
    for (int i = 0; i < inter; ++i) {
      const float h = silu(std::min(g_r[i], limit)) * std::clamp(u_r[i], -limit, limit);
      g_r[i] = weight ? scale * h : h;  // g now holds h, scaled before W2 (its input is FP8)
    }
  }
  std::vector<float> down(static_cast<size_t>(m) * d);
  lin(g.data(), m, w2, down.data());
  for (size_t i = 0; i < down.size(); ++i) out[i] += down[i];
}

}  // namespace

void moe_route(const float* y, int m, const bf16_weight& gate, const float* bias, int topk,
               float route_scale, int32_t* sel, float* weights) {
  const int n = gate.out;
  CEDAR_OP_CHECK(topk > 0 && topk <= n, "topk within the expert count");
  std::vector<float> s(static_cast<size_t>(m) * n);
  linear_bf16(y, m, gate, s.data());
  for (float& v : s) v = std::sqrt(softplus(v));
  parallel_for(0, m, [&](int64_t r) {
    route_row(s.data() + r * n, bias, n, topk, route_scale, sel + r * topk, weights + r * topk);
  });
}

void expert_ffn_fp4(const float* y, int m, const expert_weights& e, const float* weight,
                    float limit, float* out) {
  swiglu_expert(y, m, e.w1, e.w3, e.w2, weight, limit, out,
                [](const float* x, int rows, const fp4_weight& w, float* o) {
                  linear_fp4(x, rows, w, o);
                });
}

void expert_ffn_fp8(const float* y, int m, const shared_expert_weights& e, float limit,
                    float* out) {
  swiglu_expert(y, m, e.w1, e.w3, e.w2, nullptr, limit, out,
                [](const float* x, int rows, const fp8_weight& w, float* o) {
                  linear_fp8(x, rows, w, o);
                });
}

namespace {

/// Rows per moe_ffn chunk: bounds the [rows, topk, d] slot buffer (126 MB at real shapes).
constexpr int moe_chunk_rows = 1024;

/// Runs one expert over the rows of its slots (gathered), writing each slot's output to
/// partial[slot] [d].
void run_expert(const float* y /*[m, d]*/, int d, const std::vector<int64_t>& slots, int topk,
                const float* weights /*[m, topk]*/, const expert_weights& e, float limit,
                float* partial /*[m, topk, d]*/) {
  const int rows = static_cast<int>(slots.size());
  std::vector<float> y_e(static_cast<size_t>(rows) * d), w_e(rows);
  std::vector<float> out_e(static_cast<size_t>(rows) * d, 0.0f);
  for (int i = 0; i < rows; ++i) {
    const float* src = y + (slots[i] / topk) * d;
    std::copy(src, src + d, y_e.data() + static_cast<int64_t>(i) * d);
    w_e[i] = weights[slots[i]];
  }
  expert_ffn_fp4(y_e.data(), rows, e, w_e.data(), limit, out_e.data());
  for (int i = 0; i < rows; ++i) {
    const float* src = out_e.data() + static_cast<int64_t>(i) * d;
    std::copy(src, src + d, partial + slots[i] * d);
  }
}

/// moe_ffn over one chunk of m rows.
void moe_chunk(const float* y /*[m, d]*/, int m, int d, const int32_t* sel /*[m, topk]*/,
               const float* weights /*[m, topk]*/, int topk, const expert_weights* experts,
               int num_experts, const shared_expert_weights* shared, float limit,
               float* out /*[m, d]*/) {
  // Slots routed to each expert: slot = r * topk + i.
  std::vector<std::vector<int64_t>> slots(num_experts);
  for (int64_t slot = 0; slot < static_cast<int64_t>(m) * topk; ++slot) {
    if (sel[slot] < 0) continue;
    CEDAR_OP_CHECK(sel[slot] < num_experts, "selected expert exists");
    slots[sel[slot]].push_back(slot);
  }
  std::vector<float> partial(static_cast<size_t>(m) * topk * d, 0.0f);  // [m, topk, d]
  for (int e = 0; e < num_experts; ++e) {
    if (slots[e].empty() || experts[e].w1.data == nullptr) continue;
    run_expert(y, d, slots[e], topk, weights, experts[e], limit, partial.data());
  }
  std::vector<float> shared_out(static_cast<size_t>(m) * d, 0.0f);
  if (shared != nullptr) expert_ffn_fp8(y, m, *shared, limit, shared_out.data());
  parallel_for(0, m, [&](int64_t r) {
    float* o = out + r * d;
    std::fill(o, o + d, 0.0f);
    for (int i = 0; i < topk; ++i) {
      const float* p = partial.data() + (r * topk + i) * d;
      for (int c = 0; c < d; ++c) o[c] += p[c];
    }
    for (int c = 0; c < d; ++c) o[c] += shared_out[r * d + c];
  });
}

}  // namespace

void moe_ffn(const float* y, int m, int d, const int32_t* sel, const float* weights, int topk,
             const expert_weights* experts, int num_experts,
             const shared_expert_weights* shared, float limit, float* out) {
  // Rows go through in chunks so the per-slot buffer stays bounded; a row's result does not
  // depend on its chunk.
  for (int r0 = 0; r0 < m; r0 += moe_chunk_rows) {
    const int rows = std::min(moe_chunk_rows, m - r0);
    const int64_t first_slot = static_cast<int64_t>(r0) * topk;
    moe_chunk(y + static_cast<int64_t>(r0) * d, rows, d, sel + first_slot, weights + first_slot,
              topk, experts, num_experts, shared, limit, out + static_cast<int64_t>(r0) * d);
  }
}

}  // namespace cedar::cpu
