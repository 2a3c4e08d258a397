// The DeepSeek-V4.1-Flash model arguments: every field of a real checkpoint's config.json
// (top level and text_config) in one plain struct, plus the derived layer map.
// Read by config/model_config.cpp; used read-only by kernels/, actors/ and net/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cedar {

/// YaRN rope scaling (applied to layers whose compress ratio is > 0).
struct rope_scaling_args {
  std::string type = "yarn";
  double factor = 16.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position_embeddings = 65536;
};

/// The checkpoint's quantization_config (top level).
struct quant_args {
  std::string quant_method = "fp8";
  std::string activation_scheme = "dynamic";
  int weight_block_size[2] = {32, 32};
  std::string scale_fmt = "ue8m0";
  std::string expert_dtype = "fp4";
};

/// How a layer's attention gets its global KV and top-k (pypto-lib mode names).
enum class layer_mode : uint8_t {
  swa,      ///< window only (ratio 0)
  full,     ///< owns a compressor, index keys and an indexer
  reindex,  ///< runs its own indexer over a borrowed cache (restricted to candidate blocks)
  reuse,    ///< borrows both the cache and the top-k of an earlier layer
};

/// Everything one layer needs to know about its place in the layer map.
struct layer_info {
  int layer_idx = 0;
  int compress_ratio = 0;    ///< 0 = SWA only, 1 or 2
  layer_mode mode = layer_mode::swa;
  int kv_source = -1;        ///< layer whose compressed cache this layer reads (-1: none)
  int topk_source = -1;      ///< layer whose top-k this layer uses (-1: none)
  int kv_source_slot = -1;   ///< index of kv_source in kv_source_layer_ids (-1: none)
  bool is_kv_source = false;
  bool is_index_source = false;
  bool is_candidate_source = false;
  bool uses_candidates = false;  ///< reindex layers after the candidate source
  bool has_engram = false;
  bool is_decoder = false;       ///< layer >= candidate_source_layer_id
};

/// One model-args struct with every config.json field of the spec (§1).
struct model_args {
  // top level
  std::string architecture = "DeepseekV41ForCausalLM";
  std::string model_type = "deepseek_v41";
  std::string text_model_type = "deepseek_v41_text";
  std::string dtype = "bfloat16";
  int bos_token_id = 0;
  int eos_token_id = 1;
  int pad_token_id = 2;
  int image_token_id = 129264;
  quant_args quant;

  // text_config
  int vocab_size = 129280;
  int hidden_size = 5120;
  int num_hidden_layers = 40;
  int num_attention_heads = 64;
  int num_key_value_heads = 1;
  int head_dim = 512;
  int qk_rope_head_dim = 64;
  int q_lora_rank = 1280;
  int o_groups = 8;
  int o_lora_rank = 1024;
  std::string hidden_act = "silu";
  double swiglu_limit = 10.0;
  double rms_norm_eps = 1e-20;
  bool attention_bias = false;
  int64_t max_position_embeddings = 1048576;
  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  rope_scaling_args rope_scaling;
  int n_routed_experts = 384;
  int n_shared_experts = 1;
  int num_experts_per_tok = 6;
  int moe_intermediate_size = 2304;
  std::string scoring_func = "sqrtsoftplus";
  std::string topk_method = "noaux_tc";
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.5;
  int sliding_window = 128;
  std::vector<int> compress_ratios;        ///< num_hidden_layers + num_nextn_predict_layers entries
  std::vector<int> kv_source_layer_ids;    ///< {2, 8, 14, 20}
  std::vector<int> index_source_layer_ids; ///< {2, 8, 14, 20, 24, 28, 32, 36}
  int index_n_heads = 32;
  int index_head_dim = 128;
  int index_topk = 512;
  int candidate_source_layer_id = 20;
  int candidate_topk_blocks = 2048;
  int candidate_block_size = 8;
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  std::vector<int> engram_layer_ids;        ///< {1, 14}
  std::vector<int64_t> engram_num_embeddings;  ///< rows per Engram table, one per Engram layer
  int engram_max_ngram_size = 4;
  int engram_n_heads = 8;
  int engram_head_dim = 256;
  int64_t engram_vocab_size = 16000000;
  int engram_compressed_vocab_size = 99092;
  int engram_pad_token_id = 2;
  /// Token id -> Engram compressed id, built from the tokenizer when a model is loaded for
  /// serving (net/engram_map.hpp); null: token ids hash as they are.
  std::shared_ptr<const std::vector<int32_t>> engram_token_map;
  /// tensor_map::digest of the weights being served (set where they are loaded; empty:
  /// unknown): part of the model's fingerprint, so a shard with other weights is refused.
  std::string weights_digest;
  int num_nextn_predict_layers = 3;
  int dspark_block_size = 5;
  int dspark_noise_token_id = 128799;
  std::vector<int> dspark_target_layer_ids;  ///< {37, 38, 39}
  int dspark_markov_rank = 256;
  int dspark_n_routed_experts = 128;
  int dspark_num_experts_per_tok = 3;

  // cedar's own: the first decoder layer whose prefill may be truncated to the last
  // `sliding_window` rows (21 for the real map: the layer after the candidate source).
  int truncate_from_layer = 21;

  /// The per-layer map derived from the fields above (filled by derive_layer_map()).
  std::vector<layer_info> layers;

  /// Fills `layers` from compress_ratios and the source lists. Call after any field change.
  void derive_layer_map();

  /// Empty if valid, else one message per problem, each naming the field.
  std::vector<std::string> validate() const;

  // Derived sizes.
  int rope_dim() const { return qk_rope_head_dim; }
  int nope_dim() const { return head_dim - qk_rope_head_dim; }
  int hc_dim() const { return hc_mult * hc_mult + 2 * hc_mult; }  ///< 24 mix outputs
  int heads_per_group() const { return num_attention_heads / o_groups; }
  int engram_rows_per_token() const { return (engram_max_ngram_size - 1) * engram_n_heads; }
  /// Tokens before a forward call's first position that the call reads (Engram's n-grams).
  int history_lookback() const { return std::max(0, engram_max_ngram_size - 1); }
};

}  // namespace cedar
