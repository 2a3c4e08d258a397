// model_args::validate(): every check a config must pass before a model is built from it.
// Each message names the field as it appears in config.json ("text_config.X" for text fields).
#include <algorithm>
#include <set>

#include "config/model_args.hpp"

namespace cedar {

namespace {

struct checker {
  std::vector<std::string> problems;

  void add(const std::string& field, const std::string& what) {
    problems.push_back("text_config." + field + ": " + what);
  }
  void positive(const char* field, int64_t v) {
    if (v <= 0) add(field, std::to_string(v) + " must be > 0");
  }
  void multiple_of_32(const char* field, int64_t v) {
    if (v % 32 != 0) add(field, std::to_string(v) + " is not a multiple of 32");
  }
  /// Layer ids: in [0, num_layers), strictly increasing.
  void layer_list(const char* field, const std::vector<int>& ids, int num_layers) {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= num_layers)
        add(field, "layer " + std::to_string(ids[i]) + " is out of range [0, " +
                       std::to_string(num_layers) + ")");
      else if (i > 0 && ids[i] <= ids[i - 1])
        add(field, "ids must be strictly increasing (" + std::to_string(ids[i - 1]) + " then " +
                       std::to_string(ids[i]) + ")");
    }
  }
};

void check_dims(checker& c, const model_args& a) {
  c.positive("vocab_size", a.vocab_size);
  c.positive("hidden_size", a.hidden_size);
  c.positive("num_hidden_layers", a.num_hidden_layers);
  c.positive("num_attention_heads", a.num_attention_heads);
  c.positive("head_dim", a.head_dim);
  c.positive("q_lora_rank", a.q_lora_rank);
  c.positive("o_groups", a.o_groups);
  c.positive("o_lora_rank", a.o_lora_rank);
  c.positive("sliding_window", a.sliding_window);
  c.positive("hc_mult", a.hc_mult);
  c.positive("moe_intermediate_size", a.moe_intermediate_size);
  c.positive("index_n_heads", a.index_n_heads);
  c.positive("index_head_dim", a.index_head_dim);
  c.positive("index_topk", a.index_topk);
  c.positive("candidate_topk_blocks", a.candidate_topk_blocks);
  c.positive("candidate_block_size", a.candidate_block_size);
  for (auto [field, v] : {std::pair{"hidden_size", a.hidden_size}, {"head_dim", a.head_dim},
                          {"q_lora_rank", a.q_lora_rank}, {"o_lora_rank", a.o_lora_rank},
                          {"moe_intermediate_size", a.moe_intermediate_size},
                          {"index_head_dim", a.index_head_dim}, {"engram_head_dim", a.engram_head_dim}})
    c.multiple_of_32(field, v);
  if (a.num_key_value_heads != 1)
    c.add("num_key_value_heads", std::to_string(a.num_key_value_heads) + " must be 1 (one shared latent)");
  if (a.o_groups > 0 && a.num_attention_heads % a.o_groups != 0)
    c.add("num_attention_heads", std::to_string(a.num_attention_heads) +
                                     " is not divisible by o_groups " + std::to_string(a.o_groups));
  if (a.qk_rope_head_dim <= 0 || a.qk_rope_head_dim % 2 != 0 || a.qk_rope_head_dim > a.head_dim)
    c.add("qk_rope_head_dim", std::to_string(a.qk_rope_head_dim) +
                                  " must be even, > 0 and <= head_dim " + std::to_string(a.head_dim));
  if (a.qk_rope_head_dim > a.index_head_dim)
    c.add("qk_rope_head_dim", std::to_string(a.qk_rope_head_dim) + " exceeds index_head_dim " +
                                  std::to_string(a.index_head_dim) + " (index keys are rotated too)");
  if (a.rms_norm_eps < 0) c.add("rms_norm_eps", "must be >= 0");
}

void check_moe(checker& c, const model_args& a) {
  c.positive("n_routed_experts", a.n_routed_experts);
  if (a.num_experts_per_tok <= 0 || a.num_experts_per_tok > a.n_routed_experts)
    c.add("num_experts_per_tok", std::to_string(a.num_experts_per_tok) + " must be in [1, n_routed_experts " +
                                     std::to_string(a.n_routed_experts) + "]");
  if (a.n_shared_experts < 0) c.add("n_shared_experts", "must be >= 0");
  if (a.scoring_func != "sqrtsoftplus") c.add("scoring_func", "'" + a.scoring_func + "' is not supported (sqrtsoftplus)");
  if (a.topk_method != "noaux_tc") c.add("topk_method", "'" + a.topk_method + "' is not supported (noaux_tc)");
  if (a.hidden_act != "silu") c.add("hidden_act", "'" + a.hidden_act + "' is not supported (silu)");
}

