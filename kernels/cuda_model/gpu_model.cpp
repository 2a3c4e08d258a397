// The GPU forward pass (gpu_model.hpp): the layer loop of kernels/model/model.cpp and its
// sublayers (attention_layer.cpp, compressor_layer.cpp, indexer_layer.cpp, ffn_layer.cpp,
// stream.cpp) step for step, each step a CUDA op on device buffers. Host work per call is
// bookkeeping only: positions, record addresses and Engram row ids are computed here and
// uploaded without waiting; the logits (or, with forward_sample, the drawn ids) are the only copy
// back. gpu_decode_graphs.cpp runs decode steps under CUDA graphs, gpu_profile.cpp times phases.
#ifdef CEDAR_HAVE_CUDA

#include "kernels/cuda_model/gpu_model.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/layer_ops.hpp"
#include "kernels/cuda_model/gpu_forward.hpp"
#include "kernels/model/inventory.hpp"
#include "kernels/model/shard_plan.hpp"

namespace cedar {

gpu_model::gpu_model(model_args args, std::shared_ptr<const tensor_map> weights, kv_dtype kv,
                     const upload_progress_fn& progress, gpu_kernels kernels, bool dense_bf16,
                     gpu_placement placement, int page_tokens)
    : impl_(std::make_unique<impl>()) {
  if (!cuda::available()) throw std::runtime_error("gpu_model: " + cuda::status());
  if (placement.size < 1 || placement.rank < 0 || placement.rank >= placement.size)
    throw std::runtime_error("gpu_model: rank " + std::to_string(placement.rank) + " of " +
                             std::to_string(placement.size));
  if (placement.size > 1 && kernels != gpu_kernels::fast)
    throw std::runtime_error("gpu_model: multi-rank layouts run the fast kernel set");
  impl_->device = cuda::current_device();
  impl_->placement = placement;
  cuda::keep_scratch_mapped();
  if (args.layers.size() != std::size_t(args.num_hidden_layers)) args.derive_layer_map();
  if (args.num_hidden_layers > 64) throw std::runtime_error("more than 64 layers");
  const std::vector<std::string> problems = check_tensors(args, *weights);
  if (!problems.empty()) throw std::runtime_error("checkpoint does not match its config:" + list_problems(problems));
  impl_->args = args;
  impl_->layout = kv_layout::make(args, kv, page_tokens);
  impl_->kernels = kernels;
  const char* graphs = std::getenv("CEDAR_GPU_GRAPHS");
  impl_->graphs_enabled = kernels == gpu_kernels::fast && !(graphs && std::string(graphs) == "0");
  const char* layer_graphs = std::getenv("CEDAR_GPU_LAYER_GRAPHS");  // "0": attention halves eager (A/B)
  impl_->layer_graphs_enabled = !(layer_graphs && std::string(layer_graphs) == "0");
  if (const char* from = std::getenv("CEDAR_GPU_GRAPHS_FROM"); from && *from)
    impl_->graph_min_rows = std::max(1, std::atoi(from));  // rows from which calls run under graphs
  if (dense_bf16 && kernels != gpu_kernels::fast) throw std::runtime_error("gpu_model: dense bf16 copies need the fast kernels");
  impl_->dense_bf16 = dense_bf16;
  impl_->progress = &progress;
  {
    const model_detail::model_weights host = model_detail::bind_weights(args, std::move(weights));
    impl_->bind(host);
  }
  impl_->progress = nullptr;
  impl_->rope = model_detail::layer_rope_params(args);
  impl_->engram_hash = model_detail::layer_engram_params(args);
}

gpu_model::~gpu_model() = default;

const model_args& gpu_model::args() const { return impl_->args; }
const kv_layout& gpu_model::layout() const { return impl_->layout; }
gpu_kernels gpu_model::kernels() const { return impl_->kernels; }
uint64_t gpu_model::weight_bytes() const { return impl_->bytes; }
uint64_t gpu_model::host_weight_bytes() const { return impl_->host_bytes; }
int gpu_model::device() const { return impl_->device; }
const gpu_placement& gpu_model::placement() const { return impl_->placement; }

void gpu_model::impl::run_layer(int l, gbatch& b, forward_stats* stats) const {
  const int n = b.num_rows, hc = args.hc_mult, D = args.hidden_size;
  const float eps = float(args.rms_norm_eps), hc_eps = float(args.hc_eps);
  const dev_layer& lw = layers[l];
  if (stats) stats->rows_per_layer[l] = n;
  if (args.layers[l].has_engram) {
    flush_post(b);
    phase_profile::scope t(profile, phase_profile::engram);
    apply_engram(l, b);
  }
  if (kernels == gpu_kernels::fast) {
    run_layer_fast(l, b);
  } else {
    dvec<float> a_pre(std::size_t(n) * hc), post(std::size_t(n) * hc), comb(std::size_t(n) * hc * hc),
        x(std::size_t(n) * D), f(std::size_t(n) * D);
    const auto mix = [&](const dev_hc& m, float* pre) {
      cuda::hc_mix(b.X.get(), n, hc, D, m.fn, m.scale, m.base, args.hc_sinkhorn_iters, hc_eps, eps, pre,
                   post.get(), comb.get());
    };
    const auto collapse_norm = [&](const float* pre, const float* norm_w) {
      cuda::hc_collapse(b.X.get(), pre, n, hc, D, x.get());
      cuda::rmsnorm(x.get(), n, D, norm_w, eps, x.get());
    };
    {
      phase_profile::scope t(profile, phase_profile::mhc);
      mix(lw.hc_attn, a_pre.get());
      collapse_norm(b.pre.get(), lw.attn_norm);
    }
    attention(l, b, x.get(), f.get());
    {
      phase_profile::scope t(profile, phase_profile::mhc);
      cuda::hc_post(f.get(), b.X.get(), post.get(), comb.get(), n, hc, D, b.X.get());
      mix(lw.hc_ffn, b.pre.get());
      collapse_norm(a_pre.get(), lw.ffn_norm);
    }
    moe(l, x.get(), n, f.get());
    phase_profile::scope t(profile, phase_profile::mhc);
    cuda::hc_post(f.get(), b.X.get(), post.get(), comb.get(), n, hc, D, b.X.get());
  }
  if (stats) {
    flush_post(b);
    stats->max_abs_residual[l] = cuda::max_abs(b.X.get(), std::size_t(n) * hc * D);
  }
}

void gpu_model::impl::flush_post(gbatch& b) const {
  if (!b.pending) return;
  phase_profile::scope t(profile, phase_profile::mhc);
  cuda::hc_post(b.pending_f.get(), b.X.get(), b.pending_post.get(), b.pending_comb.get(), b.num_rows, args.hc_mult,
                args.hidden_size, b.X.get());
  b.pending = false;
  b.pending_f = {}, b.pending_post = {}, b.pending_comb = {};
}

// The fast kernel set's layer: each mHC boundary (HCPost of the sublayer before, HCMix,
// HCCollapse, RMSNorm) in one or two launches; with a graph workspace the MoE half is one graph.
// The MoE output's HCPost is left pending for the next layer's first boundary (one launch fewer
// per layer; the same bits).
void gpu_model::impl::run_layer_fast(int l, gbatch& b) const {
  const int n = b.num_rows, hc = args.hc_mult, D = args.hidden_size;
  const float eps = float(args.rms_norm_eps), hc_eps = float(args.hc_eps);
  const dev_layer& lw = layers[l];
  const auto buffer = [&](dvec<float> graph_workspace::*member, std::size_t size) {
    return b.ws ? dvec<float>::borrow((b.ws->*member).get(), size) : dvec<float>(size);
  };
  // a pending MoE output comes with the buffers it was made in (the workspace's, under graphs)
  const bool pending = b.pending;
  dvec<float> a_pre = buffer(&graph_workspace::a_pre, std::size_t(n) * hc),
              post = pending ? std::move(b.pending_post) : buffer(&graph_workspace::post, std::size_t(n) * hc),
              comb = pending ? std::move(b.pending_comb) : buffer(&graph_workspace::comb, std::size_t(n) * hc * hc),
              x = buffer(&graph_workspace::x, std::size_t(n) * D),
              f = pending ? std::move(b.pending_f) : buffer(&graph_workspace::f, std::size_t(n) * D);
  b.pending = false;
  // the sublayer input's FP8 codes, written by the boundary when the first linears read codes
  // (decode: wq_a and wkv; the routed and shared experts)
  const bool codes = D % 32 == 0 && n <= cuda::fast::tuning_now().gemv_max_rows;
  const auto boundary = [&](const float* f_prev, const dev_hc& m, float* pre_out, const float* collapse_pre,
                            const float* norm_w, dvec<uint8_t>& xq, dvec<float>& xs) {
    if (codes) xq = dvec<uint8_t>(std::size_t(n) * D), xs = dvec<float>(std::size_t(n) * (D / 32));
    const cuda::fast::hc_mix_params p{m.fn, m.scale, m.base, args.hc_sinkhorn_iters, hc_eps, eps};
    cuda::fast::hc_boundary(b.X.get(), n, hc, D, f_prev, post.get(), comb.get(), p, pre_out, collapse_pre, norm_w,
                            x.get(), cuda::fast::hc_launches::automatic, xq.get(), xs.get());
  };
  // each half's scratch is freed within it (a graph's allocations must be)
  const auto attention_half = [&] {
    dvec<uint8_t> xq;
    dvec<float> xs;
    {
      phase_profile::scope t(profile, phase_profile::mhc);
      boundary(pending ? f.get() : nullptr, lw.hc_attn, a_pre.get(), b.pre.get(), lw.attn_norm, xq, xs);
    }
    attention(l, b, x.get(), f.get(), xq.get(), xs.get());
  };
  const auto moe_half = [&] {
    dvec<uint8_t> yq;
    dvec<float> ys;
    {
      phase_profile::scope t(profile, phase_profile::mhc);
      boundary(f.get(), lw.hc_ffn, b.pre.get(), a_pre.get(), lw.ffn_norm, yq, ys);
    }
    moe(l, x.get(), n, f.get(), yq.get(), ys.get());
  };
  if (layer_graphed(l, b)) {
    run_graphed({n, -1 - l}, [&] {
      attention_half();
      moe_half();
    }, b.generation);
  } else {
    attention_half();
    if (b.ws) run_graphed({n, l}, moe_half);
    else moe_half();
  }
  b.pending = true;
  b.pending_f = std::move(f), b.pending_post = std::move(post), b.pending_comb = std::move(comb);
}

// Drops, for each item with truncate_below >= 0, its rows below that position (stream.cpp's
// drop_truncated_rows): the kept rows are a suffix of each item, moved down with device copies.
void gpu_model::impl::drop_truncated_rows(gbatch& b, const forward_stats* stats) const {
  const int hc = args.hc_mult, D = args.hidden_size, K = args.index_topk;
  const std::size_t x_row = std::size_t(hc) * D;
  dvec<float> X(std::size_t(std::max(1, b.num_rows)) * x_row), pre(std::size_t(std::max(1, b.num_rows)) * hc);
  std::vector<int32_t> positions;
  int out = 0;
  for (gitem& it : b.items) {
    const int drop = it.truncated_rows();
    const int src = it.row_begin + drop, keep = it.num_rows - drop;
    cuda::copy_device(X.get() + std::size_t(out) * x_row, b.X.get() + std::size_t(src) * x_row,
                      sizeof(float) * keep * x_row);
    cuda::copy_device(pre.get() + std::size_t(out) * hc, b.pre.get() + std::size_t(src) * hc,
                      sizeof(float) * keep * hc);
    positions.insert(positions.end(), b.positions.begin() + src, b.positions.begin() + src + keep);
    if (drop > 0 && it.topk.size() > 0) {
      dvec<int32_t> t(std::size_t(keep) * K);
      cuda::copy_device(t.get(), it.topk.get() + std::size_t(drop) * K, sizeof(int32_t) * keep * K);
      it.topk = std::move(t);
    }
    if (drop > 0 && it.candidates.size() > 0) {
      const std::size_t nb = std::size_t(it.num_candidate_blocks);
      dvec<uint8_t> c(std::size_t(keep) * nb);
      cuda::copy_device(c.get(), it.candidates.get() + drop * nb, keep * nb);
      it.candidates = std::move(c);
    }
    it.row_begin = out;
    it.num_rows = keep;
    it.first_pos += drop;
    out += keep;
  }
  b.num_rows = out;
  b.positions = std::move(positions);
  b.d_positions = dvec<int32_t>(b.positions);
  // the kept rows (the sliding window's, at prefill) run their MoE halves under graphs when
  // their count has a workspace
  b.ws = graphable() ? graph_workspace_for(out, stats) : nullptr;
  if (b.ws == nullptr) {
    b.X = std::move(X);
    b.pre = std::move(pre);
    return;
  }
  b.X = dvec<float>::borrow(b.ws->X.get(), std::size_t(out) * x_row);
  b.pre = dvec<float>::borrow(b.ws->pre.get(), std::size_t(out) * hc);
  cuda::copy_device(b.X.get(), X.get(), sizeof(float) * out * x_row);
  cuda::copy_device(b.pre.get(), pre.get(), sizeof(float) * out * hc);
}

int gpu_model::impl::head_device(const gbatch& b, dvec<float>& out) const {
  const int hc = args.hc_mult, D = args.hidden_size;
  std::vector<int32_t> rows;
  for (const gitem& it : b.items) {
    const logits_mode mode = it.item->logits;
    if (mode == logits_mode::none) continue;
    CEDAR_OP_CHECK(it.num_rows > 0, "logits asked of an item whose rows were all truncated");
    for (int r = mode == logits_mode::last ? it.num_rows - 1 : 0; r < it.num_rows; ++r) rows.push_back(it.row_begin + r);
  }
  const int m = int(rows.size());
  if (m == 0) return 0;
  dvec<float> X(std::size_t(m) * hc * D), pre(std::size_t(m) * hc), h(std::size_t(m) * D);
  out = dvec<float>(std::size_t(m) * args.vocab_size);
  const dvec<int32_t> d_rows(rows);
  cuda::fast::gather_rows(b.X.get(), d_rows.get(), m, hc * D, X.get());
  cuda::fast::gather_rows(b.pre.get(), d_rows.get(), m, hc, pre.get());
  cuda::hc_collapse(X.get(), pre.get(), m, hc, D, h.get());
  cuda::rmsnorm(h.get(), m, D, norm, float(args.rms_norm_eps), h.get());
  linear(h.get(), m, head, out.get());
  return m;
}

int gpu_model::impl::forward_device(std::span<forward_item> batch, forward_stats* stats, dvec<float>& logits) const {
  const int hc = args.hc_mult, D = args.hidden_size;
  gbatch b;
  std::vector<int32_t> tokens;
  for (forward_item& item : batch) {
    CEDAR_OP_CHECK(item.kv != nullptr, "forward_item without KV");
    gitem it;
    it.item = &item;
    it.kv = item.kv;
    it.row_begin = int(b.positions.size());
    it.num_rows = int(item.tokens.size());
    it.first_pos = item.kv->num_tokens;
    it.ring_valid_from = item.replay ? it.first_pos : 0;
    for (int t = 0; t < it.num_rows; ++t) b.positions.push_back(int32_t(it.first_pos + t));
    tokens.insert(tokens.end(), item.tokens.begin(), item.tokens.end());
    b.items.push_back(std::move(it));
  }
  const int n = b.num_rows = int(tokens.size());
  const bool truncates =
      std::any_of(b.items.begin(), b.items.end(), [](const gitem& it) { return it.truncated_rows() > 0; });
  profile.begin_call(std::all_of(batch.begin(), batch.end(), [](const forward_item& i) { return i.tokens.size() == 1; }),
                     n);
  int rows = 0;
  if (n > 0) {
    {
      phase_profile::scope t(profile, phase_profile::embed);
      dvec<int32_t> d_tokens(tokens);
      dvec<float> e(std::size_t(n) * D);
      cuda::embed(d_tokens.get(), n, embed, e.get());
      b.ws = graphable() ? graph_workspace_for(n, stats) : nullptr;
      b.whole_layers = whole_layers_graphable(b);
      upload_positions(b);
      b.X = b.ws ? dvec<float>::borrow(b.ws->X.get(), std::size_t(n) * hc * D) : dvec<float>(std::size_t(n) * hc * D);
      b.pre = b.ws ? dvec<float>::borrow(b.ws->pre.get(), std::size_t(n) * hc) : dvec<float>(std::size_t(n) * hc);
      cuda::hc_expand(e.get(), n, hc, D, b.X.get(), b.pre.get());
    }
  }
  // a DEP rank with no rows, or whose rows all drop at the truncated layers, still serves the
  // other ranks' expert slots in every layer
  const bool exchanges = sharded() && view->exchanges_every_layer();
  for (int l = 0; l < args.num_hidden_layers && (b.num_rows > 0 || exchanges); ++l) {
    if (l == args.truncate_from_layer && truncates) {
      flush_post(b);
      drop_truncated_rows(b, stats);
    }
    if (b.num_rows > 0) run_layer(l, b, stats);
    else if (exchanges) moe_sharded(l, nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr);
    else break;  // a chunk wholly below truncate_below stops here
  }
  if (n > 0) {
    flush_post(b);
    phase_profile::scope t(profile, phase_profile::head);
    rows = head_device(b, logits);
  }
  profile.count_call();
  return rows;
}

namespace {
/// The layout rank of one forward call, checked against the model's placement; the device made
/// current on the calling thread.
class call_scope {
 public:
  call_scope(const gpu_model::impl& m, const shard_view* v) : m_(m) {
    const int size = v ? v->size : 1;
    if (size != m.placement.size || (v && v->rank != m.placement.rank))
      throw std::runtime_error("gpu_model: called as rank " + std::to_string(v ? v->rank : 0) + " of " +
                               std::to_string(size) + ", placed as rank " + std::to_string(m.placement.rank) + " of " +
                               std::to_string(m.placement.size));
    if (size > 1 && v->comm == nullptr) throw std::runtime_error("gpu_model: a multi-rank call needs a communicator");
    cuda::set_device(m.device);
    m.view = size > 1 ? v : nullptr;
  }
  ~call_scope() { m_.view = nullptr; }
  call_scope(const call_scope&) = delete;
  call_scope& operator=(const call_scope&) = delete;

