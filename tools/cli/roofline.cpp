// Decode-step bytes and linear-layer FLOPs from the tensor inventory (see roofline.hpp).
#include "tools/cli/roofline.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/model/inventory.hpp"

namespace cedar::cli {

double expected_experts_touched(const model_args& a, int batch) {
  const double e = a.n_routed_experts, k = a.num_experts_per_tok;
  if (batch <= 1) return k;
  return e * (1.0 - std::pow(1.0 - k / e, double(batch)));
}

std::vector<step_bytes_part> decode_step_bytes(const model_args& a, const kv_layout& layout, int64_t context,
                                               int batch) {
  step_bytes_part fp8{"FP8 linears (attention, shared experts, indexer, Engram proj)"};
  step_bytes_part woa{"attn.wo_a (FP8 as stored; the fast decode GEMV reads it)"};
  step_bytes_part experts{"routed experts (FP4, expected distinct per layer)"};
  step_bytes_part head{"head (bf16)"}, bf16{"bf16 linears (compressor, indexer wk/proj, router)"};
  step_bytes_part small{"mHC fp32, norms, sinks, biases"}, gather{"embedding rows, Engram rows"};
  step_bytes_part kv{"KV read (window, top-k records, index keys)"};
  const double expert_share = expected_experts_touched(a, batch) / a.n_routed_experts;
  for (const tensor_spec& t : model_inventory(a)) {
    const double b = double(t.num_bytes());
    if (t.name.find("attn.wo_a.") != std::string::npos) {
      woa.bytes += b;  // codes and scales
    } else if (t.expert_idx >= 0) {
      experts.bytes += b * expert_share;
    } else if (t.role == tensor_role::fp8_weight || t.role == tensor_role::fp8_scale) {
      fp8.bytes += b;
    } else if (t.role == tensor_role::head) {
      head.bytes += b;
    } else if (t.role == tensor_role::bf16_linear) {
      bf16.bytes += b;
    } else if (t.role == tensor_role::embedding) {
      gather.bytes += 2.0 * a.hidden_size * batch;
    } else if (t.role == tensor_role::engram_table || t.role == tensor_role::engram_scale) {
      gather.bytes += b / double(t.shape[0]) * a.engram_rows_per_token() * batch;
    } else {
      small.bytes += b;
    }
  }
  const double latent_bytes = layout.sources.empty() ? 0 : double(layout.sources.front().latent_bytes);
  const double key_bytes = layout.sources.empty() ? 0 : double(layout.sources.front().key_bytes);
  double per_request = 0;
  for (const layer_info& l : a.layers) {
    per_request += double(layout.window) * double(layout.swa_record_bytes);
    if (l.compress_ratio > 0)
      per_request += double(std::min<int64_t>(a.index_topk, context / l.compress_ratio)) * latent_bytes;
  }
  for (int src : a.index_source_layer_ids) {
    const int ratio = a.layers[src].compress_ratio > 0 ? a.layers[src].compress_ratio : 1;
    per_request += double(context / ratio) * key_bytes;
  }
  kv.bytes = per_request * batch;
  return {fp8, woa, experts, head, bf16, small, gather, kv};
}

linear_flops linear_flops_per_row(const model_args& a) {
  linear_flops f;
  f.per_layer_row.assign(std::size_t(a.num_hidden_layers), 0.0);
  const double expert_share = double(a.num_experts_per_tok) / a.n_routed_experts;
  for (const tensor_spec& t : model_inventory(a)) {
    const bool linear = t.role == tensor_role::fp8_weight || t.role == tensor_role::fp4_weight ||
                        t.role == tensor_role::bf16_linear || t.role == tensor_role::hc_fn;
    if (t.role == tensor_role::head) f.head_row += 2.0 * double(t.num_params());
    if (!linear || t.layer_idx < 0 || t.layer_idx >= a.num_hidden_layers) continue;
    f.per_layer_row[std::size_t(t.layer_idx)] += 2.0 * double(t.num_params()) * (t.expert_idx >= 0 ? expert_share : 1.0);
  }
  return f;
}

double linear_flops_of(const linear_flops& f, const std::vector<int64_t>& rows_per_layer, int64_t logits_rows) {
  double flops = f.head_row * double(logits_rows);
  for (std::size_t l = 0; l < std::min(f.per_layer_row.size(), rows_per_layer.size()); ++l)
    flops += f.per_layer_row[l] * double(rows_per_layer[l]);
  return flops;
}

}  // namespace cedar::cli
