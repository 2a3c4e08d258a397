// Internal state of one model::forward call and the sublayer functions the layer loop calls.
// Rows of all items are concatenated in item order for row-wise ops (linears, norms, mHC,
// MoE); attention, compressors and indexers run item by item over the item's own KV.
// Everything here lives for one call on the calling thread (ops spread rows over cores).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "config/model_args.hpp"
#include "kernels/model/kv_layout.hpp"
#include "kernels/model/model.hpp"
#include "kernels/model/weights.hpp"
#include "kernels/ops.hpp"

namespace cedar::model_detail {

/// One item's active rows and the per-call state its sparse attention needs.
struct item_state {
  const forward_item* item = nullptr;
  request_kv* kv = nullptr;
  int row_begin = 0;        ///< first active row in the batch arrays
  int num_rows = 0;         ///< active rows (a suffix of the chunk once truncation drops rows)
  int64_t first_pos = 0;    ///< position of the first active row
  int64_t ring_valid_from = 0;  ///< lowest position whose ring records hold this request's KV
  std::vector<int32_t> topk;        ///< [num_rows, index_topk] entry ids, ascending, -1 padded
  std::vector<uint8_t> candidates;  ///< [num_rows, num_candidate_blocks] level-1 mask
  int num_candidate_blocks = 0;
};

/// The residual streams of all active rows of a call.
struct batch_state {
  int num_rows = 0;
  std::vector<item_state> items;
  std::vector<int32_t> positions;  ///< [num_rows]
  std::vector<float> X;            ///< [num_rows, hc, dim] residual streams (bf16 values)
  std::vector<float> pre;          ///< [num_rows, hc] the previous sublayer's collapse weights
};

/// What a sublayer needs to know about its layer.
struct layer_context {
  const model_args& args;
  const kv_layout& layout;
  const layer_info& info;
  const layer_weights& w;
  const cpu::rope_params& rope;
  bool truncated = false;  ///< layer >= args.truncate_from_layer
  const shard_view* shard = nullptr;  ///< this rank's part of a parallel layout; null = all of it
};

/// Lowest position whose ring record item `it` may read in this layer.
int64_t window_floor(const layer_context& c, const item_state& it);

/// Attention sublayer (spec §2.3-2.5) for every active row: x [n, dim] -> out [n, dim].
/// Runs the layer's compressor and indexer on each item first when it owns them, and writes
/// the layer's ring records.
void attention_sublayer(const layer_context& c, batch_state& b, const float* x, float* out);

/// KV-source compressor (spec §2.4, §2.5 step 1) over one item's rows x [num_rows, dim]:
/// updates the ratio-2 tail and, unless replaying, stores latents and index keys in pages.
void run_compressor(const layer_context& c, item_state& it, const float* x);

/// Indexer (spec §2.5) over one item's rows: qr [num_rows, q_lora], x [num_rows, dim].
/// Replaces it.topk; the candidate source also publishes it.candidates.
void run_indexer(const layer_context& c, item_state& it, const float* qr, const float* x);

/// Sets up rows, positions and streams: X = 4 copies of each token's embedding, pre = copy 0.
void init_batch(const model_args& args, const bf16_weight& embed, std::span<forward_item> batch,
                batch_state& b);

/// Engram (spec §2.8) before layer `layer`: X[r, h] += gate * value for every active row.
void apply_engram(const model_args& args, const cpu::engram_hash_params& hash,
                  const cpu::engram_weights& w, batch_state& b);

/// Drops, for each item with truncate_below >= 0, its rows below that position (and their
/// top-k and candidate rows), compacting the batch arrays.
void drop_truncated_rows(batch_state& b, int index_topk);

/// Final collapse with the last FFN's pre, RMSNorm and the fp32 head, for the rows each item
/// asks for, appended to logits in item order.
void head_logits(const model_args& args, const model_weights& w, const batch_state& b,
                 std::vector<float>& logits);

/// MoE sublayer (spec §2.7): y [n, dim] -> out [n, dim], rounded to bf16.
void moe_sublayer(const layer_context& c, const float* y, int n, float* out);

}  // namespace cedar::model_detail
