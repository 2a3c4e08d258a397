// The model the model commands run, on the device `--device` names: the CPU model, or the GPU
// model (kernels/cuda_model) when cedar is built with CUDA. Also the step_model that puts the
// GPU model under the serving engine. Weights come from a checkpoint directory or a preset
// (random weights, generated in host memory with progress on stderr, then uploaded).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "actors/shard.hpp"
#include "kernels/checkpoint/tensor_map.hpp"
#include "kernels/cuda_model/gpu_model.hpp"
#include "kernels/model/model.hpp"
#include "actors/rank_source.hpp"
#include "kernels/model/shard_plan.hpp"

namespace cedar::cli {

enum class device_kind { cpu, cuda };

/// "cpu" | "cuda" -> the kind; nullopt on anything else.
std::optional<device_kind> parse_device(const std::string& text);

/// "exact" | "fast" -> the GPU model's kernel set; nullopt on anything else.
std::optional<gpu_kernels> parse_gpu_kernels(const std::string& text);

/// Empty when `device` can run here; otherwise why not ("cedar was built without CUDA", or the
/// CUDA runtime's reason when no device is present).
std::string device_unavailable(device_kind device);

/// Loads DIR's safetensors (checked against the config) or generates PRESET's random weights
/// from `seed` on every core. verbose: progress and the load time on stderr. On failure
/// returns nullptr and sets *error.
std::shared_ptr<const tensor_map> load_weights(const std::string& dir_or_preset, const model_args& args,
                                               uint64_t seed, bool verbose, std::string* error);

/// A model the CLI drives one forward call at a time.
class cli_model {
 public:
  virtual ~cli_model() = default;
  virtual const model_args& args() const = 0;
  virtual const kv_layout& layout() const = 0;
  /// model::forward; every item's kv must come from new_request of this model.
  virtual void forward(std::span<forward_item> batch, std::vector<float>& logits) = 0;
  /// KV memory for one request of up to max_tokens positions, zeroed, in the memory forward
  /// reads (host or device); freed with the returned pointer.
  virtual std::shared_ptr<request_kv> new_request(int64_t max_tokens) = 0;
};

/// Opens DIR or PRESET (as load_weights) on `device`. cuda: weights uploaded to the device
/// (progress on stderr when verbose), KV in device memory. nullptr and *error on failure.
/// `kernels` picks the GPU model's kernel set and `dense_bf16` keeps bf16 copies of its dense
/// linears (gpu_model; both ignored on the CPU).
std::unique_ptr<cli_model> open_cli_model(const std::string& dir_or_preset, uint64_t seed, kv_dtype dtype,
                                          device_kind device, gpu_kernels kernels, bool dense_bf16, bool verbose,
                                          std::string* error);

/// The GPU model as a shard's step_model (actors/gpu_shard.hpp): weights uploaded from `weights`
/// (progress, time and GB/s on stderr when verbose); the shard's KV is in device memory, in pages
/// of `page_tokens` positions, and each step runs gpu_model::forward on it. nullptr and *error
/// when built without CUDA, with no device, or on bad weights.
std::unique_ptr<step_model> make_gpu_step_model(const model_args& args, std::shared_ptr<const tensor_map> weights,
                                                kv_dtype dtype, int page_tokens, gpu_kernels kernels, bool dense_bf16,
                                                bool verbose, std::string* error);

/// The layouts of `size` devices (tpN and depN; tp1 for one) as a runtime's rank source: rank r's
/// weights (its experts, gpu_placement) uploaded to CUDA device r, all ranks at once (progress
/// of rank 0 on stderr when verbose). Null and *error without `size` devices, with the exact
/// kernel set and size > 1, or on failure.
std::shared_ptr<rank_source> make_gpu_layout_source(const model_args& args, std::shared_ptr<const tensor_map> weights,
                                                    kv_dtype dtype, int page_tokens, gpu_kernels kernels,
                                                    bool dense_bf16, int size, bool verbose, std::string* error);

/// Makes CUDA device `device` the calling thread's (nothing without CUDA).
void select_gpu(int device);

/// --gpu-batch-invariant on|off (cedar serve, generate, gpu-bench; process-wide, before the model
/// is built): on, a request's bits on the GPU never depend on what it is batched with; off, the
/// decode path may take faster tiles of another summation order at one or two rows. Without CUDA
/// nothing to set.
void set_gpu_batch_invariant(bool on);

/// The KV budget (pages, rings, tails) of a GPU shard, once the weights are on the device:
/// `fraction` of the device memory free now less `reserve_bytes` (cedar::gpu_step_reserve_bytes), or
/// `budget_bytes` when > 0 (checked against the same). Printed on stderr when verbose. nullopt
/// and *error when the budget does not fit or holds no page and ring slot.
std::optional<int64_t> gpu_kv_budget(const kv_layout& layout, double fraction, int64_t budget_bytes, int max_num_seqs,
                                     int64_t reserve_bytes, bool verbose, std::string* error);

}  // namespace cedar::cli
