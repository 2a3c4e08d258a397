// Parses config.json (top level + text_config) into model_args with simdjson, and loads a
// checkpoint directory, a .json file or a named preset.
#include "config/model_config.hpp"

#include <simdjson.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace cedar {

namespace {

using simdjson::dom::element;

/// Looks each key up in text_config first, then at the top level, and converts it; collects
/// the first error, naming the field where it was found.
struct field_reader {
  element top;
  std::optional<element> text;
  std::string error;

  /// The element for `key` and its display name, or nullopt when absent in both places.
  std::optional<std::pair<element, std::string>> find(const char* key) const {
    element e;
    if (text && text->at_key(key).get(e) == simdjson::SUCCESS)
      return std::pair{e, std::string("text_config.") + key};
    if (top.at_key(key).get(e) == simdjson::SUCCESS) return std::pair{e, std::string(key)};
    return std::nullopt;
  }
  void fail(const std::string& where, const char* what) {
    if (error.empty()) error = where + ": expected " + what;
  }

  void get(element e, const std::string& where, int64_t& out) {
    double d = 0;
    if (e.get_int64().get(out) == simdjson::SUCCESS) return;
    if (e.get_double().get(d) == simdjson::SUCCESS && d == double(int64_t(d))) {
      out = int64_t(d);
      return;
    }
    fail(where, "an integer");
  }
  void get(element e, const std::string& where, int& out) {
    int64_t v = out;
    get(e, where, v);
    if (v < INT32_MIN || v > INT32_MAX) fail(where, "a 32-bit integer");
    out = int(v);
  }
  void get(element e, const std::string& where, double& out) {
    if (e.get_double().get(out) != simdjson::SUCCESS) fail(where, "a number");
  }
  void get(element e, const std::string& where, bool& out) {
    if (e.get_bool().get(out) != simdjson::SUCCESS) fail(where, "true or false");
  }
  void get(element e, const std::string& where, std::string& out) {
    std::string_view s;
    if (e.get_string().get(s) != simdjson::SUCCESS) return fail(where, "a string");
    out = std::string(s);
  }
  template <class T>
  void get(element e, const std::string& where, std::vector<T>& out) {
    simdjson::dom::array arr;
    if (e.get_array().get(arr) != simdjson::SUCCESS) return fail(where, "a list");
    out.clear();
    for (element x : arr) {
      T v{};
      get(x, where, v);
      out.push_back(v);
    }
  }
  template <class T>
  void read(const char* key, T& out) {
    if (auto f = find(key)) get(f->first, f->second, out);
  }
  /// A nested object (rope_scaling, quantization_config): key lookups inside it.
  std::optional<field_reader> object(const char* key) {
    auto f = find(key);
    if (!f) return std::nullopt;
    simdjson::dom::object o;
    if (f->first.get_object().get(o) != simdjson::SUCCESS) {
      fail(f->second, "an object");
      return std::nullopt;
    }
    return field_reader{f->first, std::nullopt, {}};
  }
};

void read_top_level(field_reader& r, model_args& a) {
  if (auto f = r.find("architectures")) {
    std::vector<std::string> archs;
    r.get(f->first, f->second, archs);
    if (!archs.empty()) a.architecture = archs.front();
  }
  if (r.top.at_key("model_type").error() == simdjson::SUCCESS) {
    field_reader top_only{r.top, std::nullopt, {}};
    top_only.read("model_type", a.model_type);
    if (!top_only.error.empty()) r.error = top_only.error;
  }
  if (r.text) {
    field_reader text_only{*r.text, std::nullopt, {}};
    text_only.read("model_type", a.text_model_type);
    if (!text_only.error.empty() && r.error.empty()) r.error = "text_config." + text_only.error;
  }
  r.read("torch_dtype", a.dtype);
  r.read("dtype", a.dtype);
  r.read("bos_token_id", a.bos_token_id);
  r.read("eos_token_id", a.eos_token_id);
  r.read("pad_token_id", a.pad_token_id);
  r.read("image_token_id", a.image_token_id);
  if (auto q = r.object("quantization_config")) {
    q->read("quant_method", a.quant.quant_method);
    q->read("activation_scheme", a.quant.activation_scheme);
    std::vector<int> block;
    q->read("weight_block_size", block);
    if (block.size() == 2) a.quant.weight_block_size[0] = block[0], a.quant.weight_block_size[1] = block[1];
    else if (!block.empty() && q->error.empty()) q->error = "weight_block_size: expected 2 entries";
    q->read("scale_fmt", a.quant.scale_fmt);
    q->read("expert_dtype", a.quant.expert_dtype);
    if (!q->error.empty() && r.error.empty()) r.error = "quantization_config." + q->error;
  }
}

void read_attention_fields(field_reader& r, model_args& a) {
  r.read("vocab_size", a.vocab_size);
  r.read("hidden_size", a.hidden_size);
  r.read("num_hidden_layers", a.num_hidden_layers);
  r.read("num_attention_heads", a.num_attention_heads);
  r.read("num_key_value_heads", a.num_key_value_heads);
  r.read("head_dim", a.head_dim);
  r.read("qk_rope_head_dim", a.qk_rope_head_dim);
  r.read("q_lora_rank", a.q_lora_rank);
  r.read("o_groups", a.o_groups);
  r.read("o_lora_rank", a.o_lora_rank);
  r.read("hidden_act", a.hidden_act);
  r.read("swiglu_limit", a.swiglu_limit);
  r.read("rms_norm_eps", a.rms_norm_eps);
  r.read("attention_bias", a.attention_bias);
  r.read("max_position_embeddings", a.max_position_embeddings);
  r.read("rope_theta", a.rope_theta);
  r.read("compress_rope_theta", a.compress_rope_theta);
  if (auto rs = r.object("rope_scaling")) {
    rs->read("rope_type", a.rope_scaling.type);
    rs->read("type", a.rope_scaling.type);
    rs->read("factor", a.rope_scaling.factor);
    rs->read("beta_fast", a.rope_scaling.beta_fast);
    rs->read("beta_slow", a.rope_scaling.beta_slow);
    rs->read("original_max_position_embeddings", a.rope_scaling.original_max_position_embeddings);
    if (!rs->error.empty() && r.error.empty()) r.error = "rope_scaling." + rs->error;
  }
  r.read("sliding_window", a.sliding_window);
  r.read("compress_ratios", a.compress_ratios);
  r.read("kv_source_layer_ids", a.kv_source_layer_ids);
  r.read("index_source_layer_ids", a.index_source_layer_ids);
  r.read("index_n_heads", a.index_n_heads);
  r.read("index_head_dim", a.index_head_dim);
  r.read("index_topk", a.index_topk);
  r.read("candidate_source_layer_id", a.candidate_source_layer_id);
  r.read("candidate_topk_blocks", a.candidate_topk_blocks);
  r.read("candidate_block_size", a.candidate_block_size);
  r.read("hc_mult", a.hc_mult);
  r.read("hc_sinkhorn_iters", a.hc_sinkhorn_iters);
  r.read("hc_eps", a.hc_eps);
}

void read_moe_engram_fields(field_reader& r, model_args& a) {
  r.read("n_routed_experts", a.n_routed_experts);
  r.read("n_shared_experts", a.n_shared_experts);
  r.read("num_experts_per_tok", a.num_experts_per_tok);
  r.read("moe_intermediate_size", a.moe_intermediate_size);
  r.read("scoring_func", a.scoring_func);
  r.read("topk_method", a.topk_method);
  r.read("norm_topk_prob", a.norm_topk_prob);
  r.read("routed_scaling_factor", a.routed_scaling_factor);
  r.read("engram_layer_ids", a.engram_layer_ids);
  r.read("engram_num_embeddings", a.engram_num_embeddings);
  r.read("engram_max_ngram_size", a.engram_max_ngram_size);
  r.read("engram_n_heads", a.engram_n_heads);
  r.read("engram_head_dim", a.engram_head_dim);
  r.read("engram_vocab_size", a.engram_vocab_size);
  r.read("engram_compressed_vocab_size", a.engram_compressed_vocab_size);
  r.read("engram_pad_token_id", a.engram_pad_token_id);
  r.read("num_nextn_predict_layers", a.num_nextn_predict_layers);
  r.read("dspark_block_size", a.dspark_block_size);
  r.read("dspark_noise_token_id", a.dspark_noise_token_id);
  r.read("dspark_target_layer_ids", a.dspark_target_layer_ids);
  r.read("dspark_markov_rank", a.dspark_markov_rank);
  r.read("dspark_n_routed_experts", a.dspark_n_routed_experts);
  r.read("dspark_num_experts_per_tok", a.dspark_num_experts_per_tok);
}

bool read_file(const std::filesystem::path& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return true;
}

}  // namespace

