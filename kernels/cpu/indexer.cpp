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

/// scores[i] = sum_h w[h] * relu(q[h] . keys[i]) for up to 4 keys (heads ascending); the dots
/// of a 4-key tile share each q load.
void score_tile(const float* q /*[heads, dim]*/, const float* w /*[heads]*/, int heads, int dim,
                const float* const* keys /*[n] -> [dim]*/, int n, float* dots /*[heads, 4]*/,
                float* scores /*[n]*/) {
  dot_tile(q, heads, dim, keys, n, dots, 4);
  for (int i = 0; i < n; ++i) {
    float score = 0.0f;
    for (int h = 0; h < heads; ++h) score += w[h] * std::max(dots[h * 4 + i], 0.0f);
    scores[i] = score;
  }
}

}  // namespace

void index_scores(const float* q, const float* w, int m, int heads, int dim, const float* keys,
                  int num_keys, const int32_t* num_visible, float* scores) {
  parallel_for(0, m, [&](int64_t r) {
    const float* q_r = q + r * heads * dim;
    const float* w_r = w + r * heads;
    const int visible = std::clamp(num_visible[r], 0, num_keys);
    float* s = scores + r * num_keys;
    std::vector<float> dots(static_cast<size_t>(heads) * 4);
    for (int j = 0; j < visible; j += 4) {
      const int n = std::min(4, visible - j);
      const float* tile[4];
      for (int i = 0; i < n; ++i) tile[i] = keys + static_cast<int64_t>(j + i) * dim;
      score_tile(q_r, w_r, heads, dim, tile, n, dots.data(), s + j);
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