 private:
  const gpu_model::impl& m_;
};
}  // namespace

void gpu_model::forward(std::span<forward_item> batch, std::vector<float>& logits, forward_stats* stats,
                        const shard_view* view) const {
  const impl& m = *impl_;
  const call_scope scope(m, view);
  dvec<float> out;
  const int rows = m.forward_device(batch, stats, out);
  const std::size_t old = logits.size(), n = std::size_t(rows) * m.args.vocab_size;
  logits.resize(old + n);
  if (n > 0) cuda::copy_to_host(logits.data() + old, out.get(), sizeof(float) * n);
  cuda::synchronize();
  for (forward_item& item : batch) item.kv->num_tokens += int64_t(item.tokens.size());
}

void gpu_model::forward_sample(std::span<forward_item> batch, std::span<const cuda::sample_request> requests,
                               std::vector<int32_t>& tokens, std::vector<float>& logprobs, forward_stats* stats,
                               const shard_view* view, std::span<const int> host_rows,
                               std::vector<float>* host_logits) const {
  const impl& m = *impl_;
  const call_scope scope(m, view);
  std::size_t sampled = 0;
  for (const forward_item& item : batch) {
    CEDAR_OP_CHECK(item.logits != logits_mode::all, "forward_sample: logits `all` must use forward");
    sampled += item.logits == logits_mode::last ? 1 : 0;
  }
  CEDAR_OP_CHECK(requests.size() == sampled, "forward_sample: one sample request per item with logits `last`");
  dvec<float> out;
  const int rows = m.forward_device(batch, stats, out);
  const int vocab = m.args.vocab_size;
  const std::size_t old = tokens.size();
  tokens.resize(old + rows);
  logprobs.resize(old + rows);
  if (rows > 0) {
    dvec<int32_t> d_tokens(rows);
    dvec<float> d_logprobs(rows);
    cuda::fast::greedy_rows(out.get(), rows, vocab, d_tokens.get(), d_logprobs.get());
    // the sampled rows together (their serial sums side by side), the greedy ones as they are
    if (std::any_of(requests.begin(), requests.end(),
                    [](const cuda::sample_request& p) { return p.temperature > 0.f; }))
      cuda::sample_rows(out.get(), rows, vocab, requests.data(), d_tokens.get(), d_logprobs.get(), true);
    cuda::copy_to_host(tokens.data() + old, d_tokens.get(), sizeof(int32_t) * rows);
    cuda::copy_to_host(logprobs.data() + old, d_logprobs.get(), sizeof(float) * rows);
    if (host_logits && !host_rows.empty()) {
      host_logits->resize(host_rows.size() * std::size_t(vocab));
      for (std::size_t i = 0; i < host_rows.size(); ++i) {
        CEDAR_OP_CHECK(host_rows[i] >= 0 && host_rows[i] < rows, "forward_sample: a host row past the sampled rows");
        cuda::copy_to_host(host_logits->data() + i * vocab, out.get() + std::size_t(host_rows[i]) * vocab,
                           sizeof(float) * std::size_t(vocab));
      }
    }
  }
  cuda::synchronize();
  for (forward_item& item : batch) item.kv->num_tokens += int64_t(item.tokens.size());
}

void gpu_model::forward_host_kv(std::span<forward_item> batch, std::vector<float>& logits,
                                forward_stats* stats) const {
  const kv_layout& L = impl_->layout;
  const std::size_t ring_b = L.ring_bytes(), tail_b = L.tail_floats() * sizeof(float);
  std::vector<request_kv> host(batch.size()), dev(batch.size());
  std::vector<request_kv*> original(batch.size());
  std::vector<void*> owned;
  const auto alloc = [&](std::size_t bytes) {
    void* p = cuda::device_alloc(std::max<std::size_t>(bytes, 1));
    owned.push_back(p);
    return p;
  };
  for (std::size_t i = 0; i < batch.size(); ++i) {
    CEDAR_OP_CHECK(batch[i].kv != nullptr, "forward_item without KV");
    original[i] = batch[i].kv;
    host[i] = *batch[i].kv;
    dev[i].num_tokens = host[i].num_tokens;
    for (uint8_t* page : host[i].pages) {
      auto* d = static_cast<uint8_t*>(alloc(L.page_bytes));
      cuda::copy_to_device_async(d, page, L.page_bytes);
      dev[i].pages.push_back(d);
    }
    dev[i].swa_ring = static_cast<uint8_t*>(alloc(ring_b));
    dev[i].tails = static_cast<float*>(alloc(tail_b));
    cuda::copy_to_device_async(dev[i].swa_ring, host[i].swa_ring, ring_b);
    cuda::copy_to_device_async(dev[i].tails, host[i].tails, tail_b);
    batch[i].kv = &dev[i];
  }
  forward(batch, logits, stats);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    for (std::size_t p = 0; p < host[i].pages.size(); ++p)
      cuda::copy_to_host(host[i].pages[p], dev[i].pages[p], L.page_bytes);
    cuda::copy_to_host(host[i].swa_ring, dev[i].swa_ring, ring_b);
    cuda::copy_to_host(host[i].tails, dev[i].tails, tail_b);
    original[i]->num_tokens = dev[i].num_tokens;
    batch[i].kv = original[i];
  }
  for (void* p : owned) cuda::device_free(p);
}

}  // namespace cedar

#endif  // CEDAR_HAVE_CUDA
