// Binds the model's weights from a tensor_map (see weights.hpp). Names follow
// kernels/model/inventory.hpp; a missing tensor here is a bug, since the caller has run
// check_tensors first.
#include "kernels/model/weights.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/cpu/op_check.hpp"
#include "kernels/formats.hpp"
#include "kernels/parallel.hpp"

namespace cedar::model_detail {
namespace {

class binder {
 public:
  explicit binder(const tensor_map& map) : map_(map) {}

  const tensor_entry& get(const std::string& name) const {
    const tensor_entry* e = map_.find(name);
    CEDAR_OP_CHECK(e != nullptr, name.c_str());
    return *e;
  }

  /// Any f32 or bf16 tensor as an fp32 vector.
  std::vector<float> floats(const std::string& name) const {
    const tensor_entry& e = get(name);
    std::vector<float> out(e.num_elements());
    if (e.dtype == st_dtype::f32) {
      std::memcpy(out.data(), e.data, out.size() * sizeof(float));
    } else {
      CEDAR_OP_CHECK(e.dtype == st_dtype::bf16, name.c_str());
      for (std::size_t i = 0; i < out.size(); ++i) {
        uint16_t bits;
        std::memcpy(&bits, e.data + 2 * i, 2);
        out[i] = fmt::bf16_to_f32(bits);
      }
    }
    return out;
  }

  bool is_fp8(const std::string& prefix) const { return get(prefix + ".weight").dtype == st_dtype::f8_e4m3; }

  fp8_weight fp8(const std::string& prefix) const {
    const tensor_entry& w = get(prefix + ".weight");
    CEDAR_OP_CHECK(w.dtype == st_dtype::f8_e4m3 && w.shape.size() == 2, prefix.c_str());
    return fp8_weight{int(w.shape[0]), int(w.shape[1]), w.data, get(prefix + ".scale").data};
  }

  fp4_weight fp4(const std::string& prefix) const {
    const tensor_entry& w = get(prefix + ".weight");
    CEDAR_OP_CHECK(w.shape.size() == 2, prefix.c_str());
    return fp4_weight{int(w.shape[0]), int(w.shape[1]) * 2, w.data, get(prefix + ".scale").data};
  }

  bf16_weight bf16(const std::string& prefix) const {
    const tensor_entry& w = get(prefix + ".weight");
    CEDAR_OP_CHECK(w.dtype == st_dtype::bf16 && w.shape.size() == 2, prefix.c_str());
    return bf16_weight{int(w.shape[0]), int(w.shape[1]),
                       reinterpret_cast<const uint16_t*>(w.data)};
  }

  /// A linear stored FP8 (dequantized per 32x32 tile, rounded to bf16) or BF16 (viewed).
  bf16_weight bf16_from_any(const std::string& prefix,
                            std::vector<std::shared_ptr<void>>& owned) const {
    const tensor_entry& w = get(prefix + ".weight");
    if (w.dtype == st_dtype::bf16) return bf16(prefix);
    const fp8_weight q = fp8(prefix);
    const int scale_cols = (q.in + 31) / 32;
    auto buf = std::make_shared<std::vector<uint16_t>>(std::size_t(q.out) * q.in);
    parallel_for(0, q.out, [&](int64_t n) {  // rows on every core: 1.3G values for bench-40L-E64
      for (int k = 0; k < q.in; ++k) {
        const float s = fmt::ue8m0_to_f32(q.scale[(n / 32) * scale_cols + k / 32]);
        const float v = fmt::e4m3_to_f32(q.data[std::size_t(n) * q.in + k]) * s;
        (*buf)[std::size_t(n) * q.in + k] = fmt::f32_to_bf16(v);
      }
    });
    owned.push_back(buf);
    return bf16_weight{q.out, q.in, buf->data()};
  }

