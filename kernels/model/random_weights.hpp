// Random checkpoints in the real formats (spec §4.2, §6.2): every inventory tensor filled
// deterministically from a seed. Each row of each tensor draws from its own generator, seeded
// by hash(tensor name, seed, row), so the bytes do not depend on order, chunking or threads.
// Hygiene (spec §6.2): E8M0 weight scales chosen so every linear roughly preserves activation
// RMS (near 127-7 for the real dims), E4M3 codes never NaN, mHC base/scale giving pre ~ 0.3-0.8
// and post ~ 1, norms = 1, sinks ~ 0, small gate bias, residual-writing projections (wo_b,
// expert/shared w2, engram.wkv) at a quarter gain so 40 layers of residual stay in range.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/model_args.hpp"
#include "kernels/checkpoint/safetensors.hpp"
#include "kernels/checkpoint/tensor_map.hpp"
#include "kernels/model/inventory.hpp"

namespace cedar {

/// (bytes done, bytes total); called from worker threads, one call at a time.
using progress_fn = std::function<void(uint64_t done, uint64_t total)>;

/// Writes rows [row_begin, row_end) of `spec` (rows of shape[0]) into dst.
void fill_random_rows(const tensor_spec& spec, uint64_t seed, uint8_t* dst, int64_t row_begin,
                      int64_t row_end);

/// Every inventory tensor of `args` (layer map derived), in memory. num_threads <= 0: all cores.
tensor_map make_random_weights(const model_args& args, uint64_t seed, const progress_fn& progress = {},
                               int num_threads = 0);

/// The same tensors as streaming sources for write_safetensors (nothing is held in memory).
std::vector<tensor_source> random_weight_sources(const model_args& args, uint64_t seed);

/// Writes DIR/config.json and the random weights (sharded when max_shard_bytes > 0), streaming
/// shard by shard. Returns false and sets *error naming the file on failure.
bool write_random_checkpoint(const model_args& args, uint64_t seed, const std::string& dir,
                             uint64_t max_shard_bytes, const progress_fn& progress, std::string* error,
                             int num_threads = 0);

}  // namespace cedar
