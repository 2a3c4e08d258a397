// A shard's work, in plain C++: it owns a model and the KV memory (a kv_arena, which the model
// makes: host memory for the CPU model, device memory for the GPU model), turns a run_step
// (page ids, ring slots, token ids) into forward_items, runs the forward pass and samples.
// Stateless between steps apart from the KV bytes, so a step can be retried elsewhere after
// replay. The shard actor owns one and runs it on its own thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "actors/kv_pool.hpp"
#include "actors/messages.hpp"
#include "actors/sampler.hpp"
#include "kernels/model/model.hpp"

namespace cedar {

/// The KV bytes of one shard: pages, SWA rings and compressor tails of a kv_capacity, in the
/// memory its model reads. Pointers stay valid for the arena's life. Touched by the shard's
/// thread during a step, and by the runtime (page copies) only while no step runs.
class kv_arena {
 public:
  virtual ~kv_arena() = default;
  virtual uint8_t* page(int32_t page_id) = 0;  ///< [page_bytes] bytes
  virtual uint8_t* ring(int32_t slot) = 0;     ///< [num_layers, window, swa_record_bytes] bytes
  virtual float* tails(int32_t slot) = 0;      ///< [num_ratio2_sources, 2, latent_dim] fp32
  /// True when the pointers above are device pointers.
  virtual bool on_device() const = 0;
  /// Copies page `id` into host memory `out` ([page_bytes] bytes).
  virtual void read_page(int32_t id, uint8_t* out) = 0;
  /// Copies page `src_id` of `src` (host or device memory, this arena or another) into page
  /// `dst_id`; returns when the bytes are in place.
  virtual void copy_page(int32_t dst_id, kv_arena& src, int32_t src_id) = 0;
};

/// KV in host memory (the CPU model's). Pages, rings and tails are allocated, zeroed, on first
/// use, so an unused budget costs no memory.
class host_kv_arena final : public kv_arena {
 public:
  host_kv_arena(const kv_layout& layout, kv_capacity cap);
  uint8_t* page(int32_t page_id) override;
  uint8_t* ring(int32_t slot) override;
  float* tails(int32_t slot) override;
  bool on_device() const override { return false; }
  void read_page(int32_t id, uint8_t* out) override;
  void copy_page(int32_t dst_id, kv_arena& src, int32_t src_id) override;

 private:
  kv_layout layout_;
  kv_capacity cap_;
  std::vector<std::unique_ptr<uint8_t[]>> pages_;
  std::vector<std::unique_ptr<uint8_t[]>> rings_;
  std::vector<std::unique_ptr<float[]>> tails_;
};

/// The forward pass a shard runs: the V4.1 `model`, or a test model with the same contract.
class step_model {
 public:
  virtual ~step_model() = default;
  virtual const model_args& args() const = 0;
  virtual const kv_layout& layout() const = 0;
  /// Same contract as model::forward; every item's KV comes from this model's make_arena.
  virtual void forward(std::span<forward_item> batch, std::vector<float>& logits) = 0;
  /// forward, then one token for each item whose logits are `last`, drawn by params[i] as its
  /// token_idx[i]-th generated token (sampler.hpp's rules), in item order. The default samples
  /// forward's logits on the host; a device model may draw where its logits are.
  virtual std::vector<sampled_token> forward_sample(std::span<forward_item> batch,
                                                    std::span<const sampling_params> params,
                                                    std::span<const int64_t> token_idx);
  /// Where the model computes, for operators: "cpu" (the default) or "cuda:N".
  virtual std::string device() const { return "cpu"; }
  /// The KV memory of a shard of capacity `cap`, where forward reads it (default: host
  /// memory). May throw std::runtime_error when the memory cannot be had.
  virtual std::unique_ptr<kv_arena> make_arena(const kv_capacity& cap) const {
    return std::make_unique<host_kv_arena>(layout(), cap);
  }
};

/// A TP follower's batch (shard_view::tp_follower): every item's logits set to none. Returns the
/// rows of logits the items had asked for (the leader computes them; the follower hands back
/// zeros or token 0 in their place).
std::size_t drop_logits(std::span<forward_item> batch);

/// Adapts cedar::model.
std::unique_ptr<step_model> wrap_model(std::shared_ptr<const model> m);

class shard {
 public:
  shard(std::unique_ptr<step_model> m, kv_capacity cap);
  /// Runs one step. Items are independent; results come back in item order.
  step_output run(const run_step& step);
  const step_model& model_ref() const { return *model_; }
  /// The KV bytes; the runtime copies pages in and out only while the shard runs no step.
  kv_arena& arena() { return *arena_; }

 private:
  std::unique_ptr<step_model> model_;
  std::unique_ptr<kv_arena> arena_;
};

}  // namespace cedar
