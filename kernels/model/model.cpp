// The V4.1-Flash forward pass on the CPU backend (spec §2): the model's constructor binds and
// checks the weights; forward() runs the layer loop below over every row of the batch.
// Sublayers live in attention_layer.cpp, compressor_layer.cpp, indexer_layer.cpp and
// ffn_layer.cpp; the streams' setup, Engram, truncation and head in stream.cpp.
#include "kernels/model/model.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/cpu/op_check.hpp"
#include "kernels/formats.hpp"
#include "kernels/model/forward_pass.hpp"
#include "kernels/model/inventory.hpp"
#include "kernels/model/shard_forward.hpp"

namespace cedar {

using namespace model_detail;

struct model::impl {
  model_args args;
  kv_layout layout;
  model_weights w;
  std::vector<cpu::rope_params> rope;             ///< [layers] the layer type's table
  std::vector<cpu::engram_hash_params> engram;   ///< [layers] (used on Engram layers)

  /// One layer (spec §2.2): lagged mHC, attention, MoE; pre is the previous sublayer's.
  void run_layer(int l, batch_state& b, forward_stats* stats, const shard_view* shard) const;
  void forward(std::span<forward_item> batch, std::vector<float>& logits, forward_stats* stats,
               const shard_view* shard) const;
};

namespace {

float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::isfinite(x) ? std::max(m, std::fabs(x)) : INFINITY;
  return m;
}

/// Fails unless every layer that attends to compressed entries has a cache and a top-k.
void check_layer_map(const model_args& a) {
  for (const layer_info& li : a.layers) {
    if (li.compress_ratio == 0) continue;
    if (li.kv_source < 0 || li.topk_source < 0 || li.kv_source_slot < 0)
      throw std::runtime_error("layer " + std::to_string(li.layer_idx) +
                               " has compress ratio > 0 but no KV source or top-k source");
  }
}

}  // namespace

model::model(model_args args, std::shared_ptr<const tensor_map> weights, kv_dtype kv, int page_tokens)
    : impl_(std::make_unique<impl>()) {
  if (args.layers.size() != std::size_t(args.num_hidden_layers)) args.derive_layer_map();
  if (args.num_hidden_layers > 64) throw std::runtime_error("more than 64 layers");
  check_layer_map(args);
  const std::vector<std::string> problems = check_tensors(args, *weights);
  if (!problems.empty()) throw std::runtime_error("checkpoint does not match its config:" + list_problems(problems));
  impl_->layout = kv_layout::make(args, kv, page_tokens);
  impl_->w = bind_weights(args, std::move(weights));
  impl_->rope = layer_rope_params(args);
  impl_->engram = layer_engram_params(args);
  impl_->args = std::move(args);
}

model::~model() = default;

const model_args& model::args() const { return impl_->args; }
const kv_layout& model::layout() const { return impl_->layout; }

void model::impl::run_layer(int l, batch_state& b, forward_stats* stats, const shard_view* shard) const {
  const int n = b.num_rows, hc = args.hc_mult, D = args.hidden_size;
  const float eps = float(args.rms_norm_eps), hc_eps = float(args.hc_eps);
  const layer_weights& lw = w.layers[l];
  const layer_context c{args, layout, args.layers[l], lw, rope[l], l >= args.truncate_from_layer, shard};
  if (stats) stats->rows_per_layer[l] = n;
  if (args.layers[l].has_engram) apply_engram(args, engram[l], lw.engram, b);

  std::vector<float> a_pre(std::size_t(n) * hc), post(std::size_t(n) * hc),
      comb(std::size_t(n) * hc * hc), x(std::size_t(n) * D), f(std::size_t(n) * D);
  const auto mix = [&](const hc_weights& m, float* pre) {
    cpu::hc_mix(b.X.data(), n, hc, D, m.fn.data(), m.scale.data(), m.base.data(),
                args.hc_sinkhorn_iters, hc_eps, eps, pre, post.data(), comb.data());
  };
  const auto collapse_norm = [&](const float* pre, const std::vector<float>& norm) {
    cpu::hc_collapse(b.X.data(), pre, n, hc, D, x.data());
    cpu::rmsnorm(x.data(), n, D, norm.data(), eps, x.data());
  };

  mix(lw.hc_attn, a_pre.data());
  collapse_norm(b.pre.data(), lw.attn_norm);  // lagged: the previous sublayer's pre
  attention_sublayer(c, b, x.data(), f.data());
  cpu::hc_post(f.data(), b.X.data(), post.data(), comb.data(), n, hc, D, b.X.data());

  mix(lw.hc_ffn, b.pre.data());  // f_pre, consumed by the next layer's attention
  collapse_norm(a_pre.data(), lw.ffn_norm);
  moe_sublayer(c, x.data(), n, f.data());
  cpu::hc_post(f.data(), b.X.data(), post.data(), comb.data(), n, hc, D, b.X.data());
  if (stats) stats->max_abs_residual[l] = max_abs(b.X);
}

void model::impl::forward(std::span<forward_item> batch, std::vector<float>& logits, forward_stats* stats,
                          const shard_view* shard) const {
  batch_state b;
  init_batch(args, w.embed, batch, b);
  const bool every_layer = shard && shard->exchanges_every_layer();
  for (int l = 0; l < args.num_hidden_layers && (b.num_rows > 0 || every_layer); ++l) {
    if (l == args.truncate_from_layer) drop_truncated_rows(b, args.index_topk);
    if (b.num_rows > 0 || !every_layer) {
      run_layer(l, b, stats, shard);
    } else {  // a DEP rank with no rows still serves its experts to its peers
      const layer_context c{args, layout, args.layers[l], w.layers[l], rope[l], true, shard};
      sharded_moe_sublayer(c, nullptr, 0, nullptr);
    }
  }
  head_logits(args, w, b, logits);
  for (forward_item& item : batch) item.kv->num_tokens += int64_t(item.tokens.size());
}

void model::forward(std::span<forward_item> batch, std::vector<float>& logits, forward_stats* stats) const {
  impl_->forward(batch, logits, stats, nullptr);
}

void model::forward(std::span<forward_item> batch, std::vector<float>& logits, const shard_view& shard,
                    forward_stats* stats) const {
  impl_->forward(batch, logits, stats, shard.size > 1 ? &shard : nullptr);
}

}  // namespace cedar
