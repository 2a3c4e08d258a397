// Builds the page / ring / tail layout of a model's KV (see kv_layout.hpp).
#include "kernels/model/kv_layout.hpp"

#include "kernels/formats.hpp"

namespace cedar {

kv_layout kv_layout::make(const model_args& args, kv_dtype dtype, int page_tokens) {
  kv_layout l;
  l.page_tokens = page_tokens;
  l.dtype = dtype;
  l.latent_dim = args.head_dim;
  l.index_dim = args.index_head_dim;
  l.num_layers = args.num_hidden_layers;
  l.window = args.sliding_window;
  l.swa_record_bytes = fmt::fp8_record_bytes(args.head_dim);
  const std::size_t latent_bytes = dtype == kv_dtype::fp4
                                       ? fmt::fp4_e4m3_record_bytes(args.head_dim)
                                       : fmt::fp8_record_bytes(args.head_dim);
  const std::size_t key_bytes = dtype == kv_dtype::fp4
                                    ? fmt::fp4_pow2_record_bytes(args.index_head_dim)
                                    : fmt::fp8_record_bytes(args.index_head_dim);
  std::size_t offset = 0;
  for (int layer : args.kv_source_layer_ids) {
    kv_source_layout s;
    s.layer_idx = layer;
    s.ratio = args.compress_ratios.at(layer);
    s.entries_per_page = page_tokens / s.ratio;
    s.latent_bytes = latent_bytes;
    s.key_bytes = key_bytes;
    s.latent_offset = offset;
    offset += s.entries_per_page * latent_bytes;
    s.key_offset = offset;
    offset += s.entries_per_page * key_bytes;
    if (s.ratio == 2) ++l.num_ratio2_sources;
    l.sources.push_back(s);
  }
  l.page_bytes = offset;
  return l;
}

}  // namespace cedar
