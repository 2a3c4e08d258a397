// CPU reference of the attention core (spec §2.3 steps 7 and 9): sparse MQA over a gathered
// candidate set with a per-head sink, and the grouped output LoRA. fp32 throughout; each
// (row, head) is reduced in candidate order, so results do not depend on the batch.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/dot.hpp"
#include "kernels/cpu/op_check.hpp"
#include "kernels/ops.hpp"
#include "kernels/parallel.hpp"

namespace cedar::cpu {
namespace {

/// One (row, head): out = sum_c p_c kv[idx_c] with p = exp(s - max) / (exp(sink - max) + sum).
void attend_one(const float* q /*[dim]*/, int dim, const float* kv /*[num_kv, dim]*/,
                const int32_t* idx /*[num_idx]*/, int num_idx, float sink, float scale,
                float* probs /*[num_idx] scratch*/, float* out /*[dim]*/) {
  float mx = sink;
  for (int c = 0; c < num_idx; ++c) {
    if (idx[c] < 0) continue;
    probs[c] = dot(q, kv + static_cast<int64_t>(idx[c]) * dim, dim) * scale;
    mx = std::max(mx, probs[c]);
  }
  float denom = std::exp(sink - mx);
  for (int c = 0; c < num_idx; ++c) {
    if (idx[c] < 0) continue;
    probs[c] = std::exp(probs[c] - mx);
    denom += probs[c];
  }
  const float inv = 1.0f / denom;
  for (int i = 0; i < dim; ++i) out[i] = 0.0f;
  for (int c = 0; c < num_idx; ++c) {
    if (idx[c] < 0) continue;
    const float p = probs[c] * inv;
    const float* v = kv + static_cast<int64_t>(idx[c]) * dim;
    for (int i = 0; i < dim; ++i) out[i] += p * v[i];
  }
}

}  // namespace

void sparse_attention(const float* q, int m, int num_heads, int dim, const float* kv,
                      const int32_t* idx, int num_idx, const float* sink, float scale,
                      float* out) {
  parallel_for(0, static_cast<int64_t>(m) * num_heads, [&](int64_t rh) {
    const int64_t r = rh / num_heads;
    const int h = static_cast<int>(rh % num_heads);
    std::vector<float> probs(num_idx);
    attend_one(q + rh * dim, dim, kv, idx + r * num_idx, num_idx, sink[h], scale,
               probs.data(), out + rh * dim);
  });
}

void grouped_output(const float* o, int m, int groups, const bf16_weight& wo_a,
                    const fp8_weight& wo_b, float* out) {
  CEDAR_OP_CHECK(groups > 0 && wo_a.out % groups == 0, "wo_a rows split into groups");
  CEDAR_OP_CHECK(wo_b.in == wo_a.out, "wo_b takes concat(u)");
  const int rank = wo_a.out / groups;
  const int group_in = wo_a.in;  // heads_per_group * dim
  std::vector<float> o_g(static_cast<size_t>(m) * group_in);
  std::vector<float> u_g(static_cast<size_t>(m) * rank);
  std::vector<float> u(static_cast<size_t>(m) * wo_a.out);
  for (int g = 0; g < groups; ++g) {
    for (int r = 0; r < m; ++r) {
      const float* src = o + (static_cast<int64_t>(r) * groups + g) * group_in;
      std::copy(src, src + group_in, o_g.data() + static_cast<int64_t>(r) * group_in);
    }
    const bf16_weight block{rank, group_in, wo_a.data + static_cast<int64_t>(g) * rank * group_in};
    linear_bf16(o_g.data(), m, block, u_g.data());
    for (int r = 0; r < m; ++r) {
      const float* src = u_g.data() + static_cast<int64_t>(r) * rank;
      std::copy(src, src + rank, u.data() + (static_cast<int64_t>(r) * groups + g) * rank);
    }
  }
  linear_fp8(u.data(), m, wo_b, out);
}

}  // namespace cedar::cpu
