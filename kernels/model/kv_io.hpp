// Reading and writing one request's KV records (layout in kv_layout.hpp): SWA ring records
// (FP8 per 32), and the global compressed-latent and index-key records of each KV source in
// the request's pages (FP4 or, with kv_dtype::fp8, FP8 per 32). Values are fake-quantized to
// the storage grid before use, so a store followed by a load returns them bit for bit.
#pragma once

#include <cstdint>

#include "kernels/model/kv_layout.hpp"

namespace cedar::model_detail {

/// In place: rounds a latent [layout.latent_dim] to the grid of its global record.
void quantize_latent(const kv_layout& layout, float* v);
/// In place: rounds an index key [layout.index_dim] to the grid of its global record.
void quantize_index_key(const kv_layout& layout, float* v);

/// Ring record of (layer, position): slot position mod window.
void store_ring(const kv_layout& layout, request_kv& kv, int layer, int64_t pos,
                const float* v /*[latent_dim], on the FP8 grid*/);
void load_ring(const kv_layout& layout, const request_kv& kv, int layer, int64_t pos,
               float* v /*[latent_dim]*/);

/// Compressed latent `entry` of KV source `slot` (position entry * ratio).
void store_latent(const kv_layout& layout, request_kv& kv, int slot, int64_t entry,
                  const float* v /*[latent_dim]*/);
void load_latent(const kv_layout& layout, const request_kv& kv, int slot, int64_t entry,
                 float* v /*[latent_dim]*/);

/// Index key `entry` of KV source `slot`.
void store_index_key(const kv_layout& layout, request_kv& kv, int slot, int64_t entry,
                     const float* v /*[index_dim]*/);
void load_index_key(const kv_layout& layout, const request_kv& kv, int slot, int64_t entry,
                    float* v /*[index_dim]*/);

/// Index into request_kv::tails of a ratio-2 source slot.
int tail_index(const kv_layout& layout, int slot);

}  // namespace cedar::model_detail
