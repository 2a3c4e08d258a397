// A shard's work, in plain C++: it owns a model and the KV memory (a kv_arena), turns a
// run_step (page ids, ring slots, token ids) into forward_items, runs the forward pass and
// samples. Stateless between steps apart from the KV bytes, so a step can be retried
// elsewhere after replay. The shard actor owns one and runs it on its own thread.
#pragma once

#include <memory>
#include <vector>

#include "actors/kv_pool.hpp"
#include "actors/messages.hpp"
#include "kernels/model/model.hpp"

namespace cedar {

/// The forward pass a shard runs: the V4.1 `model`, or a test model with the same contract.
class step_model {
 public:
  virtual ~step_model() = default;
  virtual const model_args& args() const = 0;
  virtual const kv_layout& layout() const = 0;
  /// Same contract as model::forward.
  virtual void forward(std::span<forward_item> batch, std::vector<float>& logits) = 0;
};

/// Adapts cedar::model.
std::unique_ptr<step_model> wrap_model(std::shared_ptr<const model> m);

/// The KV bytes of one shard: pages, rings and tails of a kv_capacity. Pages are allocated
/// on first use, so an unused budget costs no memory.
class kv_arena {
 public:
  kv_arena(const kv_layout& layout, kv_capacity cap);
  uint8_t* page(int32_t page_id);  ///< [page_bytes] bytes
  uint8_t* ring(int32_t slot);     ///< [num_layers, window, swa_record_bytes] bytes
  float* tails(int32_t slot);      ///< [num_ratio2_sources, 2, latent_dim] fp32

 private:
  kv_layout layout_;
  kv_capacity cap_;
  std::vector<std::unique_ptr<uint8_t[]>> pages_;
  std::vector<std::unique_ptr<uint8_t[]>> rings_;
  std::vector<std::unique_ptr<float[]>> tails_;
};

class shard {
 public:
  shard(std::unique_ptr<step_model> m, kv_capacity cap);
  /// Runs one step. Items are independent; results come back in item order.
  step_output run(const run_step& step);
  const step_model& model_ref() const { return *model_; }
  /// The KV bytes; the runtime copies pages in and out only while the shard runs no step.
  kv_arena& arena() { return arena_; }

 private:
  std::unique_ptr<step_model> model_;
  kv_arena arena_;
};

}  // namespace cedar
