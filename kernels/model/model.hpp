// The V4.1-Flash model on the CPU backend: weights bound from a tensor_map and one forward
// call that advances a batch of requests by any number of tokens each (prefill chunks, replay
// windows and decode tokens mixed freely). Each request's KV lives in memory owned by the
// kv_pool and is reached through request_kv. Batch-invariant: a request's logits do not depend
// on the other requests in the batch.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "config/model_args.hpp"
#include "kernels/checkpoint/tensor_map.hpp"
#include "kernels/model/kv_layout.hpp"

namespace cedar {

/// What a request wants back from a forward call.
enum class logits_mode : uint8_t { none, last, all };

/// One request's slice of a forward call.
struct forward_item {
  request_kv* kv = nullptr;            ///< positions [kv->num_tokens, +tokens.size()) are run
  /// The token ids just before this chunk: at least the last args.history_lookback() (Engram's
  /// n-grams), or all of them when there are fewer; more are allowed and not read.
  std::span<const int32_t> history;
  std::span<const int32_t> tokens;     ///< the new tokens of this call
  logits_mode logits = logits_mode::last;
  /// Replay: rebuild SWA rings and compressor tails for already-cached positions without
  /// rewriting their global KV (pages are shared with the prefix cache).
  bool replay = false;
  /// Decoder truncation: layers >= args.truncate_from_layer skip rows whose position is below
  /// this value (prompt length - window at prefill); -1 = run every row. Their window then
  /// starts at this position. With logits `all`, only the kept rows return logits; an item
  /// whose rows all lie below it must ask for `none` (the chunks of a prompt before its end).
  int64_t truncate_below = -1;
};

/// Counters a caller (or a test) can read after a forward call.
struct shard_view;  // kernels/model/shard_plan.hpp

struct forward_stats {
  int64_t rows_per_layer[64] = {};  ///< rows processed by each layer's attention and MoE
  /// Largest |X| of the residual streams after each layer (+inf if any value is not finite).
  float max_abs_residual[64] = {};
};

class model {
 public:
  /// Binds weights; checks every tensor's name, shape and dtype against the config and throws
  /// std::runtime_error naming the first missing / mis-shaped / wrongly-typed tensor.
  /// page_tokens: positions per global-KV page (the engine's --page-tokens).
  model(model_args args, std::shared_ptr<const tensor_map> weights, kv_dtype kv = kv_dtype::fp4,
        int page_tokens = default_page_tokens);
  ~model();

  const model_args& args() const;
  const kv_layout& layout() const;

  /// Runs the batch. logits receives, in item order, vocab_size floats per requested row
  /// (1 for `last`, tokens.size() for `all`). Advances each kv->num_tokens.
  void forward(std::span<forward_item> batch, std::vector<float>& logits,
               forward_stats* stats = nullptr) const;

  /// The same forward pass as one rank of a parallel layout (kernels/model/shard_plan.hpp):
  /// TP ranks must all be called with the same batch, DEP ranks each with their own (possibly
  /// empty) batch; every rank of the group must make the call, since layers meet in
  /// collectives. Gives the same logits as forward() on one rank. Throws collective_error
  /// when the group is aborted.
  void forward(std::span<forward_item> batch, std::vector<float>& logits, const shard_view& shard,
               forward_stats* stats = nullptr) const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace cedar