bool parse_model_config(std::string_view json, model_args& out, std::string* error) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  element doc;
  if (auto err = parser.parse(padded).get(doc)) {
    if (error) *error = std::string("config.json: ") + simdjson::error_message(err);
    return false;
  }
  if (!doc.is_object()) {
    if (error) *error = "config.json: expected a JSON object";
    return false;
  }
  field_reader r{doc, std::nullopt, {}};
  element text;
  if (doc.at_key("text_config").get(text) == simdjson::SUCCESS && text.is_object()) r.text = text;
  model_args a = out;
  const bool has_truncate = r.find("truncate_from_layer").has_value();
  const bool has_engram_rows = r.find("engram_num_embeddings").has_value();
  read_top_level(r, a);
  read_attention_fields(r, a);
  read_moe_engram_fields(r, a);
  r.read("truncate_from_layer", a.truncate_from_layer);
  if (!r.error.empty()) {
    if (error) *error = r.error;
    return false;
  }
  if (!has_truncate) a.truncate_from_layer = a.candidate_source_layer_id + 1;
  if (!has_engram_rows) a.engram_num_embeddings = engram_table_rows_from_primes(a);
  a.derive_layer_map();
  out = std::move(a);
  return true;
}

std::vector<std::string> missing_model_fields(std::string_view json) {
  static constexpr const char* required[] = {
      "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "qk_rope_head_dim",
      "q_lora_rank", "o_groups", "o_lora_rank", "swiglu_limit", "rms_norm_eps", "rope_theta",
      "compress_rope_theta", "rope_scaling", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
      "moe_intermediate_size", "routed_scaling_factor", "sliding_window", "compress_ratios",
      "kv_source_layer_ids", "index_source_layer_ids", "index_n_heads", "index_head_dim", "index_topk",
      "hc_mult", "engram_layer_ids", "quantization_config"};
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  element doc, text;
  if (parser.parse(padded).get(doc) || !doc.is_object()) return {};  // parse_model_config reports it
  field_reader r{doc, std::nullopt, {}};
  if (doc.at_key("text_config").get(text) == simdjson::SUCCESS && text.is_object()) r.text = text;
  std::vector<std::string> missing;
  for (const char* key : required)
    if (!r.find(key)) missing.emplace_back(key);
  return missing;
}

