// The V4.1-Flash model on one CUDA device: the forward contract of kernels/model/model.hpp
// (forward_item batches, logits per item) with weights, activations and KV on the device.
// A request's KV is a request_kv whose pointers (pages, SWA ring, compressor tails) are device
// pointers, handed out by gpu_kv_arena. Every step runs the CUDA ops (kernels/cuda/cuda_ops.hpp),
// which reproduce the CPU ops, so a request's logits match the CPU model's and do not depend on
// the other requests in the batch. Built only with CUDA (CEDAR_HAVE_CUDA).
#pragma once

#include <cstdint>

#include "config/model_args.hpp"

namespace cedar {
/// Which kernels the GPU model runs. exact: the CUDA ops of kernels/cuda, the CPU model's bits.
/// fast: tensor-core linear layers and fused kernels (kernels/cuda/fast), within stated bounds
/// of the CPU model.
enum class gpu_kernels { exact, fast };

/// Device memory one forward call of `step_tokens` rows may take beside the weights and the KV
/// (residual streams, q and o, the sublayer buffers, the experts' and linears' scratch, the
/// indexer's score tiles): a deliberately high estimate from the model's shapes, 1.5x the
/// per-row buffers plus the largest dequantized weight and 256 MiB (gpu_memory.cpp). Available
/// in every build (serving sizes the KV with it before any device is touched).
int64_t gpu_step_reserve_bytes(const model_args& args, int step_tokens);
}  // namespace cedar

#ifdef CEDAR_HAVE_CUDA

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "config/model_args.hpp"
#include "kernels/checkpoint/tensor_map.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/model/kv_layout.hpp"
#include "kernels/model/model.hpp"

namespace cedar {

struct shard_view;

/// Which part of the weights a gpu_model holds: rank `rank` of a `size`-rank layout (TP-N or
/// DEP-N, kernels/model/shard_plan.hpp) keeps the routed experts it owns (expert e on rank
/// e % size) and every other weight, so that one model serves both modes of its size.
struct gpu_placement {
  int rank = 0;
  int size = 1;
};

/// (bytes uploaded, bytes total) while weights are copied to the device.
using upload_progress_fn = std::function<void(uint64_t done, uint64_t total)>;

class gpu_model {
 public:
  /// Checks the tensors as cedar::model does (throws std::runtime_error naming the first bad
  /// one), then copies every weight to the device (the tensor_map may be an mmap of the
  /// safetensors files; it is not needed afterwards).
  /// dense_bf16 (fast kernels only): every dense FP8 linear is also kept on the device as bf16
  /// (twice those weights' bytes again), so that products of more rows than the GEMV takes skip
  /// dequantizing the weight on every call (cuBLAS on the copy; without it the large weights
  /// take the narrow32 tile up to 64 rows: results within the same bounds, other bits).
  /// The model lives on the calling thread's current device (cuda::set_device first); every
  /// call later makes that device current on its thread. placement.size > 1 (fast kernels only):
  /// one rank's experts; forward then needs a shard_view of that rank and size. page_tokens: the
  /// KV pages' positions (kv_layout::make; even, >= 2).
  gpu_model(model_args args, std::shared_ptr<const tensor_map> weights, kv_dtype kv = kv_dtype::fp4,
            const upload_progress_fn& progress = {}, gpu_kernels kernels = gpu_kernels::exact,
            bool dense_bf16 = false, gpu_placement placement = {}, int page_tokens = default_page_tokens);
  ~gpu_model();

  const model_args& args() const;
  const kv_layout& layout() const;
  gpu_kernels kernels() const;
  /// Device bytes held by the weights.
  uint64_t weight_bytes() const;
  /// Pinned host bytes the kernels read over the bus: the Engram tables where they stay in host
  /// memory ($CEDAR_GPU_ENGRAM_TABLES=host, or auto when the weights with them do not fit the
  /// device and without them do), else 0. Bits are the same either way.
  uint64_t host_weight_bytes() const;
  int device() const;
  const gpu_placement& placement() const;

  /// As model::forward (replay and decoder truncation included); every item's kv holds device
  /// pointers. view: this rank of a multi-rank layout (its communicator joins the other ranks'
  /// models, each called at the same time on its own thread; kernels/model/shard_plan.hpp says
  /// what each mode splits); null for one rank. A DEP rank with no items still takes part in
  /// every layer's expert exchange. Bits: a TP-N or DEP-N rank's rows get TP-1's bits as far as
  /// the fast kernels' tiles are chosen alike (the slot exchange and head gather are exact).
  void forward(std::span<forward_item> batch, std::vector<float>& logits, forward_stats* stats = nullptr,
               const shard_view* view = nullptr) const;

  /// As forward, but the logits stay on the device and one token is drawn there for each item
  /// whose logits are `last` (`all` is refused): greedy rows (temperature 0) in one launch
  /// (cuda::fast::greedy_rows), the others by cuda::sample_rows (the host sampler's rules and
  /// draws). requests: one per such item, in item order; tokens and logprobs get one entry each.
  /// host_rows (ascending indices into those items): their logits are also copied into
  /// *host_logits, [host_rows.size(), vocab], for a sampler that needs them on the host.
  void forward_sample(std::span<forward_item> batch, std::span<const cuda::sample_request> requests,
                      std::vector<int32_t>& tokens, std::vector<float>& logprobs,
                      forward_stats* stats = nullptr, const shard_view* view = nullptr,
                      std::span<const int> host_rows = {}, std::vector<float>* host_logits = nullptr) const;

  /// As forward, but every item's kv holds HOST pointers (a CPU-side kv_pool, as the shard's
  /// kv_arena hands out): each item's pages, ring and tails are copied to the device before the
  /// step and back after it. A bridge for runtimes whose KV lives on the host; it moves every
  /// page of every item each step.
  void forward_host_kv(std::span<forward_item> batch, std::vector<float>& logits,
                       forward_stats* stats = nullptr) const;

  struct impl;  ///< the backend's state (gpu_forward.hpp)

 private:
  std::unique_ptr<impl> impl_;
};

/// Device KV memory: global-KV pages carved from one allocation of `memory_fraction` of the
/// free device memory, plus a ring and tails per request.
class gpu_kv_arena {
 public:
  gpu_kv_arena(const kv_layout& layout, double memory_fraction);
  ~gpu_kv_arena();
  gpu_kv_arena(const gpu_kv_arena&) = delete;
  gpu_kv_arena& operator=(const gpu_kv_arena&) = delete;

  /// KV for a request of up to max_tokens positions (pages, zeroed ring and tails), or nullopt
  /// when the pages do not fit.
  std::optional<request_kv> allocate(int64_t max_tokens);
  /// Returns a request's pages, ring and tails.
  void release(request_kv& kv);

  int64_t total_pages() const { return int64_t(free_.size()) + used_; }
  int64_t free_pages() const { return int64_t(free_.size()); }

 private:
  kv_layout layout_;
  uint8_t* base_ = nullptr;
  std::vector<uint8_t*> free_;
  int64_t used_ = 0;
};

}  // namespace cedar

#endif  // CEDAR_HAVE_CUDA
