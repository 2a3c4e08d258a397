// The model's weights as op-ready views, bound once from a tensor_map by the names of
// kernels/model/inventory.hpp. Large matrices stay views of the map's bytes; wo_a is
// dequantized to bf16 (spec §4.2) and small vectors (norms, hc, sinks, biases) are converted
// to fp32, both owned here. Built by the model's constructor; read-only afterwards.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "config/model_args.hpp"
#include "kernels/checkpoint/tensor_map.hpp"
#include "kernels/ops.hpp"
#include "kernels/weights.hpp"

namespace cedar::model_detail {

/// One mHC mixer (hc_attn_* or hc_ffn_*).
struct hc_weights {
  std::vector<float> fn;     // [hc*hc + 2*hc, hc*dim] fp32
  std::vector<float> base;   // [hc*hc + 2*hc]
  std::vector<float> scale;  // [3]
};

/// Compressor and index-key path of a KV source layer.
struct compressor_weights {
  bf16_weight wkv;              // [head_dim, dim]
  bf16_weight wgate;            // [head_dim, dim] (ratio 2 only; empty for ratio 1)
  std::vector<float> norm;      // [head_dim]
  bf16_weight index_wk;         // [index_head_dim, head_dim]
  std::vector<float> index_k_norm;  // [index_head_dim]
};

/// Query side of an index-source layer's indexer.
struct indexer_weights {
  fp8_weight wq_b;          // [index_heads*index_head_dim, q_lora]
  bf16_weight weights_proj;  // [index_heads, dim]
};

struct attention_weights {
  fp8_weight wq_a, wq_b, wkv, wo_b;
  bf16_weight wo_a;  // [o_groups*o_lora, heads_per_group*head_dim], dequantized at load
  fp8_weight wo_a_fp8;  // wo_a as stored when the checkpoint holds it FP8 (else empty): the same values
  std::vector<float> q_norm, kv_norm, sink;
  compressor_weights compressor;  // bound on KV sources only
  indexer_weights indexer;        // bound on index sources only
};

struct ffn_weights {
  bf16_weight gate;                 // [experts, dim]
  std::vector<float> gate_bias;     // [experts]
  std::vector<cpu::expert_weights> experts;
  cpu::shared_expert_weights shared;
};

struct layer_weights {
  hc_weights hc_attn, hc_ffn;
  std::vector<float> attn_norm, ffn_norm;
  attention_weights attn;
  ffn_weights ffn;
  cpu::engram_weights engram;              // Engram layers only
  std::vector<float> engram_q, engram_k;   // [hc, dim] backing engram.q_weight / k_weight
};

struct model_weights {
  bf16_weight embed;  // [vocab, dim]
  bf16_weight head;   // [vocab, dim]
  std::vector<float> norm;  // [dim]
  std::vector<layer_weights> layers;
  std::vector<std::shared_ptr<void>> owned;  ///< dequantized buffers (wo_a)
  std::shared_ptr<const tensor_map> source;  ///< keeps the viewed bytes alive
};

/// Binds every tensor of `args`' inventory. The map must already pass check_tensors.
model_weights bind_weights(const model_args& args, std::shared_ptr<const tensor_map> map);

/// The per-layer constants both forward passes use: RoPE parameters by layer type (YaRN on
/// the compressed layers), and Engram hash parameters (set on Engram layers only).
std::vector<cpu::rope_params> layer_rope_params(const model_args& a);
/// The model's Engram hash inputs: its config fields and its token map.
cpu::engram_hash_config engram_hash_config_of(const model_args& a);
std::vector<cpu::engram_hash_params> layer_engram_params(const model_args& a);
/// Engram row ids [num_rows, rows per token] of one item's active rows, positions first_pos..:
/// the call's tokens start at position kv_tokens, `history` holds every token before them (only
/// its last max_ngram-1 are read). Both forward passes hash this way.
void engram_item_rows(const cpu::engram_hash_params& hash, std::span<const int32_t> history,
                      std::span<const int32_t> tokens, int64_t kv_tokens, int64_t first_pos, int num_rows,
                      int64_t* rows);

}  // namespace cedar::model_detail