std::optional<model_args> load_model_args(const std::string& dir_or_preset, std::string* error) {
  namespace fs = std::filesystem;
  std::string text, source = dir_or_preset;
  std::error_code ec;
  if (fs::is_directory(dir_or_preset, ec)) {
    source = (fs::path(dir_or_preset) / "config.json").string();
    if (!read_file(source, text)) {
      if (error) *error = source + ": cannot read";
      return std::nullopt;
    }
  } else if (fs::is_regular_file(dir_or_preset, ec)) {
    if (!read_file(dir_or_preset, text)) {
      if (error) *error = dir_or_preset + ": cannot read";
      return std::nullopt;
    }
  } else if (auto preset = preset_json(dir_or_preset)) {
    text = std::move(*preset);
    source = "preset " + dir_or_preset;
  } else {
    std::string names;
    for (const std::string& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    if (error) *error = "'" + dir_or_preset + "' is neither a checkpoint directory, a .json file nor a preset (" + names + ")";
    return std::nullopt;
  }
  if (fs::is_directory(dir_or_preset, ec)) {
    if (const auto missing = missing_model_fields(text); !missing.empty()) {
      if (error) {
        *error = source + ": lacks";
        for (std::size_t i = 0; i < missing.size(); ++i) *error += (i ? ", " : " ") + missing[i];
        *error += " (a checkpoint's config must give every field that shapes its model)";
      }
      return std::nullopt;
    }
  }
  model_args args;
  std::string parse_error;
  if (!parse_model_config(text, args, &parse_error)) {
    if (error) *error = source + ": " + parse_error;
    return std::nullopt;
  }
  const std::vector<std::string> problems = args.validate();
  if (!problems.empty()) {
    if (error) {
      *error = source + ": ";
      for (std::size_t i = 0; i < problems.size(); ++i) *error += (i ? "; " : "") + problems[i];
    }
    return std::nullopt;
  }
  return args;
}

}  // namespace cedar
