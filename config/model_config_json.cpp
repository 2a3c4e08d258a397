// model_args -> config.json text in the real layout (top level + text_config), as written by
// `cedar ckpt`. Numbers use the shortest text that reads back to the same value.
#include <charconv>

#include "config/model_config.hpp"

namespace cedar {

namespace {

/// Writes one JSON object's members, one per line, at a fixed indent.
class json_object_writer {
 public:
  json_object_writer(std::string& out, int indent) : out_(out), indent_(indent) { out_ += "{"; }

  void key(const std::string& k) {
    out_ += first_ ? "\n" : ",\n";
    first_ = false;
    out_ += std::string(indent_ + 2, ' ') + "\"" + k + "\": ";
  }
  void field(const std::string& k, int64_t v) { key(k), out_ += std::to_string(v); }
  void field(const std::string& k, int v) { field(k, int64_t(v)); }
  void field(const std::string& k, bool v) { key(k), out_ += v ? "true" : "false"; }
  void field(const std::string& k, const std::string& v) { key(k), out_ += "\"" + v + "\""; }
  void field(const std::string& k, const char* v) { field(k, std::string(v)); }
  void field(const std::string& k, double v) {
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, v);
    key(k), out_.append(buf, res.ptr);
  }
  template <class T>
  void field(const std::string& k, const std::vector<T>& v) {
    key(k);
    out_ += "[";
    for (std::size_t i = 0; i < v.size(); ++i) out_ += (i ? ", " : "") + std::to_string(v[i]);
    out_ += "]";
  }
  void close() { out_ += "\n" + std::string(indent_, ' ') + "}"; }

 private:
  std::string& out_;
  int indent_;
  bool first_ = true;
};

void write_attention(json_object_writer& t, const model_args& a) {
  t.field("model_type", a.text_model_type);
  t.field("vocab_size", a.vocab_size);
  t.field("hidden_size", a.hidden_size);
  t.field("num_hidden_layers", a.num_hidden_layers);
  t.field("num_attention_heads", a.num_attention_heads);
  t.field("num_key_value_heads", a.num_key_value_heads);
  t.field("head_dim", a.head_dim);
  t.field("qk_rope_head_dim", a.qk_rope_head_dim);
  t.field("q_lora_rank", a.q_lora_rank);
  t.field("o_groups", a.o_groups);
  t.field("o_lora_rank", a.o_lora_rank);
  t.field("hidden_act", a.hidden_act);
  t.field("swiglu_limit", a.swiglu_limit);
  t.field("rms_norm_eps", a.rms_norm_eps);
  t.field("attention_bias", a.attention_bias);
  t.field("max_position_embeddings", a.max_position_embeddings);
  t.field("rope_theta", a.rope_theta);
  t.field("compress_rope_theta", a.compress_rope_theta);
}

void write_rope_scaling(std::string& out, json_object_writer& t, const model_args& a) {
  t.key("rope_scaling");
  json_object_writer r(out, 4);
  r.field("type", a.rope_scaling.type);
  r.field("factor", a.rope_scaling.factor);
  r.field("beta_fast", a.rope_scaling.beta_fast);
  r.field("beta_slow", a.rope_scaling.beta_slow);
  r.field("original_max_position_embeddings", a.rope_scaling.original_max_position_embeddings);
  r.close();
}

void write_sparse_attention(json_object_writer& t, const model_args& a) {
  t.field("sliding_window", a.sliding_window);
  t.field("compress_ratios", a.compress_ratios);
  t.field("kv_source_layer_ids", a.kv_source_layer_ids);
  t.field("index_source_layer_ids", a.index_source_layer_ids);
  t.field("index_n_heads", a.index_n_heads);
  t.field("index_head_dim", a.index_head_dim);
  t.field("index_topk", a.index_topk);
  t.field("candidate_source_layer_id", a.candidate_source_layer_id);
  t.field("candidate_topk_blocks", a.candidate_topk_blocks);
  t.field("candidate_block_size", a.candidate_block_size);
  t.field("hc_mult", a.hc_mult);
  t.field("hc_sinkhorn_iters", a.hc_sinkhorn_iters);
  t.field("hc_eps", a.hc_eps);
}

void write_moe_engram(json_object_writer& t, const model_args& a) {
  t.field("n_routed_experts", a.n_routed_experts);
  t.field("n_shared_experts", a.n_shared_experts);
  t.field("num_experts_per_tok", a.num_experts_per_tok);
  t.field("moe_intermediate_size", a.moe_intermediate_size);
  t.field("scoring_func", a.scoring_func);
  t.field("topk_method", a.topk_method);
  t.field("norm_topk_prob", a.norm_topk_prob);
  t.field("routed_scaling_factor", a.routed_scaling_factor);
  t.field("engram_layer_ids", a.engram_layer_ids);
  t.field("engram_num_embeddings", a.engram_num_embeddings);
  t.field("engram_max_ngram_size", a.engram_max_ngram_size);
  t.field("engram_n_heads", a.engram_n_heads);
  t.field("engram_head_dim", a.engram_head_dim);
  t.field("engram_vocab_size", a.engram_vocab_size);
  t.field("engram_compressed_vocab_size", a.engram_compressed_vocab_size);
  t.field("engram_pad_token_id", a.engram_pad_token_id);
  t.field("num_nextn_predict_layers", a.num_nextn_predict_layers);
  t.field("dspark_block_size", a.dspark_block_size);
  t.field("dspark_noise_token_id", a.dspark_noise_token_id);
  t.field("dspark_target_layer_ids", a.dspark_target_layer_ids);
  t.field("dspark_markov_rank", a.dspark_markov_rank);
  t.field("dspark_n_routed_experts", a.dspark_n_routed_experts);
  t.field("dspark_num_experts_per_tok", a.dspark_num_experts_per_tok);
  t.field("truncate_from_layer", a.truncate_from_layer);
}

void write_quant(std::string& out, json_object_writer& top, const model_args& a) {
  top.key("quantization_config");
  json_object_writer q(out, 2);
  q.field("quant_method", a.quant.quant_method);
  q.field("activation_scheme", a.quant.activation_scheme);
  q.field("weight_block_size",
          std::vector<int>{a.quant.weight_block_size[0], a.quant.weight_block_size[1]});
  q.field("scale_fmt", a.quant.scale_fmt);
  q.field("expert_dtype", a.quant.expert_dtype);
  q.close();
}

}  // namespace

std::string model_config_json(const model_args& a) {
  std::string out;
  json_object_writer top(out, 0);
  top.key("architectures");
  out += "[\"" + a.architecture + "\"]";
  top.field("model_type", a.model_type);
  top.field("dtype", a.dtype);
  top.field("bos_token_id", a.bos_token_id);
  top.field("eos_token_id", a.eos_token_id);
  top.field("pad_token_id", a.pad_token_id);
  top.field("image_token_id", a.image_token_id);
  write_quant(out, top, a);
  top.key("text_config");
  json_object_writer t(out, 2);
  write_attention(t, a);
  write_rope_scaling(out, t, a);
  write_sparse_attention(t, a);
  write_moe_engram(t, a);
  t.close();
  top.close();
  out += "\n";
  return out;
}

}  // namespace cedar
