// An index source's indexer and two-level top-k (spec §2.5) over one item's rows. Each indexer
// scores its own KV source's index keys (the fix of spec §5 item 5). The candidate source keeps
// its level-1 block mask for the Reindex layers after it and takes its own top-k over the
// unmasked scores; Reindex layers mask their scores to those blocks first. Scores are computed
// for a bounded number of rows at a time so scratch stays under max_score_bytes.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/op_check.hpp"
#include "kernels/formats.hpp"
#include "kernels/model/forward_pass.hpp"
#include "kernels/model/kv_io.hpp"

namespace cedar::model_detail {
namespace {

constexpr std::size_t max_score_bytes = std::size_t(128) << 20;

/// Index queries qI [T, heads, dim] (rotated, FP4 grid) and head weights w [T, heads].
void index_queries(const layer_context& c, const item_state& it, const float* qr, const float* x,
                   std::vector<float>& q, std::vector<float>& w) {
  const model_args& a = c.args;
  const int T = it.num_rows, nih = a.index_n_heads, dih = a.index_head_dim;
  q.resize(std::size_t(T) * nih * dih);
  cpu::linear_fp8(qr, T, c.w.attn.indexer.wq_b, q.data());
  std::vector<int32_t> pos(T);
  for (int t = 0; t < T; ++t) pos[t] = int32_t(it.first_pos + t);
  cpu::rope(q.data(), T, nih, dih, pos.data(), c.rope, false);
  for (int t = 0; t < T; ++t) fmt::fake_quant_fp4_pow2(q.data() + std::size_t(t) * nih * dih, nih * dih);
  w.resize(std::size_t(T) * nih);
  cpu::linear_bf16(x, T, c.w.attn.indexer.weights_proj, w.data());
  const float head_scale = float(1.0 / std::sqrt(double(dih)) / std::sqrt(double(nih)));
  for (float& v : w) v *= head_scale;
}

/// Sets to -inf every score outside the row's level-1 candidate blocks.
void mask_to_candidates(const layer_context& c, const item_state& it, int row0, int m, int n,
                        float* scores) {
  const int block = c.args.candidate_block_size;
  CEDAR_OP_CHECK(it.num_candidate_blocks == (n + block - 1) / block, "candidate mask size");
  for (int r = 0; r < m; ++r) {
    const uint8_t* mask = it.candidates.data() + std::size_t(row0 + r) * it.num_candidate_blocks;
    for (int j = 0; j < n; ++j)
      if (!mask[j / block]) scores[std::size_t(r) * n + j] = -std::numeric_limits<float>::infinity();
  }
}

}  // namespace

void run_indexer(const layer_context& c, item_state& it, const float* qr, const float* x) {
  const model_args& a = c.args;
  const int T = it.num_rows, ratio = c.info.compress_ratio, K = a.index_topk;
  const int nih = a.index_n_heads, dih = a.index_head_dim;
  const int n = int((it.first_pos + T) / ratio);  // entries visible to the last row
  it.topk.assign(std::size_t(T) * K, -1);
  if (c.info.is_candidate_source) {
    it.num_candidate_blocks = (n + a.candidate_block_size - 1) / a.candidate_block_size;
    it.candidates.assign(std::size_t(T) * it.num_candidate_blocks, 0);
  }
  if (n == 0) return;

  std::vector<float> keys(std::size_t(n) * dih);  // [n, index_head_dim]
  for (int j = 0; j < n; ++j)
    load_index_key(c.layout, *it.kv, c.info.kv_source_slot, j, keys.data() + std::size_t(j) * dih);
  std::vector<float> q, w;
  index_queries(c, it, qr, x, q, w);
  std::vector<int32_t> num_visible(T);
  for (int t = 0; t < T; ++t) num_visible[t] = int32_t((it.first_pos + t + 1) / ratio);

  const int rows_per_chunk =
      int(std::max<std::size_t>(1, max_score_bytes / (sizeof(float) * std::size_t(n))));
  std::vector<float> scores;  // [rows of this chunk, n]
  for (int r0 = 0; r0 < T; r0 += rows_per_chunk) {
    const int m = std::min(rows_per_chunk, T - r0);
    scores.resize(std::size_t(m) * n);
    cpu::index_scores(q.data() + std::size_t(r0) * nih * dih, w.data() + std::size_t(r0) * nih, m,
                      nih, dih, keys.data(), n, num_visible.data() + r0, scores.data());
    if (c.info.is_candidate_source)
      cpu::candidate_blocks(scores.data(), m, n, a.candidate_block_size, a.candidate_topk_blocks,
                            num_visible.data() + r0,
                            it.candidates.data() + std::size_t(r0) * it.num_candidate_blocks);
    if (c.info.uses_candidates) mask_to_candidates(c, it, r0, m, n, scores.data());
    cpu::topk_indices(scores.data(), m, n, K, it.topk.data() + std::size_t(r0) * K);
  }
}

}  // namespace cedar::model_detail
