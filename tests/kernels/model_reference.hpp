// A slow reference of the whole forward pass, read straight from the spec (§2): the full
// sequence at once in plain arrays (every position's window KV, every compressed entry and
// index key of each source), with no ring, page, record, tail or chunk anywhere. Candidate sets
// are assembled here with plain loops: window positions max(0, i-W+1)..i, then the top-k
// entries j < floor((i+1)/ratio) of the layer's top-k source. Arithmetic goes through the same
// CPU ops as the model, so the model must match it bit for bit. Test-only.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/formats.hpp"
#include "kernels/model/weights.hpp"
#include "kernels/ops.hpp"

namespace cedar::test {

class reference_model {
 public:
  reference_model(const model_args& a, const model_detail::model_weights& w, bool fp8_kv)
      : a_(a), w_(w), fp8_kv_(fp8_kv) {}

  /// fp32 logits [T, vocab] of every position of `tokens`. With truncate_below >= 0, layers
  /// >= truncate_from_layer let no query see window positions below it (every row is still
  /// computed: rows below it feed nothing the rows above it read there).
  std::vector<float> logits(const std::vector<int32_t>& tokens, int truncate_below = -1) {
    T_ = int(tokens.size());
    truncate_below_ = truncate_below;
    const int hc = a_.hc_mult, D = a_.hidden_size;
    const float eps = float(a_.rms_norm_eps);
    pos_.resize(T_);
    for (int t = 0; t < T_; ++t) pos_[t] = t;
    std::vector<float> e(std::size_t(T_) * D), X(std::size_t(T_) * hc * D), pre(std::size_t(T_) * hc, 0.0f);
    cpu::embed(tokens.data(), T_, w_.embed, e.data());
    for (int t = 0; t < T_; ++t) {
      for (int h = 0; h < hc; ++h) std::copy_n(&e[std::size_t(t) * D], D, &X[(std::size_t(t) * hc + h) * D]);
      pre[std::size_t(t) * hc] = 1.0f;  // layer 0 collapses with copy 0
    }
    latents_.assign(a_.kv_source_layer_ids.size(), {});
    keys_.assign(a_.kv_source_layer_ids.size(), {});
    const auto hash = cpu::engram_default_params(model_detail::engram_hash_config_of(a_));
    std::vector<float> apre(pre.size()), post(pre.size()), comb(std::size_t(T_) * hc * hc),
        x(std::size_t(T_) * D), f(std::size_t(T_) * D);
    for (int l = 0; l < a_.num_hidden_layers; ++l) {
      const auto& lw = w_.layers[l];
      const auto e_it = std::find(a_.engram_layer_ids.begin(), a_.engram_layer_ids.end(), l);
      if (e_it != a_.engram_layer_ids.end()) {
        const int per = a_.engram_rows_per_token();
        std::vector<int64_t> rows(std::size_t(T_) * per);
        cpu::engram_rows(tokens.data(), 0, T_, hash[e_it - a_.engram_layer_ids.begin()], rows.data());
        cpu::engram(X.data(), T_, hc, D, rows.data(), per, lw.engram, eps);
      }
      mix(lw.hc_attn, X, apre, post, comb);
      cpu::hc_collapse(X.data(), pre.data(), T_, hc, D, x.data());
      cpu::rmsnorm(x.data(), T_, D, lw.attn_norm.data(), eps, x.data());
      attention(l, x, f);
      cpu::hc_post(f.data(), X.data(), post.data(), comb.data(), T_, hc, D, X.data());
      mix(lw.hc_ffn, X, pre, post, comb);
      cpu::hc_collapse(X.data(), apre.data(), T_, hc, D, x.data());
      cpu::rmsnorm(x.data(), T_, D, lw.ffn_norm.data(), eps, x.data());
      moe(l, x, f);
      cpu::hc_post(f.data(), X.data(), post.data(), comb.data(), T_, hc, D, X.data());
    }
    cpu::hc_collapse(X.data(), pre.data(), T_, hc, D, x.data());
    cpu::rmsnorm(x.data(), T_, D, w_.norm.data(), eps, x.data());
    std::vector<float> out(std::size_t(T_) * a_.vocab_size);
    cpu::linear_bf16(x.data(), T_, w_.head, out.data());
    return out;
  }

 private:
  void mix(const model_detail::hc_weights& m, const std::vector<float>& X, std::vector<float>& pre,
           std::vector<float>& post, std::vector<float>& comb) {
    cpu::hc_mix(X.data(), T_, a_.hc_mult, a_.hidden_size, m.fn.data(), m.scale.data(), m.base.data(),
                a_.hc_sinkhorn_iters, float(a_.hc_eps), float(a_.rms_norm_eps), pre.data(), post.data(),
                comb.data());
  }

