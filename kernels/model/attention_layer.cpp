// The attention sublayer of one layer (spec §2.3): query and window-KV projections for all
// rows, then item by item the layer's compressor and indexer (when it owns them), the
// candidate set (window positions oldest first, then the top-k compressed entries in entry
// order), sparse attention with the sink, and the ring writes; finally the inverse RoPE and
// the grouped output LoRA for all rows.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/op_check.hpp"
#include "kernels/formats.hpp"
#include "kernels/model/forward_pass.hpp"
#include "kernels/model/kv_io.hpp"
#include "kernels/model/shard_forward.hpp"

namespace cedar::model_detail {
namespace {

/// Sparse attention of one item over heads [h0, h0 + nh): q [T, nh, head_dim], kv [T, head_dim]
/// (this chunk's window KV, on the FP8 grid) -> o [T, nh, head_dim].
void attend_item(const layer_context& c, const item_state& it, int h0, int nh, const float* q,
                 const float* kv, float* o) {
  const int T = it.num_rows, dh = c.args.head_dim, W = c.args.sliding_window;
  const int64_t p0 = it.first_pos;
  const int64_t floor_pos = window_floor(c, it);
  const int64_t ring_lo = std::max(floor_pos, p0 - (W - 1));
  const int ring_n = int(std::max<int64_t>(0, p0 - ring_lo));
  const int K = c.info.compress_ratio > 0 ? c.args.index_topk : 0;

  // Compressed entries referenced by any row, each unpacked once.
  std::vector<int32_t> entries;
  if (K > 0) {
    entries.assign(it.topk.begin(), it.topk.begin() + std::size_t(T) * K);
    std::sort(entries.begin(), entries.end());
    entries.erase(std::unique(entries.begin(), entries.end()), entries.end());
    if (!entries.empty() && entries.front() < 0) entries.erase(entries.begin());
  }
  const int num_window = ring_n + T;
  std::vector<float> buf(std::size_t(num_window + entries.size()) * dh);  // [num_kv, dh]
  for (int k = 0; k < ring_n; ++k)
    load_ring(c.layout, *it.kv, c.info.layer_idx, ring_lo + k, buf.data() + std::size_t(k) * dh);
  std::copy(kv, kv + std::size_t(T) * dh, buf.begin() + std::size_t(ring_n) * dh);
  for (std::size_t e = 0; e < entries.size(); ++e)
    load_latent(c.layout, *it.kv, c.info.kv_source_slot, entries[e],
                buf.data() + (num_window + e) * dh);

  const int num_idx = W + K;
  std::vector<int32_t> idx(std::size_t(T) * num_idx, -1);  // [T, W + K]
  for (int t = 0; t < T; ++t) {
    const int64_t i = p0 + t;
    int32_t* row = idx.data() + std::size_t(t) * num_idx;
    int n = 0;
    for (int64_t p = std::max(floor_pos, i - (W - 1)); p <= i; ++p) row[n++] = int32_t(p - ring_lo);
    for (int k = 0; k < K; ++k) {
      const int32_t j = it.topk[std::size_t(t) * K + k];
      if (j < 0) continue;
      const auto at = std::lower_bound(entries.begin(), entries.end(), j) - entries.begin();
      row[W + k] = int32_t(num_window + at);
    }
  }
  const float scale = 1.0f / std::sqrt(float(dh));
  cpu::sparse_attention(q, T, nh, dh, buf.data(), idx.data(), num_idx, c.w.attn.sink.data() + h0, scale, o);
}

/// Writes the ring records of the item's last min(T, window) rows.
void write_ring(const layer_context& c, item_state& it, const float* kv /*[T, head_dim]*/) {
  const int T = it.num_rows, dh = c.args.head_dim;
  for (int t = std::max(0, T - c.args.sliding_window); t < T; ++t)
    store_ring(c.layout, *it.kv, c.info.layer_idx, it.first_pos + t, kv + std::size_t(t) * dh);
}

}  // namespace

int64_t window_floor(const layer_context& c, const item_state& it) {
  int64_t lo = it.ring_valid_from;
  if (c.truncated && it.item->truncate_below >= 0) lo = std::max(lo, it.item->truncate_below);
  return lo;
}

void attention_sublayer(const layer_context& c, batch_state& b, const float* x, float* out) {
  const model_args& a = c.args;
  const attention_weights& w = c.w.attn;
  const int n = b.num_rows, D = a.hidden_size, dh = a.head_dim;
  const bool split = c.shard && c.shard->splits_heads();
  const int h0 = split ? c.shard->head_begin : 0;  // this rank's query heads [h0, h0 + nh)
  const int nh = split ? c.shard->num_heads() : a.num_attention_heads;
  const float eps = float(a.rms_norm_eps);
  const int32_t* pos = b.positions.data();

  std::vector<float> qr(std::size_t(n) * a.q_lora_rank);  // [n, q_lora]
  cpu::linear_fp8(x, n, w.wq_a, qr.data());
  cpu::rmsnorm(qr.data(), n, a.q_lora_rank, w.q_norm.data(), eps, qr.data());
  std::vector<float> q(std::size_t(n) * nh * dh);  // [n, heads, head_dim]
  cpu::linear_fp8(qr.data(), n, split ? head_rows(w.wq_b, h0, nh, dh) : w.wq_b, q.data());
  cpu::rope(q.data(), n, nh, dh, pos, c.rope, false);

  std::vector<float> kv(std::size_t(n) * dh);  // [n, head_dim] window KV, K = V
  cpu::linear_fp8(x, n, w.wkv, kv.data());
  cpu::rmsnorm(kv.data(), n, dh, w.kv_norm.data(), eps, kv.data());
  cpu::rope(kv.data(), n, 1, dh, pos, c.rope, false);
  for (int r = 0; r < n; ++r) fmt::fake_quant_fp8(kv.data() + std::size_t(r) * dh, dh);

  std::vector<float> o(std::size_t(n) * nh * dh);  // [n, heads, head_dim]
  for (item_state& it : b.items) {
    if (it.num_rows == 0) continue;
    const std::size_t r0 = it.row_begin;
    if (c.info.is_kv_source) run_compressor(c, it, x + r0 * D);
    if (c.info.is_index_source)
      run_indexer(c, it, qr.data() + r0 * a.q_lora_rank, x + r0 * D);
    attend_item(c, it, h0, nh, q.data() + r0 * nh * dh, kv.data() + r0 * dh, o.data() + r0 * nh * dh);
    write_ring(c, it, kv.data() + r0 * dh);
  }
  cpu::rope(o.data(), n, nh, dh, pos, c.rope, true);
  if (split) gather_heads(*c.shard, o, n, dh);  // every rank runs the output LoRA on all heads
  cpu::grouped_output(o.data(), n, a.o_groups, w.wo_a, w.wo_b, out);
}

}  // namespace cedar::model_detail