void check_layer_lists(checker& c, const model_args& a) {
  const int n = a.num_hidden_layers;
  const std::size_t want = std::size_t(std::max(0, n + a.num_nextn_predict_layers));
  if (a.compress_ratios.size() != want)
    c.add("compress_ratios", "has " + std::to_string(a.compress_ratios.size()) +
                                 " entries, expected num_hidden_layers + num_nextn_predict_layers = " +
                                 std::to_string(want));
  for (std::size_t l = 0; l < a.compress_ratios.size(); ++l)
    if (a.compress_ratios[l] < 0 || a.compress_ratios[l] > 2)
      c.add("compress_ratios", "entry " + std::to_string(l) + " is " + std::to_string(a.compress_ratios[l]) +
                                   "; ratios are 0, 1 or 2");
  c.layer_list("kv_source_layer_ids", a.kv_source_layer_ids, n);
  c.layer_list("index_source_layer_ids", a.index_source_layer_ids, n);
  c.layer_list("engram_layer_ids", a.engram_layer_ids, n);
  auto ratio = [&](int l) { return l >= 0 && l < int(a.compress_ratios.size()) ? a.compress_ratios[l] : 0; };
  for (int l : a.kv_source_layer_ids)
    if (l >= 0 && l < n && ratio(l) <= 0) c.add("kv_source_layer_ids", "layer " + std::to_string(l) + " has compress ratio 0");
  for (int l : a.index_source_layer_ids)
    if (l >= 0 && l < n && ratio(l) <= 0) c.add("index_source_layer_ids", "layer " + std::to_string(l) + " has compress ratio 0");
  for (int l : a.kv_source_layer_ids)
    if (std::find(a.index_source_layer_ids.begin(), a.index_source_layer_ids.end(), l) == a.index_source_layer_ids.end())
      c.add("index_source_layer_ids", "KV source layer " + std::to_string(l) + " is missing (a source runs its indexer)");
  const int cand = a.candidate_source_layer_id;
  if (cand < 0 || cand >= n)
    c.add("candidate_source_layer_id", std::to_string(cand) + " is out of range [0, " + std::to_string(n) + ")");
  else if (std::find(a.kv_source_layer_ids.begin(), a.kv_source_layer_ids.end(), cand) == a.kv_source_layer_ids.end())
    c.add("candidate_source_layer_id", "layer " + std::to_string(cand) + " is not a KV source");
  if (a.truncate_from_layer <= cand || a.truncate_from_layer > n)
    c.add("truncate_from_layer", std::to_string(a.truncate_from_layer) + " must be in (candidate_source_layer_id " +
                                     std::to_string(cand) + ", num_hidden_layers " + std::to_string(n) + "]");
  if (a.engram_num_embeddings.size() != a.engram_layer_ids.size())
    c.add("engram_num_embeddings", "has " + std::to_string(a.engram_num_embeddings.size()) +
                                       " entries, engram_layer_ids has " + std::to_string(a.engram_layer_ids.size()));
  for (int64_t rows : a.engram_num_embeddings)
    if (rows <= 0) c.add("engram_num_embeddings", std::to_string(rows) + " must be > 0");
  if (!a.engram_layer_ids.empty()) {
    if (a.engram_max_ngram_size < 2) c.add("engram_max_ngram_size", "must be >= 2");
    c.positive("engram_n_heads", a.engram_n_heads);
    c.positive("engram_head_dim", a.engram_head_dim);
  }
  if (a.num_nextn_predict_layers > 0) c.layer_list("dspark_target_layer_ids", a.dspark_target_layer_ids, n);
}

/// After derive_layer_map(): every compressed layer must find a cache and a top-k.
void check_layer_map(checker& c, const model_args& a) {
  if (int(a.layers.size()) != a.num_hidden_layers) return;
  for (const layer_info& li : a.layers) {
    if (li.compress_ratio <= 0) continue;
    if (li.kv_source < 0)
      c.add("kv_source_layer_ids", "layer " + std::to_string(li.layer_idx) + " (ratio " +
                                       std::to_string(li.compress_ratio) + ") has no KV source of its ratio at or before it");
    else if (li.topk_source < 0)
      c.add("index_source_layer_ids", "layer " + std::to_string(li.layer_idx) + " has no index source to take its top-k from");
  }
}

void check_top_level(std::vector<std::string>& problems, const model_args& a) {
  const int largest = std::max({a.bos_token_id, a.eos_token_id, a.pad_token_id});
  if (largest >= a.vocab_size)
    problems.push_back("bos/eos/pad_token_id: " + std::to_string(largest) + " is outside the vocabulary (" +
                       std::to_string(a.vocab_size) + ")");
  if (a.quant.weight_block_size[0] != 32 || a.quant.weight_block_size[1] != 32)
    problems.push_back("quantization_config.weight_block_size: only [32, 32] is supported");
  if (a.quant.scale_fmt != "ue8m0")
    problems.push_back("quantization_config.scale_fmt: '" + a.quant.scale_fmt + "' is not supported (ue8m0)");
  if (a.quant.expert_dtype != "fp4")
    problems.push_back("quantization_config.expert_dtype: '" + a.quant.expert_dtype + "' is not supported (fp4)");
  if (a.quant.quant_method != "fp8")
    problems.push_back("quantization_config.quant_method: '" + a.quant.quant_method + "' is not supported (fp8)");
  if (a.rope_scaling.type != "yarn")
    problems.push_back("text_config.rope_scaling.type: '" + a.rope_scaling.type + "' is not supported (yarn)");
  // The forward pass is DeepSeek-V4's: another architecture's config would load as this one.
  if (!a.architecture.starts_with("DeepseekV4"))
    problems.push_back("architectures: '" + a.architecture + "' is not a DeepSeek-V4 model (DeepseekV41ForCausalLM)");
  if (!a.model_type.starts_with("deepseek_v4"))
    problems.push_back("model_type: '" + a.model_type + "' is not a DeepSeek-V4 model (deepseek_v41)");
}

}  // namespace

std::vector<std::string> model_args::validate() const {
  checker c;
  check_dims(c, *this);
  check_moe(c, *this);
  check_layer_lists(c, *this);
  check_layer_map(c, *this);
  check_top_level(c.problems, *this);
  return c.problems;
}

}  // namespace cedar