 private:
  const tensor_map& map_;
};

void bind_attention(const binder& b, const layer_info& li, const std::string& p,
                    attention_weights& a,
                    std::vector<std::shared_ptr<void>>& owned) {
  a.wq_a = b.fp8(p + "attn.wq_a");
  a.wq_b = b.fp8(p + "attn.wq_b");
  a.wkv = b.fp8(p + "attn.wkv");
  a.wo_b = b.fp8(p + "attn.wo_b");
  a.wo_a = b.bf16_from_any(p + "attn.wo_a", owned);
  if (b.is_fp8(p + "attn.wo_a")) a.wo_a_fp8 = b.fp8(p + "attn.wo_a");
  a.q_norm = b.floats(p + "attn.q_norm.weight");
  a.kv_norm = b.floats(p + "attn.kv_norm.weight");
  a.sink = b.floats(p + "attn.attn_sink");
  if (li.is_kv_source) {
    compressor_weights& c = a.compressor;
    c.wkv = b.bf16(p + "attn.compressor.wkv");
    if (li.compress_ratio == 2) c.wgate = b.bf16(p + "attn.compressor.wgate");
    c.norm = b.floats(p + "attn.compressor.norm.weight");
    c.index_wk = b.bf16(p + "attn.indexer.wk");
    c.index_k_norm = b.floats(p + "attn.indexer.k_norm.weight");
  }
  if (li.is_index_source) {
    a.indexer.wq_b = b.fp8(p + "attn.indexer.wq_b");
    a.indexer.weights_proj = b.bf16(p + "attn.indexer.weights_proj");
  }
}

void bind_ffn(const binder& b, const model_args& args, const std::string& p, ffn_weights& f) {
  f.gate = b.bf16(p + "ffn.gate");
  f.gate_bias = b.floats(p + "ffn.gate.bias");
  f.experts.resize(args.n_routed_experts);
  for (int e = 0; e < args.n_routed_experts; ++e) {
    const std::string q = p + "ffn.experts." + std::to_string(e) + ".";
    f.experts[e] = cpu::expert_weights{b.fp4(q + "w1"), b.fp4(q + "w3"), b.fp4(q + "w2")};
  }
  const std::string s = p + "ffn.shared_experts.";
  f.shared = cpu::shared_expert_weights{b.fp8(s + "w1"), b.fp8(s + "w3"), b.fp8(s + "w2")};
}

void bind_engram(const binder& b, const std::string& p, layer_weights& lw) {
  const tensor_entry& table = b.get(p + "engram.embed.weight");
  lw.engram_q = b.floats(p + "engram.q_weight");
  lw.engram_k = b.floats(p + "engram.k_weight");
  cpu::engram_weights& e = lw.engram;
  e.table = table.data;
  e.table_scale = b.get(p + "engram.embed.scale").data;
  e.num_rows = table.shape[0];
  e.head_dim = int(table.shape[1]);
  e.wkv = b.fp8(p + "engram.wkv");
  e.q_weight = lw.engram_q.data();
  e.k_weight = lw.engram_k.data();
}

}  // namespace

model_weights bind_weights(const model_args& args, std::shared_ptr<const tensor_map> map) {
  model_weights w;
  const binder b(*map);
  w.embed = b.bf16("embed");
  w.head = b.bf16("head");
  w.norm = b.floats("norm.weight");
  w.layers.resize(args.num_hidden_layers);
  for (int l = 0; l < args.num_hidden_layers; ++l) {
    const layer_info& li = args.layers.at(l);
    const std::string p = "layers." + std::to_string(l) + ".";
    layer_weights& lw = w.layers[l];
    for (auto [hc, name] : {std::pair{&lw.hc_attn, "hc_attn_"}, std::pair{&lw.hc_ffn, "hc_ffn_"}}) {
      hc->fn = b.floats(p + name + "fn");
      hc->base = b.floats(p + name + "base");
      hc->scale = b.floats(p + name + "scale");
    }
    lw.attn_norm = b.floats(p + "attn_norm.weight");
    lw.ffn_norm = b.floats(p + "ffn_norm.weight");
    bind_attention(b, li, p, lw.attn, w.owned);
    bind_ffn(b, args, p, lw.ffn);
    if (li.has_engram) bind_engram(b, p, lw);
  }
  w.source = std::move(map);
  return w;
}

std::vector<cpu::rope_params> layer_rope_params(const model_args& a) {
  std::vector<cpu::rope_params> out;
  for (const layer_info& li : a.layers) {
    cpu::rope_params p;
    p.rope_dim = a.qk_rope_head_dim;
    p.theta = li.compress_ratio > 0 ? a.compress_rope_theta : a.rope_theta;
    p.yarn = li.compress_ratio > 0;
    p.yarn_factor = a.rope_scaling.factor;
    p.beta_fast = a.rope_scaling.beta_fast;
    p.beta_slow = a.rope_scaling.beta_slow;
    p.original_max_pos = a.rope_scaling.original_max_position_embeddings;
    out.push_back(p);
  }
  return out;
}

cpu::engram_hash_config engram_hash_config_of(const model_args& a) {
  cpu::engram_hash_config c;
  c.layer_ids = a.engram_layer_ids;
  c.max_ngram = a.engram_max_ngram_size;
  c.heads = a.engram_n_heads;
  c.vocab_size = a.engram_vocab_size;
  c.compressed_vocab = a.engram_compressed_vocab_size;
  c.pad_token = a.engram_pad_token_id;
  c.token_map = a.engram_token_map;
  return c;
}

void engram_item_rows(const cpu::engram_hash_params& hash, std::span<const int32_t> history,
                      std::span<const int32_t> tokens, int64_t kv_tokens, int64_t first_pos, int num_rows,
                      int64_t* rows) {
  const int lookback = hash.max_ngram - 1;
  const std::size_t keep = std::min<std::size_t>(history.size(), std::size_t(lookback));
  CEDAR_OP_CHECK(int64_t(history.size()) >= std::min<int64_t>(first_pos, lookback),
                 "history lacks the Engram look-back");
  std::vector<int32_t> ids(history.end() - keep, history.end());  // the look-back, then the new tokens
  ids.insert(ids.end(), tokens.begin(), tokens.end());
  const int64_t dropped = first_pos - kv_tokens;  // rows truncation dropped before the active ones
  cpu::engram_rows(ids.data(), int64_t(keep) + dropped, num_rows, hash, rows);
}

std::vector<cpu::engram_hash_params> layer_engram_params(const model_args& a) {
  std::vector<cpu::engram_hash_params> out(a.num_hidden_layers);
  const auto params = cpu::engram_default_params(engram_hash_config_of(a));
  for (std::size_t i = 0; i < params.size(); ++i) out[a.engram_layer_ids[i]] = params[i];
  return out;
}

}  // namespace cedar::model_detail
