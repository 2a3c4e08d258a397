// Where every KV byte of a request lives (spec §3, DESIGN.md §5). Global KV (prefix-cacheable)
// sits in pages of `page_tokens` positions; each page holds, for every KV source, the compressed
// latents and index keys of the entries whose position falls in the page. The SWA window lives
// in one ring per running request; ratio-2 compressors keep a pending (a, g) tail per request.
// The kv_pool actor owns the memory; the forward pass reads and writes it through request_kv.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "config/engine_options.hpp"
#include "config/model_args.hpp"

namespace cedar {

enum class kv_dtype : uint8_t { fp4, fp8 };

struct kv_source_layout {
  int layer_idx = 0;
  int ratio = 1;                  ///< entry j stands for position j*ratio
  int entries_per_page = 0;       ///< page_tokens / ratio
  std::size_t latent_offset = 0;  ///< byte offset of this source's latent records in a page
  std::size_t key_offset = 0;     ///< byte offset of its index-key records in a page
  std::size_t latent_bytes = 0;   ///< one record
  std::size_t key_bytes = 0;      ///< one record
};

struct kv_layout {
  int page_tokens = default_page_tokens;
  kv_dtype dtype = kv_dtype::fp4;
  int latent_dim = 0;
  int index_dim = 0;
  std::vector<kv_source_layout> sources;  ///< one per kv_source_layer_ids entry, same order
  std::size_t page_bytes = 0;

  int num_layers = 0;
  int window = 0;
  std::size_t swa_record_bytes = 0;   ///< FP8 + ue8m0 per 32 of the latent
  int num_ratio2_sources = 0;

  static kv_layout make(const model_args& args, kv_dtype dtype,
                        int page_tokens = default_page_tokens);

  /// Global KV bytes per token (890 for the real config in FP4, 1650 in FP8).
  double bytes_per_token() const { return double(page_bytes) / page_tokens; }
  /// SWA ring bytes of one request: layers x window x record.
  std::size_t ring_bytes() const { return std::size_t(num_layers) * window * swa_record_bytes; }
  /// fp32 values of the compressor tails of one request: ratio-2 sources x 2 x latent_dim.
  std::size_t tail_floats() const { return std::size_t(num_ratio2_sources) * 2 * latent_dim; }
};

/// One request's KV as the forward pass sees it. Memory is owned by the kv_pool.
struct request_kv {
  std::vector<uint8_t*> pages;  ///< page i holds positions [i*page_tokens, (i+1)*page_tokens)
  uint8_t* swa_ring = nullptr;  ///< [num_layers, window, swa_record_bytes]
  float* tails = nullptr;       ///< [num_ratio2_sources, 2, latent_dim]
  int64_t num_tokens = 0;       ///< positions already processed (the next token's position)
};

}  // namespace cedar