  cpu::rope_params rope(int ratio) const {
    cpu::rope_params p;
    p.rope_dim = a_.qk_rope_head_dim;
    p.theta = ratio > 0 ? a_.compress_rope_theta : a_.rope_theta;
    p.yarn = ratio > 0;
    p.yarn_factor = a_.rope_scaling.factor;
    p.beta_fast = a_.rope_scaling.beta_fast;
    p.beta_slow = a_.rope_scaling.beta_slow;
    p.original_max_pos = a_.rope_scaling.original_max_position_embeddings;
    return p;
  }

  /// Every complete entry of a KV source, from the whole sequence's attention input x.
  void compress(int l, int slot, int ratio, const std::vector<float>& x) {
    const auto& c = w_.layers[l].attn.compressor;
    const int dh = a_.head_dim, dih = a_.index_head_dim, E = T_ / ratio;
    const float eps = float(a_.rms_norm_eps);
    std::vector<float> raw(std::size_t(T_ / ratio + 1) * dh), tail(2 * dh, 0.0f);
    if (ratio == 2)
      cpu::compress_ratio2(x.data(), T_, 0, c.wkv, c.wgate, c.norm.data(), eps, tail.data(), raw.data());
    else
      cpu::compress_ratio1(x.data(), T_, c.wkv, c.norm.data(), eps, raw.data());
    std::vector<int32_t> at(E);
    for (int j = 0; j < E; ++j) at[j] = j * ratio;
    auto& k = keys_[slot];
    k.resize(std::size_t(E) * dih);
    cpu::linear_bf16(raw.data(), E, c.index_wk, k.data());
    cpu::rmsnorm(k.data(), E, dih, c.index_k_norm.data(), eps, k.data());
    cpu::rope(k.data(), E, 1, dih, at.data(), rope(ratio), false);
    auto& lat = latents_[slot];
    lat.assign(raw.begin(), raw.begin() + std::size_t(E) * dh);
    cpu::rope(lat.data(), E, 1, dh, at.data(), rope(ratio), false);
    for (int j = 0; j < E; ++j) {
      if (fp8_kv_) {
        fmt::fake_quant_fp8(&k[std::size_t(j) * dih], dih);
        fmt::fake_quant_fp8(&lat[std::size_t(j) * dh], dh);
      } else {
        fmt::fake_quant_fp4_pow2(&k[std::size_t(j) * dih], dih);
        fmt::fake_quant_fp4_e4m3(&lat[std::size_t(j) * dh], dh);
      }
    }
  }

  /// Replaces topk_ (and, at the candidate source, cand_) from this layer's indexer.
  void index(int l, const layer_info& li, const std::vector<float>& qr, const std::vector<float>& x) {
    const auto& iw = w_.layers[l].attn.indexer;
    const int nih = a_.index_n_heads, dih = a_.index_head_dim, K = a_.index_topk;
    const int E = T_ / li.compress_ratio, block = a_.candidate_block_size;
    std::vector<float> q(std::size_t(T_) * nih * dih), hw(std::size_t(T_) * nih);
    cpu::linear_fp8(qr.data(), T_, iw.wq_b, q.data());
    cpu::rope(q.data(), T_, nih, dih, pos_.data(), rope(li.compress_ratio), false);
    for (int t = 0; t < T_; ++t) fmt::fake_quant_fp4_pow2(&q[std::size_t(t) * nih * dih], nih * dih);
    cpu::linear_bf16(x.data(), T_, iw.weights_proj, hw.data());
    for (float& v : hw) v *= float(1.0 / std::sqrt(double(dih)) / std::sqrt(double(nih)));
    std::vector<int32_t> visible(T_);
    for (int t = 0; t < T_; ++t) visible[t] = (t + 1) / li.compress_ratio;
    std::vector<float> s(std::size_t(T_) * E);
    cpu::index_scores(q.data(), hw.data(), T_, nih, dih, keys_[li.kv_source_slot].data(), E,
                      visible.data(), s.data());
    const int blocks = (E + block - 1) / block;
    if (li.is_candidate_source) {
      cand_.assign(std::size_t(T_) * blocks, 0);
      cpu::candidate_blocks(s.data(), T_, E, block, a_.candidate_topk_blocks, visible.data(), cand_.data());
    }
    if (li.uses_candidates)
      for (int t = 0; t < T_; ++t)
        for (int j = 0; j < E; ++j)
          if (!cand_[std::size_t(t) * blocks + j / block])
            s[std::size_t(t) * E + j] = -std::numeric_limits<float>::infinity();
    topk_.assign(std::size_t(T_) * K, -1);
    cpu::topk_indices(s.data(), T_, E, K, topk_.data());
  }

