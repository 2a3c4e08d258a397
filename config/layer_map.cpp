// Derives the per-layer map (mode, KV and top-k sources, Engram, decoder) from the config
// lists, as spec §1 "Layer map" reads them: a layer with ratio r > 0 reads the latest KV
// source of the same ratio at or before it; index sources publish top-k; Reuse layers copy
// the latest index source's top-k.
#include <algorithm>

#include "config/model_args.hpp"

namespace cedar {

namespace {
bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }
}  // namespace

void model_args::derive_layer_map() {
  layers.assign(num_hidden_layers, layer_info{});
  int latest_source_by_ratio[3] = {-1, -1, -1};
  int latest_index_source = -1;
  for (int l = 0; l < num_hidden_layers; ++l) {
    layer_info& li = layers[l];
    li.layer_idx = l;
    li.compress_ratio = l < int(compress_ratios.size()) ? compress_ratios[l] : 0;
    li.is_kv_source = contains(kv_source_layer_ids, l);
    li.is_index_source = contains(index_source_layer_ids, l);
    li.is_candidate_source = l == candidate_source_layer_id;
    li.has_engram = contains(engram_layer_ids, l);
    li.is_decoder = l >= candidate_source_layer_id;
    const int r = li.compress_ratio;
    if (r <= 0 || r > 2) {
      li.mode = layer_mode::swa;
      continue;
    }
    if (li.is_kv_source) {
      latest_source_by_ratio[r] = l;
      // A new source of a ratio starts a new top-k scope.
      latest_index_source = -1;
    }
    li.kv_source = latest_source_by_ratio[r];
    for (std::size_t s = 0; s < kv_source_layer_ids.size(); ++s)
      if (kv_source_layer_ids[s] == li.kv_source) li.kv_source_slot = int(s);
    if (li.is_index_source) latest_index_source = l;
    li.topk_source = latest_index_source;
    li.uses_candidates = li.is_index_source && !li.is_kv_source && li.is_decoder &&
                         candidate_source_layer_id >= 0 && l > candidate_source_layer_id;
    if (li.is_kv_source)
      li.mode = layer_mode::full;
    else if (li.is_index_source)
      li.mode = layer_mode::reindex;
    else
      li.mode = layer_mode::reuse;
  }
}

}  // namespace cedar
