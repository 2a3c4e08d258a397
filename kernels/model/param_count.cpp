// Parameter counting over the tensor inventory (see param_count.hpp).
#include "kernels/model/param_count.hpp"

#include <vector>

#include "kernels/model/inventory.hpp"

namespace cedar {

param_counts count_params(const model_args& args) {
  param_counts c;
  std::vector<int64_t> active(args.num_hidden_layers, 0), engram(args.num_hidden_layers, 0);
  for (const tensor_spec& s : model_inventory(args)) {
    const int64_t p = s.num_params();
    c.total += p;
    switch (s.role) {
      case tensor_role::embedding: c.embed += p; continue;
      case tensor_role::head: c.head += p; continue;
      case tensor_role::engram_table:
        c.engram_tables += p;
        engram[s.layer_idx] += int64_t(args.engram_rows_per_token()) * s.shape[1];
        continue;
      case tensor_role::fp4_weight:
        c.routed_experts += p;
        if (s.expert_idx < args.num_experts_per_tok) active[s.layer_idx] += p;  // k experts' worth
        continue;
      default:
        if (s.layer_idx < 0) continue;
        (s.name.find(".engram.") != std::string::npos ? engram : active)[s.layer_idx] += p;
    }
  }
  c.backbone = c.total - c.engram_tables;
  for (int l = 0; l < args.num_hidden_layers; ++l) {
    if (l < args.truncate_from_layer) c.active_per_prompt_token += active[l];
    if (l < args.truncate_from_layer) c.engram_active_per_prompt_token += engram[l];
    c.active_per_generated_token += active[l];
    c.engram_active_per_token += engram[l];
  }
  c.active_per_generated_token += c.head;
  if (args.num_hidden_layers > 0) {
    int64_t sum = 0;
    for (int64_t a : active) sum += a;
    c.active_per_layer_mean = sum / args.num_hidden_layers;
  }
  return c;
}

}  // namespace cedar
