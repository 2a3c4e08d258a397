// Builds the tensor inventory of a model_args and checks a tensor_map against it (see
// inventory.hpp for the names and dtypes).
#include "kernels/model/inventory.hpp"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string_view>

namespace cedar {

namespace {

int64_t ceil32(int64_t n) { return (n + 31) / 32; }

/// Appends tensors for one layer (or the globals) with a common name prefix.
struct inventory_builder {
  std::vector<tensor_spec>& out;
  std::string prefix;
  int layer_idx = -1;

  tensor_spec& add(const std::string& name, st_dtype dtype, std::vector<int64_t> shape,
                   tensor_role role) {
    tensor_spec s;
    s.name = prefix + name;
    s.dtype = dtype;
    s.shape = std::move(shape);
    s.role = role;
    s.layer_idx = layer_idx;
    out.push_back(std::move(s));
    return out.back();
  }
  void norm(const std::string& name, int64_t n) {
    add(name + ".weight", st_dtype::bf16, {n}, tensor_role::norm);
  }
  void bf16_linear(const std::string& name, int64_t rows, int64_t cols) {
    add(name + ".weight", st_dtype::bf16, {rows, cols}, tensor_role::bf16_linear);
  }
  void fp8_linear(const std::string& name, int64_t rows, int64_t cols, bool residual_out = false) {
    add(name + ".weight", st_dtype::f8_e4m3, {rows, cols}, tensor_role::fp8_weight).residual_out =
        residual_out;
    add(name + ".scale", st_dtype::f8_e8m0, {ceil32(rows), ceil32(cols)}, tensor_role::fp8_scale)
        .residual_out = residual_out;
  }
  void fp4_linear(const std::string& name, int64_t rows, int64_t cols, int expert_idx,
                  bool residual_out) {
    tensor_spec& w = add(name + ".weight", st_dtype::i8, {rows, cols / 2}, tensor_role::fp4_weight);
    w.expert_idx = expert_idx;
    w.residual_out = residual_out;
    tensor_spec& s = add(name + ".scale", st_dtype::f8_e8m0, {rows, cols / 32}, tensor_role::fp4_scale);
    s.expert_idx = expert_idx;
    s.residual_out = residual_out;
  }
  void hc(const std::string& which, const model_args& a) {
    add("hc_" + which + "_fn", st_dtype::f32, {a.hc_dim(), int64_t(a.hc_mult) * a.hidden_size},
        tensor_role::hc_fn);
    add("hc_" + which + "_base", st_dtype::f32, {a.hc_dim()}, tensor_role::hc_base);
    add("hc_" + which + "_scale", st_dtype::f32, {3}, tensor_role::hc_scale);
  }
};

void add_attention(inventory_builder& b, const model_args& a, const layer_info& li) {
  const int64_t d = a.hidden_size, dh = a.head_dim, ql = a.q_lora_rank;
  b.add("attn.attn_sink", st_dtype::f32, {a.num_attention_heads}, tensor_role::attn_sink);
  b.fp8_linear("attn.wq_a", ql, d);
  b.norm("attn.q_norm", ql);
  b.fp8_linear("attn.wq_b", int64_t(a.num_attention_heads) * dh, ql);
  b.fp8_linear("attn.wkv", dh, d);
  b.norm("attn.kv_norm", dh);
  b.fp8_linear("attn.wo_a", int64_t(a.o_groups) * a.o_lora_rank, int64_t(a.heads_per_group()) * dh);
  b.fp8_linear("attn.wo_b", d, int64_t(a.o_groups) * a.o_lora_rank, /*residual_out=*/true);
  if (li.is_kv_source) {
    b.bf16_linear("attn.compressor.wkv", dh, d);
    if (li.compress_ratio == 2) b.bf16_linear("attn.compressor.wgate", dh, d);
    b.norm("attn.compressor.norm", dh);
    b.bf16_linear("attn.indexer.wk", a.index_head_dim, dh);
    b.norm("attn.indexer.k_norm", a.index_head_dim);
  }
  if (li.is_index_source) {
    b.fp8_linear("attn.indexer.wq_b", int64_t(a.index_n_heads) * a.index_head_dim, ql);
    b.bf16_linear("attn.indexer.weights_proj", a.index_n_heads, d);
  }
}

void add_moe(inventory_builder& b, const model_args& a) {
  const int64_t d = a.hidden_size, inter = a.moe_intermediate_size;
  const int64_t e = a.n_routed_experts;
  b.bf16_linear("ffn.gate", e, d);
  b.add("ffn.gate.bias", st_dtype::f32, {e}, tensor_role::gate_bias);
  b.add("ffn.gate.bias_vl", st_dtype::f32, {e}, tensor_role::gate_bias);
  if (a.n_shared_experts > 0) {
    const int64_t shared_inter = inter * a.n_shared_experts;
    b.fp8_linear("ffn.shared_experts.w1", shared_inter, d);
    b.fp8_linear("ffn.shared_experts.w2", d, shared_inter, /*residual_out=*/true);
    b.fp8_linear("ffn.shared_experts.w3", shared_inter, d);
  }
  for (int x = 0; x < a.n_routed_experts; ++x) {
    const std::string p = "ffn.experts." + std::to_string(x) + ".";
    b.fp4_linear(p + "w1", inter, d, x, false);
    b.fp4_linear(p + "w2", d, inter, x, true);
    b.fp4_linear(p + "w3", inter, d, x, false);
  }
}

void add_engram(inventory_builder& b, const model_args& a, int64_t rows) {
  const int64_t hd = a.engram_head_dim;
  b.add("engram.embed.weight", st_dtype::f8_e4m3, {rows, hd}, tensor_role::engram_table);
  b.add("engram.embed.scale", st_dtype::f8_e8m0, {rows, hd / 32}, tensor_role::engram_scale);
  b.fp8_linear("engram.wkv", int64_t(a.hc_mult + 1) * a.hidden_size,
               int64_t(a.engram_rows_per_token()) * hd, /*residual_out=*/true);
  b.add("engram.q_weight", st_dtype::f32, {a.hc_mult, a.hidden_size}, tensor_role::engram_qk);
  b.add("engram.k_weight", st_dtype::f32, {a.hc_mult, a.hidden_size}, tensor_role::engram_qk);
}

int64_t engram_rows(const model_args& a, int layer_idx) {
  for (std::size_t i = 0; i < a.engram_layer_ids.size(); ++i)
    if (a.engram_layer_ids[i] == layer_idx && i < a.engram_num_embeddings.size())
      return a.engram_num_embeddings[i];
  return 0;
}

}  // namespace

int64_t tensor_spec::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::size_t tensor_spec::num_bytes() const { return std::size_t(num_elements()) * st_dtype_size(dtype); }

int64_t tensor_spec::num_params() const {
  switch (role) {
    case tensor_role::fp8_scale:
    case tensor_role::fp4_scale:
    case tensor_role::engram_scale: return 0;
    case tensor_role::fp4_weight: return 2 * num_elements();
    default: return num_elements();
  }
}

std::vector<tensor_spec> model_inventory(const model_args& a) {
  std::vector<tensor_spec> out;
  inventory_builder globals{out, "", -1};
  globals.add("embed.weight", st_dtype::bf16, {a.vocab_size, a.hidden_size}, tensor_role::embedding);
  for (const layer_info& li : a.layers) {
    inventory_builder b{out, "layers." + std::to_string(li.layer_idx) + ".", li.layer_idx};
    if (li.has_engram) add_engram(b, a, engram_rows(a, li.layer_idx));
    b.hc("attn", a);
    b.hc("ffn", a);
    b.norm("attn_norm", a.hidden_size);
    b.norm("ffn_norm", a.hidden_size);
    add_attention(b, a, li);
    add_moe(b, a);
  }
  globals.norm("norm", a.hidden_size);
  globals.add("head.weight", st_dtype::bf16, {a.vocab_size, a.hidden_size}, tensor_role::head);
  return out;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<std::string> check_tensors(const model_args& args, const tensor_map& weights) {
  std::vector<std::string> problems;
  // Tensors of a layer the config does not have, or Engram tables of a layer it does not give
  // Engram: a config that drops layers or Engram would otherwise serve a different model.
  std::set<int64_t> layers_beyond, engram_elsewhere;
  for (const auto& [name, t] : weights.tensors) {
    if (!name.starts_with("layers.")) continue;
    const char* digits = name.c_str() + 7;
    char* end = nullptr;
    const long long layer = std::strtoll(digits, &end, 10);
    if (end == digits || *end != '.') continue;
    if (layer >= args.num_hidden_layers) layers_beyond.insert(layer);
    else if (std::string_view(end + 1).starts_with("engram.") &&
             std::find(args.engram_layer_ids.begin(), args.engram_layer_ids.end(), int(layer)) ==
                 args.engram_layer_ids.end())
      engram_elsewhere.insert(layer);
  }
  if (!layers_beyond.empty())
    problems.push_back("layers." + std::to_string(*layers_beyond.begin()) + ".*: " +
                       std::to_string(layers_beyond.size()) + " layer(s) past num_hidden_layers (" +
                       std::to_string(args.num_hidden_layers) + ") are in the checkpoint");
  for (int64_t l : engram_elsewhere)
    problems.push_back("layers." + std::to_string(l) + ".engram.*: Engram tensors of a layer not in engram_layer_ids");
  for (const tensor_spec& s : model_inventory(args)) {
    const tensor_entry* t = weights.find(s.name);
    if (!t) {
      problems.push_back(s.name + ": missing (expected " + st_dtype_name(s.dtype) + " " +
                         shape_string(s.shape) + ")");
      continue;
    }
    if (t->dtype != s.dtype)
      problems.push_back(s.name + ": dtype " + st_dtype_name(t->dtype) + ", expected " +
                         st_dtype_name(s.dtype));
    if (t->shape != s.shape)
      problems.push_back(s.name + ": shape " + shape_string(t->shape) + ", expected " +
                         shape_string(s.shape));
  }
  return problems;
}

std::string list_problems(const std::vector<std::string>& problems, std::size_t shown) {
  std::string out;
  for (std::size_t i = 0; i < std::min(shown, problems.size()); ++i) out += "\n  " + problems[i];
  if (problems.size() > shown) out += "\n  ... and " + std::to_string(problems.size() - shown) + " more";
  return out;
}

}  // namespace cedar
