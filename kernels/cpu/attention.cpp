// CPU reference of the attention core (spec §2.3 steps 7 and 9): sparse MQA over a gathered
// candidate set with a per-head sink, and the grouped output LoRA. fp32 throughout; each
// (row, head) is reduced in candidate order (scores in dot_order), so results do not depend
// on the batch.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/dot.hpp"
#include "kernels/cpu/op_check.hpp"
#include "kernels/ops.hpp"
#include "kernels/parallel.hpp"

namespace cedar::cpu {
namespace {

/// Heads attended together: each gathered kv row is read once for all of them.
constexpr int head_block = 8;

/// Heads [h0, h0 + nh) of one row: out_h = sum_c p_hc kv[c] over the non-empty candidates,
/// p_hc = exp(s_hc - max_h) / (exp(sink_h - max_h) + sum_c exp(s_hc - max_h)).
void attend_heads(const float* q /*[nh, dim]*/, int nh, int dim,
                  const std::vector<const float*>& rows /*[nc] kv rows*/, const float* sink,
                  float scale, float* probs /*[nh, nc] scratch*/, float* out /*[nh, dim]*/) {
  const int nc = static_cast<int>(rows.size());
  for (int c = 0; c < nc; c += 4) {
    dot_tile(q, nh, dim, rows.data() + c, std::min(4, nc - c), probs + c, nc);
  }
  for (int h = 0; h < nh; ++h) {
    float* p = probs + static_cast<int64_t>(h) * nc;
    float mx = sink[h];
    for (int c = 0; c < nc; ++c) mx = std::max(mx, p[c] *= scale);
    float denom = std::exp(sink[h] - mx);
    for (int c = 0; c < nc; ++c) denom += (p[c] = std::exp(p[c] - mx));
    const float inv = 1.0f / denom;
    for (int c = 0; c < nc; ++c) p[c] *= inv;
  }
  std::fill(out, out + static_cast<int64_t>(nh) * dim, 0.0f);
  for (int c = 0; c < nc; ++c) {
    for (int h = 0; h < nh; ++h) {
      const float p = probs[static_cast<int64_t>(h) * nc + c];
      float* o = out + static_cast<int64_t>(h) * dim;
      for (int i = 0; i < dim; ++i) o[i] += p * rows[c][i];
    }
  }
}

}  // namespace

void sparse_attention(const float* q, int m, int num_heads, int dim, const float* kv,
                      const int32_t* idx, int num_idx, const float* sink, float scale,
                      float* out) {
  const int blocks = (num_heads + head_block - 1) / head_block;
  parallel_for(0, static_cast<int64_t>(m) * blocks, [&](int64_t rb) {
    const int64_t r = rb / blocks;
    const int h0 = static_cast<int>(rb % blocks) * head_block;
    const int nh = std::min(head_block, num_heads - h0);
    std::vector<const float*> rows;  // the non-empty candidates, in candidate order
    for (int c = 0; c < num_idx; ++c) {
      if (idx[r * num_idx + c] >= 0) rows.push_back(kv + static_cast<int64_t>(idx[r * num_idx + c]) * dim);
    }
    std::vector<float> probs(static_cast<size_t>(nh) * rows.size());
    const int64_t first = (r * num_heads + h0) * dim;
    attend_heads(q + first, nh, dim, rows, sink + h0, scale, probs.data(), out + first);
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