  void attention(int l, const std::vector<float>& x, std::vector<float>& out) {
    const layer_info& li = a_.layers[l];
    const auto& aw = w_.layers[l].attn;
    const int nh = a_.num_attention_heads, dh = a_.head_dim, W = a_.sliding_window;
    const float eps = float(a_.rms_norm_eps);
    const cpu::rope_params rp = rope(li.compress_ratio);
    std::vector<float> qr(std::size_t(T_) * a_.q_lora_rank), q(std::size_t(T_) * nh * dh),
        kv(std::size_t(T_) * dh), o(std::size_t(T_) * nh * dh);
    cpu::linear_fp8(x.data(), T_, aw.wq_a, qr.data());
    cpu::rmsnorm(qr.data(), T_, a_.q_lora_rank, aw.q_norm.data(), eps, qr.data());
    cpu::linear_fp8(qr.data(), T_, aw.wq_b, q.data());
    cpu::rope(q.data(), T_, nh, dh, pos_.data(), rp, false);
    cpu::linear_fp8(x.data(), T_, aw.wkv, kv.data());
    cpu::rmsnorm(kv.data(), T_, dh, aw.kv_norm.data(), eps, kv.data());
    cpu::rope(kv.data(), T_, 1, dh, pos_.data(), rp, false);
    for (int t = 0; t < T_; ++t) fmt::fake_quant_fp8(&kv[std::size_t(t) * dh], dh);
    if (li.is_kv_source) compress(l, li.kv_source_slot, li.compress_ratio, x);
    if (li.is_index_source) index(l, li, qr, x);

    // Candidates: rows [0, T) of kv are the window positions, rows T + j the entries j.
    const int K = li.compress_ratio > 0 ? a_.index_topk : 0;
    std::vector<float> all(kv);
    if (K > 0) {
      const auto& lat = latents_[li.kv_source_slot];
      all.insert(all.end(), lat.begin(), lat.end());
    }
    std::vector<int32_t> idx(std::size_t(T_) * (W + K), -1);
    for (int i = 0; i < T_; ++i) {
      int32_t* row = &idx[std::size_t(i) * (W + K)];
      const int floor_pos = l >= a_.truncate_from_layer ? std::max(0, truncate_below_) : 0;
      for (int p = std::max(floor_pos, i - W + 1), n = 0; p <= i; ++p) row[n++] = p;
      for (int k = 0; k < K; ++k) {
        const int32_t j = topk_[std::size_t(i) * a_.index_topk + k];
        if (j >= 0) row[W + k] = T_ + j;
      }
    }
    cpu::sparse_attention(q.data(), T_, nh, dh, all.data(), idx.data(), W + K, aw.sink.data(),
                          1.0f / std::sqrt(float(dh)), o.data());
    cpu::rope(o.data(), T_, nh, dh, pos_.data(), rp, true);
    cpu::grouped_output(o.data(), T_, a_.o_groups, aw.wo_a, aw.wo_b, out.data());
  }

  void moe(int l, const std::vector<float>& y, std::vector<float>& out) {
    const auto& fw = w_.layers[l].ffn;
    const int k = a_.num_experts_per_tok;
    std::vector<int32_t> sel(std::size_t(T_) * k);
    std::vector<float> wt(std::size_t(T_) * k);
    cpu::moe_route(y.data(), T_, fw.gate, fw.gate_bias.data(), k, float(a_.routed_scaling_factor),
                   sel.data(), wt.data());
    cpu::moe_ffn(y.data(), T_, a_.hidden_size, sel.data(), wt.data(), k, fw.experts.data(),
                 int(fw.experts.size()), &fw.shared, float(a_.swiglu_limit), out.data());
    for (float& v : out) v = fmt::round_bf16(v);
  }

  const model_args& a_;
  const model_detail::model_weights& w_;
  bool fp8_kv_;
  int T_ = 0;
  int truncate_below_ = -1;
  std::vector<int32_t> pos_;
  std::vector<std::vector<float>> latents_, keys_;  ///< [source slot][entries, dim]
  std::vector<int32_t> topk_;                       ///< [T, index_topk] latest index source
  std::vector<uint8_t> cand_;                       ///< [T, blocks] candidate source's mask
};

}  // namespace cedar::test
