// Record addressing and codecs for one request's KV (see kv_io.hpp). A page holds positions
// [p * page_tokens, (p + 1) * page_tokens); within it, source s keeps entries_per_page latent
// records and as many index-key records at the offsets kv_layout gives.
#include "kernels/model/kv_io.hpp"

#include "kernels/cpu/op_check.hpp"
#include "kernels/formats.hpp"

namespace cedar::model_detail {
namespace {

uint8_t* ring_record(const kv_layout& layout, const request_kv& kv, int layer, int64_t pos) {
  CEDAR_OP_CHECK(kv.swa_ring != nullptr && pos >= 0 && layer < layout.num_layers, "ring");
  const int64_t slot = pos % layout.window;
  return kv.swa_ring + (std::size_t(layer) * layout.window + slot) * layout.swa_record_bytes;
}

/// The record of `entry` of source `slot`: its latent or its index key.
uint8_t* record_of(const kv_layout& layout, const request_kv& kv, int slot, int64_t entry, bool latent) {
  const kv_source_layout& s = layout.sources.at(slot);
  const int64_t page = entry / s.entries_per_page;
  CEDAR_OP_CHECK(entry >= 0 && page < int64_t(kv.pages.size()), "KV page out of range");
  const int64_t in_page = entry - page * s.entries_per_page;
  return kv.pages[page] + (latent ? s.latent_offset + in_page * s.latent_bytes : s.key_offset + in_page * s.key_bytes);
}

void pack(const kv_layout& layout, const float* v, int d, bool latent, uint8_t* rec) {
  if (layout.dtype == kv_dtype::fp8)
    fmt::pack_fp8(v, d, rec);
  else if (latent)
    fmt::pack_fp4_e4m3(v, d, rec);
  else
    fmt::pack_fp4_pow2(v, d, rec);
}

void unpack(const kv_layout& layout, const uint8_t* rec, int d, bool latent, float* v) {
  if (layout.dtype == kv_dtype::fp8)
    fmt::unpack_fp8(rec, d, v);
  else if (latent)
    fmt::unpack_fp4_e4m3(rec, d, v);
  else
    fmt::unpack_fp4_pow2(rec, d, v);
}

}  // namespace

void quantize_latent(const kv_layout& layout, float* v) {
  if (layout.dtype == kv_dtype::fp8)
    fmt::fake_quant_fp8(v, layout.latent_dim);
  else
    fmt::fake_quant_fp4_e4m3(v, layout.latent_dim);
}

void quantize_index_key(const kv_layout& layout, float* v) {
  if (layout.dtype == kv_dtype::fp8)
    fmt::fake_quant_fp8(v, layout.index_dim);
  else
    fmt::fake_quant_fp4_pow2(v, layout.index_dim);
}

void store_ring(const kv_layout& layout, request_kv& kv, int layer, int64_t pos, const float* v) {
  fmt::pack_fp8(v, layout.latent_dim, ring_record(layout, kv, layer, pos));
}

void load_ring(const kv_layout& layout, const request_kv& kv, int layer, int64_t pos, float* v) {
  fmt::unpack_fp8(ring_record(layout, kv, layer, pos), layout.latent_dim, v);
}

void store_latent(const kv_layout& layout, request_kv& kv, int slot, int64_t entry, const float* v) {
  pack(layout, v, layout.latent_dim, true, record_of(layout, kv, slot, entry, true));
}

void load_latent(const kv_layout& layout, const request_kv& kv, int slot, int64_t entry, float* v) {
  unpack(layout, record_of(layout, kv, slot, entry, true), layout.latent_dim, true, v);
}

void store_index_key(const kv_layout& layout, request_kv& kv, int slot, int64_t entry, const float* v) {
  pack(layout, v, layout.index_dim, false, record_of(layout, kv, slot, entry, false));
}

void load_index_key(const kv_layout& layout, const request_kv& kv, int slot, int64_t entry, float* v) {
  unpack(layout, record_of(layout, kv, slot, entry, false), layout.index_dim, false, v);
}

int tail_index(const kv_layout& layout, int slot) {
  int idx = 0;
  for (int s = 0; s < slot; ++s)
    if (layout.sources[s].ratio == 2) ++idx;
  CEDAR_OP_CHECK(layout.sources.at(slot).ratio == 2, "tail of a ratio-1 source");
  return idx;
}

}  // namespace cedar::model_detail
