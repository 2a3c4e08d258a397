// CPU reference of the indexer (spec §2.5 steps 4-5): scores of one query row against every
// index key, and the level-1 candidate blocks of the two-level top-k. Each score is reduced
// in a fixed order (heads ascending, each dot in dot_order), so it is the same in any batch.
#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/cpu/dot.hpp"
#include "kernels/cpu/op_check.hpp"
#include "kernels/cpu/topk_row.hpp"
#include "kernels/ops.hpp"
#include "kernels/parallel.hpp"

namespace cedar::cpu {
namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

/// score = sum_h w[h] * relu(q[h] . key), heads ascending.
float index_score(const float* q /*[heads, dim]*/, const float* w /*[heads]*/, int heads,
                  int dim, const float* key /*[dim]*/) {
  float score = 0.0f;
  for (int h = 0; h < heads; ++h) {
    const float* qh = q + static_cast<int64_t>(h) * dim;
    score += w[h] * std::max(dot(qh, key, dim), 0.0f);
  }
  return score;
}

}  // namespace

void index_scores(const float* q, const float* w, int m, int heads, int dim, const float* keys,
                  int num_keys, const int32_t* num_visible, float* scores) {
  parallel_for(0, m, [&](int64_t r) {
    const float* q_r = q + r * heads * dim;
    const float* w_r = w + r * heads;
    const int visible = std::clamp(num_visible[r], 0, num_keys);
    float* s = scores + r * num_keys;
    for (int j = 0; j < visible; ++j) {
      s[j] = index_score(q_r, w_r, heads, dim, keys + static_cast<int64_t>(j) * dim);
    }
    std::fill(s + visible, s + num_keys, neg_inf);
  });
}

void candidate_blocks(const float* scores, int m, int n, int block, int keep,
                      const int32_t* num_visible, uint8_t* mask) {
  CEDAR_OP_CHECK(block > 0 && keep >= 0, "block size and keep count");
  const int num_blocks = (n + block - 1) / block;
  parallel_for(0, m, [&](int64_t r) {
    const float* s = scores + r * n;
    std::vector<float> block_score(num_blocks, neg_inf);
    for (int j = 0; j < n; ++j) block_score[j / block] = std::max(block_score[j / block], s[j]);
    // The newest visible entry's block always survives: give it the top score.
    if (num_visible[r] > 0) {
      const int newest = std::min(num_visible[r], n) - 1;
      block_score[newest / block] = std::numeric_limits<float>::infinity();
    }
    std::vector<int32_t> kept(keep);
    detail::topk_row(block_score.data(), num_blocks, keep, kept.data());
    uint8_t* mask_r = mask + r * num_blocks;
    std::fill(mask_r, mask_r + num_blocks, uint8_t{0});
    for (int32_t b : kept) {
      if (b >= 0) mask_r[b] = 1;
    }
  });
}

}  // namespace cedar::cpu
