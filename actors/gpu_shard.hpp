// The GPU model (kernels/cuda_model) as a shard's step_model, with the shard's KV in device
// memory: make_arena gives a gpu_shard_arena (one device allocation for the pages, one for the
// rings and tails of every slot, zeroed), and forward runs gpu_model::forward on it directly,
// with no copy of KV bytes per step. Page copies between arenas (re-homing) are device copies,
// or host <-> device ones when the other arena is on the host. Built only with CUDA.
#pragma once

#ifdef CEDAR_HAVE_CUDA

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/rank_source.hpp"
#include "actors/shard.hpp"
#include "kernels/collectives/communicator.hpp"
#include "kernels/cuda_model/gpu_model.hpp"
#include "kernels/model/shard_plan.hpp"

namespace cedar {

/// A kv_capacity of KV in device memory, allocated and zeroed at once (a budget is device
/// memory held for the arena's life).
class gpu_shard_arena final : public kv_arena {
 public:
  /// On the calling thread's current device, which every later call makes current again.
  /// Throws std::runtime_error naming the bytes when the device cannot hold them.
  gpu_shard_arena(const kv_layout& layout, const kv_capacity& cap);
  ~gpu_shard_arena() override;
  gpu_shard_arena(const gpu_shard_arena&) = delete;
  gpu_shard_arena& operator=(const gpu_shard_arena&) = delete;

  uint8_t* page(int32_t page_id) override;
  uint8_t* ring(int32_t slot) override;
  float* tails(int32_t slot) override;
  bool on_device() const override { return true; }
  void read_page(int32_t id, uint8_t* out) override;
  void copy_page(int32_t dst_id, kv_arena& src, int32_t src_id) override;

  /// Device bytes held: pages, rings and tails.
  uint64_t device_bytes() const;

 private:
  int device_ = 0;
  kv_layout layout_;
  kv_capacity cap_;
  std::size_t tail_bytes_ = 0;    ///< per slot (at least 4, as the host arena's)
  uint8_t* pages_ = nullptr;      ///< [num_pages, page_bytes]
  uint8_t* rings_ = nullptr;      ///< [num_slots, ring_bytes]
  uint8_t* tails_ = nullptr;      ///< [num_slots, tail_bytes_]
};

/// The GPU model under a shard: KV on the device, gpu_model::forward per step. As a rank of a
/// multi-GPU layout it holds that rank's shard_view and the communicator joining it to the
/// other ranks (each rank's shard runs its steps on its own thread, at the same time as the
/// others); a TP follower (rank > 0) computes no logits and hands back zeros (logits) or token
/// 0 (sampling): the runtime takes the leader's.
class gpu_step_model final : public step_model {
 public:
  /// verbose: make_arena prints the KV it allocates on stderr. view.size > 1: m is placed as
  /// that rank (gpu_placement) and comm joins the group.
  gpu_step_model(std::shared_ptr<const gpu_model> m, bool verbose, shard_view view = {},
                 std::unique_ptr<communicator> comm = nullptr);
  const model_args& args() const override { return m_->args(); }
  const kv_layout& layout() const override { return m_->layout(); }
  void forward(std::span<forward_item> batch, std::vector<float>& logits) override;
  /// Draws on the device (gpu_model::forward_sample: only ids and logprobs come back); a row
  /// that asks for top logprobs or carries a mask (structured output, banned ids) has its
  /// logits copied back and drawn by the host sampler, the others stay on the device.
  std::vector<sampled_token> forward_sample(std::span<forward_item> batch, std::span<const sampling_params> params,
                                            std::span<const int64_t> token_idx) override;
  std::unique_ptr<kv_arena> make_arena(const kv_capacity& cap) const override;
  std::string device() const override { return "cuda:" + std::to_string(m_->device()); }

 private:
  const shard_view* view() const { return view_.size > 1 ? &view_ : nullptr; }

  std::shared_ptr<const gpu_model> m_;
  bool verbose_ = false;
  shard_view view_;
  std::unique_ptr<communicator> comm_;
};

/// The layouts of GPU models placed one per device (models[r] on device r, placed as rank r of
/// models.size()): tpN and depN for N = models.size() (tp1 with one model), switchable into
/// each other while serving, since both modes of one size keep the same weights on each
/// device. Each build joins the ranks with a new NCCL group; a shard's KV is on its device.
std::shared_ptr<rank_source> make_gpu_rank_source(std::vector<std::shared_ptr<const gpu_model>> models, bool verbose);

/// Runs fn(r) for r in [0, n), each on a thread of its own, all at once (set-up that ranks must
/// do together, such as joining an NCCL group, or that gains from it, such as uploading each
/// device's weights). Returns what each call threw ("" where it returned).
std::vector<std::string> on_rank_threads(int n, const std::function<void(int rank)>& fn);

/// NCCL communicators joining ranks 0..devices.size()-1, rank r on CUDA device devices[r] (each
/// joins on a thread of its own; the call returns when all have). Throws collective_error.
std::vector<std::unique_ptr<communicator>> make_gpu_group(const std::vector<int>& devices);

}  // namespace cedar

#endif  // CEDAR_HAVE_CUDA
