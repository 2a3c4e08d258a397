// The GPU forward pass (gpu_model.hpp): the layer loop of kernels/model/model.cpp and its
// sublayers (attention_layer.cpp, compressor_layer.cpp, indexer_layer.cpp, ffn_layer.cpp,
// stream.cpp) step for step, each step a CUDA op on device buffers. Host work per call is
// bookkeeping only: positions, record addresses and Engram row ids are computed here and
// uploaded without waiting; the logits are the only copy back.
#ifdef CEDAR_HAVE_CUDA

#include "kernels/cuda_model/gpu_model.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cpu/op_check.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/model/inventory.hpp"
#include "kernels/model/kv_io.hpp"
#include "kernels/model/weights.hpp"

namespace cedar {
namespace {

/// Stream-ordered device array of n T's, freed when it goes out of scope.
template <class T>
class dvec {
 public:
  dvec() = default;
  explicit dvec(std::size_t n) : n_(n), p_(static_cast<T*>(cuda::scratch_alloc(n * sizeof(T)))) {}
  explicit dvec(const std::vector<T>& v) : dvec(v.size()) {
    cuda::copy_to_device_async(p_, v.data(), v.size() * sizeof(T));
  }
  dvec(dvec&& o) noexcept : n_(o.n_), p_(o.p_) { o.p_ = nullptr; o.n_ = 0; }
  dvec& operator=(dvec&& o) noexcept {
    std::swap(n_, o.n_);
    std::swap(p_, o.p_);
    return *this;
  }
  ~dvec() { cuda::scratch_free(p_); }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  std::size_t n_ = 0;
  T* p_ = nullptr;
};

/// Device copies of one layer's weights (views with device pointers; fp32 vectors as arrays).
struct dev_hc {
  const float *fn = nullptr, *base = nullptr, *scale = nullptr;
};
struct dev_layer {
  dev_hc hc_attn, hc_ffn;
  const float *attn_norm = nullptr, *ffn_norm = nullptr;
  fp8_weight wq_a, wq_b, wkv, wo_b;
  bf16_weight wo_a;
  const float *q_norm = nullptr, *kv_norm = nullptr, *sink = nullptr;
  bf16_weight c_wkv, c_wgate, c_index_wk;
  const float *c_norm = nullptr, *c_index_k_norm = nullptr;
  fp8_weight i_wq_b;
  bf16_weight i_weights_proj;
  bf16_weight gate;
  const float* gate_bias = nullptr;
  std::vector<cpu::expert_weights> experts;
  cpu::shared_expert_weights shared;
  cpu::engram_weights engram;
};

cpu::rope_params rope_for(const model_args& a, int ratio) {
  cpu::rope_params p;
  p.rope_dim = a.qk_rope_head_dim;
  p.theta = ratio > 0 ? a.compress_rope_theta : a.rope_theta;
  p.yarn = ratio > 0;
  p.yarn_factor = a.rope_scaling.factor;
  p.beta_fast = a.rope_scaling.beta_fast;
  p.beta_slow = a.rope_scaling.beta_slow;
  p.original_max_pos = a.rope_scaling.original_max_position_embeddings;
  return p;
}

/// One item's active rows and its device top-k / candidate state (as model_detail::item_state).
struct gitem {
  const forward_item* item = nullptr;
  request_kv* kv = nullptr;
  int row_begin = 0, num_rows = 0;
  int64_t first_pos = 0, ring_valid_from = 0;
  dvec<int32_t> topk;        // [num_rows, index_topk]
  dvec<uint8_t> candidates;  // [num_rows, num_candidate_blocks]
  int num_candidate_blocks = 0;
};

struct gbatch {
  int num_rows = 0;
  std::vector<gitem> items;
  std::vector<int32_t> positions;
  dvec<int32_t> d_positions;
  dvec<float> X, pre;  // [n, hc, dim], [n, hc]
};

}  // namespace

struct gpu_model::impl {
  model_args args;
  kv_layout layout;
  std::vector<void*> allocations;
  uint64_t bytes = 0;
  bf16_weight embed, head;
  const float* norm = nullptr;
  std::vector<dev_layer> layers;
  std::vector<cpu::rope_params> rope;
  std::vector<cpu::engram_hash_params> engram_hash;

  ~impl() {
    for (void* p : allocations) cuda::device_free(p);
  }

  // ---- weight upload ----
  uint64_t total = 0, done = 0;
  const upload_progress_fn* progress = nullptr;
  template <class T>
  const T* upload(const T* src, std::size_t n) {
    if (src == nullptr || n == 0) return nullptr;
    void* p = cuda::device_alloc(n * sizeof(T));
    allocations.push_back(p);
    cuda::copy_to_device(p, src, n * sizeof(T));
    bytes += n * sizeof(T);
    done += n * sizeof(T);
    if (progress && *progress) (*progress)(done, total);
    return static_cast<const T*>(p);
  }
  const float* upload(const std::vector<float>& v) { return upload(v.data(), v.size()); }
  fp8_weight upload(const fp8_weight& w) {
    return {w.out, w.in, upload(w.data, std::size_t(w.out) * w.in),
            upload(w.scale, std::size_t((w.out + 31) / 32) * ((w.in + 31) / 32))};
  }
  fp4_weight upload(const fp4_weight& w) {
    return {w.out, w.in, upload(w.data, std::size_t(w.out) * w.in / 2),
            upload(w.scale, std::size_t(w.out) * (w.in / 32))};
  }
  bf16_weight upload(const bf16_weight& w) { return {w.out, w.in, upload(w.data, std::size_t(w.out) * w.in)}; }
  dev_hc upload(const model_detail::hc_weights& h) { return {upload(h.fn), upload(h.base), upload(h.scale)}; }

  void bind(const model_detail::model_weights& w);

  // ---- forward steps ----
  void run_layer(int l, gbatch& b, forward_stats* stats) const;
  void attention(int l, gbatch& b, const float* x, float* out) const;
  void compressor(int l, gitem& it, const float* x) const;
  void indexer(int l, gitem& it, const float* qr, const float* x) const;
  void attend(int l, gitem& it, const float* q, const float* kv, float* o) const;
  void moe(int l, const float* y, int n, float* out) const;
  void apply_engram(int l, gbatch& b) const;
  void head_logits(const gbatch& b, std::vector<float>& logits) const;
  void drop_truncated_rows(gbatch& b) const;

  cuda::record_kind latent_kind() const {
    return layout.dtype == kv_dtype::fp8 ? cuda::record_kind::fp8 : cuda::record_kind::fp4_e4m3;
  }
  cuda::record_kind key_kind() const {
    return layout.dtype == kv_dtype::fp8 ? cuda::record_kind::fp8 : cuda::record_kind::fp4_pow2;
  }
  /// Record addresses of entries [first, first + n) of KV source `slot`: latents or index keys.
  std::vector<uint8_t*> entry_records(const request_kv& kv, int slot, int64_t first, int n, bool latent) const {
    const kv_source_layout& s = layout.sources.at(slot);
    std::vector<uint8_t*> out(n);
    for (int i = 0; i < n; ++i) {
      const int64_t e = first + i, page = e / s.entries_per_page;
      CEDAR_OP_CHECK(e >= 0 && page < int64_t(kv.pages.size()), "KV page out of range");
      const int64_t in_page = e - page * s.entries_per_page;
      out[i] = kv.pages[page] + (latent ? s.latent_offset + in_page * s.latent_bytes
                                        : s.key_offset + in_page * s.key_bytes);
    }
    return out;
  }
  std::vector<uint8_t*> ring_records(const request_kv& kv, int layer, int64_t first, int n) const {
    std::vector<uint8_t*> out(n);
    for (int i = 0; i < n; ++i)
      out[i] = kv.swa_ring + (std::size_t(layer) * layout.window + (first + i) % layout.window) * layout.swa_record_bytes;
    return out;
  }
};

namespace {

uint64_t view_bytes(const fp8_weight& w) {
  return uint64_t(w.out) * w.in + uint64_t((w.out + 31) / 32) * ((w.in + 31) / 32);
}
uint64_t view_bytes(const fp4_weight& w) { return uint64_t(w.out) * w.in / 2 + uint64_t(w.out) * (w.in / 32); }
uint64_t view_bytes(const bf16_weight& w) { return uint64_t(w.out) * w.in * 2; }

}  // namespace

void gpu_model::impl::bind(const model_detail::model_weights& w) {
  // Total first, for the progress callback (the big matrices dominate).
  total = view_bytes(w.embed) + view_bytes(w.head);
  for (const auto& lw : w.layers) {
    const auto& at = lw.attn;
    total += view_bytes(at.wq_a) + view_bytes(at.wq_b) + view_bytes(at.wkv) + view_bytes(at.wo_b) +
             view_bytes(at.wo_a) + view_bytes(lw.ffn.gate);
    for (const auto& e : lw.ffn.experts)
      if (e.w1.data) total += view_bytes(e.w1) + view_bytes(e.w3) + view_bytes(e.w2);
  }
  embed = upload(w.embed);
  head = upload(w.head);
  norm = upload(w.norm);
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const model_detail::layer_weights& lw = w.layers[l];
    const layer_info& li = args.layers[l];
    dev_layer d;
    d.hc_attn = upload(lw.hc_attn);
    d.hc_ffn = upload(lw.hc_ffn);
    d.attn_norm = upload(lw.attn_norm);
    d.ffn_norm = upload(lw.ffn_norm);
    const auto& at = lw.attn;
    d.wq_a = upload(at.wq_a);
    d.wq_b = upload(at.wq_b);
    d.wkv = upload(at.wkv);
    d.wo_b = upload(at.wo_b);
    d.wo_a = upload(at.wo_a);
    d.q_norm = upload(at.q_norm);
    d.kv_norm = upload(at.kv_norm);
    d.sink = upload(at.sink);
    if (li.is_kv_source) {
      d.c_wkv = upload(at.compressor.wkv);
      d.c_wgate = upload(at.compressor.wgate);
      d.c_index_wk = upload(at.compressor.index_wk);
      d.c_norm = upload(at.compressor.norm);
      d.c_index_k_norm = upload(at.compressor.index_k_norm);
    }
    if (li.is_index_source) {
      d.i_wq_b = upload(at.indexer.wq_b);
      d.i_weights_proj = upload(at.indexer.weights_proj);
    }
    d.gate = upload(lw.ffn.gate);
    d.gate_bias = upload(lw.ffn.gate_bias);
    for (const auto& e : lw.ffn.experts) {
      if (e.w1.data == nullptr) d.experts.push_back({});
      else d.experts.push_back({upload(e.w1), upload(e.w3), upload(e.w2)});
    }
    if (args.n_shared_experts > 0)
      d.shared = {upload(lw.ffn.shared.w1), upload(lw.ffn.shared.w3), upload(lw.ffn.shared.w2)};
    if (li.has_engram) {
      const cpu::engram_weights& e = lw.engram;
      d.engram = e;
      d.engram.table = upload(e.table, std::size_t(e.num_rows) * e.head_dim);
      d.engram.table_scale = upload(e.table_scale, std::size_t(e.num_rows) * (e.head_dim / 32));
      d.engram.wkv = upload(e.wkv);
      d.engram.q_weight = upload(lw.engram_q);
      d.engram.k_weight = upload(lw.engram_k);
    }
    layers.push_back(std::move(d));
  }
}

gpu_model::gpu_model(model_args args, std::shared_ptr<const tensor_map> weights, kv_dtype kv,
                     const upload_progress_fn& progress)
    : impl_(std::make_unique<impl>()) {
  if (!cuda::available()) throw std::runtime_error("gpu_model: " + cuda::status());
  if (args.layers.size() != std::size_t(args.num_hidden_layers)) args.derive_layer_map();
  if (args.num_hidden_layers > 64) throw std::runtime_error("more than 64 layers");
  const std::vector<std::string> problems = check_tensors(args, *weights);
  if (!problems.empty()) throw std::runtime_error("checkpoint does not match config: " + problems[0]);
  impl_->args = args;
  impl_->layout = kv_layout::make(args, kv);
  impl_->progress = &progress;
  {
    const model_detail::model_weights host = model_detail::bind_weights(args, std::move(weights));
    impl_->bind(host);
  }
  impl_->progress = nullptr;
  for (const layer_info& li : args.layers) impl_->rope.push_back(rope_for(args, li.compress_ratio));
  impl_->engram_hash.resize(args.num_hidden_layers);
  const auto params = cpu::engram_default_params(args.engram_layer_ids, args.engram_max_ngram_size,
                                                 args.engram_n_heads, args.engram_vocab_size,
                                                 args.engram_pad_token_id);
  for (std::size_t i = 0; i < params.size(); ++i) impl_->engram_hash[args.engram_layer_ids[i]] = params[i];
}

gpu_model::~gpu_model() = default;

const model_args& gpu_model::args() const { return impl_->args; }
const kv_layout& gpu_model::layout() const { return impl_->layout; }
uint64_t gpu_model::weight_bytes() const { return impl_->bytes; }

// ---- compressor (compressor_layer.cpp) -----------------------------------------------------------

void gpu_model::impl::compressor(int l, gitem& it, const float* x) const {
  const layer_info& li = args.layers[l];
  const dev_layer& w = layers[l];
  const int ratio = li.compress_ratio, dh = args.head_dim, dih = args.index_head_dim, T = it.num_rows;
  const float eps = float(args.rms_norm_eps);
  const int64_t p0 = it.first_pos;
  CEDAR_OP_CHECK(ratio == 1 || ratio == 2, "compressor ratio");
  dvec<float> latents(std::size_t(T / ratio + 1) * dh);
  int num = 0;
  int64_t first_entry = 0;
  if (ratio == 2) {
    float* tail = it.kv->tails + std::size_t(model_detail::tail_index(layout, li.kv_source_slot)) * 2 * dh;
    num = cuda::compress_ratio2(x, T, p0, w.c_wkv, w.c_wgate, w.c_norm, eps, tail, latents.get());
    first_entry = p0 / 2;
  } else {
    cuda::compress_ratio1(x, T, w.c_wkv, w.c_norm, eps, latents.get());
    num = T;
    first_entry = p0;
  }
  if (it.item->replay || num == 0) return;
  std::vector<int32_t> entry_pos(num);
  for (int e = 0; e < num; ++e) entry_pos[e] = int32_t((first_entry + e) * ratio);
  dvec<int32_t> d_pos(entry_pos);
  // index keys from the raw latents
  dvec<float> k(std::size_t(num) * dih);
  cuda::linear_bf16(latents.get(), num, w.c_index_wk, k.get());
  cuda::rmsnorm(k.get(), num, dih, w.c_index_k_norm, eps, k.get());
  cuda::rope(k.get(), num, 1, dih, d_pos.get(), rope[l], false);
  if (layout.dtype == kv_dtype::fp8) cuda::fake_quant_fp8_rows(k.get(), num, dih);
  else cuda::fake_quant_fp4_pow2_rows(k.get(), num, dih);
  dvec<uint8_t*> key_dst(entry_records(*it.kv, li.kv_source_slot, first_entry, num, false));
  cuda::store_records(key_kind(), k.get(), num, dih, key_dst.get());
  // latents, rotated at their entry positions
  cuda::rope(latents.get(), num, 1, dh, d_pos.get(), rope[l], false);
  if (layout.dtype == kv_dtype::fp8) cuda::fake_quant_fp8_rows(latents.get(), num, dh);
  else cuda::fake_quant_fp4_e4m3_rows(latents.get(), num, dh);
  dvec<uint8_t*> lat_dst(entry_records(*it.kv, li.kv_source_slot, first_entry, num, true));
  cuda::store_records(latent_kind(), latents.get(), num, dh, lat_dst.get());
}

// ---- indexer (indexer_layer.cpp) ------------------------------------------------------------

void gpu_model::impl::indexer(int l, gitem& it, const float* qr, const float* x) const {
  const layer_info& li = args.layers[l];
  const dev_layer& w = layers[l];
  const int T = it.num_rows, ratio = li.compress_ratio, K = args.index_topk;
  const int nih = args.index_n_heads, dih = args.index_head_dim;
  const int n = int((it.first_pos + T) / ratio);
  it.topk = dvec<int32_t>(std::size_t(T) * K);
  cuda::fill_bytes(it.topk.get(), 0xFF, it.topk.size() * sizeof(int32_t));  // -1
  if (li.is_candidate_source) {
    it.num_candidate_blocks = (n + args.candidate_block_size - 1) / args.candidate_block_size;
    it.candidates = dvec<uint8_t>(std::size_t(T) * it.num_candidate_blocks);
    cuda::fill_bytes(it.candidates.get(), 0, it.candidates.size());
  }
  if (n == 0) return;
  dvec<float> keys(std::size_t(n) * dih);
  {
    const auto src = entry_records(*it.kv, li.kv_source_slot, 0, n, false);
    dvec<uint8_t*> d_src(src);
    cuda::load_records(key_kind(), d_src.get(), n, dih, keys.get());
  }
  dvec<float> q(std::size_t(T) * nih * dih), hw(std::size_t(T) * nih);
  cuda::linear_fp8(qr, T, w.i_wq_b, q.get());
  std::vector<int32_t> pos(T), visible(T);
  for (int t = 0; t < T; ++t) {
    pos[t] = int32_t(it.first_pos + t);
    visible[t] = int32_t((it.first_pos + t + 1) / ratio);
  }
  dvec<int32_t> d_pos(pos), d_vis(visible);
  cuda::rope(q.get(), T, nih, dih, d_pos.get(), rope[l], false);
  cuda::fake_quant_fp4_pow2_rows(q.get(), T, nih * dih);
  cuda::linear_bf16(x, T, w.i_weights_proj, hw.get());
  cuda::scale_values(hw.get(), hw.size(), float(1.0 / std::sqrt(double(dih)) / std::sqrt(double(nih))));

  constexpr std::size_t max_score_bytes = std::size_t(128) << 20;
  const int rows_per_chunk = int(std::max<std::size_t>(1, max_score_bytes / (sizeof(float) * std::size_t(n))));
  dvec<float> scores(std::size_t(std::min(rows_per_chunk, T)) * n);
  for (int r0 = 0; r0 < T; r0 += rows_per_chunk) {
    const int m = std::min(rows_per_chunk, T - r0);
    cuda::index_scores(q.get() + std::size_t(r0) * nih * dih, hw.get() + std::size_t(r0) * nih, m, nih, dih,
                       keys.get(), n, d_vis.get() + r0, scores.get());
    if (li.is_candidate_source)
      cuda::candidate_blocks(scores.get(), m, n, args.candidate_block_size, args.candidate_topk_blocks,
                             d_vis.get() + r0, it.candidates.get() + std::size_t(r0) * it.num_candidate_blocks);
    if (li.uses_candidates) {
      CEDAR_OP_CHECK(it.num_candidate_blocks == (n + args.candidate_block_size - 1) / args.candidate_block_size,
                     "candidate mask size");
      cuda::mask_scores(scores.get(), m, n, args.candidate_block_size,
                        it.candidates.get() + std::size_t(r0) * it.num_candidate_blocks, it.num_candidate_blocks);
    }
    cuda::topk_indices(scores.get(), m, n, K, it.topk.get() + std::size_t(r0) * K);
  }
}

// ---- attention (attention_layer.cpp) ------------------------------------------------------------

void gpu_model::impl::attend(int l, gitem& it, const float* q, const float* kv, float* o) const {
  const layer_info& li = args.layers[l];
  const int T = it.num_rows, dh = args.head_dim, W = args.sliding_window, nh = args.num_attention_heads;
  const int64_t p0 = it.first_pos;
  int64_t floor_pos = it.ring_valid_from;  // window_floor of the CPU model
  if (l >= args.truncate_from_layer && it.item->truncate_below >= 0)
    floor_pos = std::max(floor_pos, it.item->truncate_below);
  const int64_t ring_lo = std::max(floor_pos, p0 - (W - 1));
  const int ring_n = int(std::max<int64_t>(0, p0 - ring_lo));
  const int K = li.compress_ratio > 0 ? args.index_topk : 0;
  // every visible entry of the KV source (the CPU unpacks only the referenced ones; the
  // candidate order, and so the result, is the same)
  const int n_entries = K > 0 ? int((p0 + T) / li.compress_ratio) : 0;
  const int num_window = ring_n + T;
  dvec<float> buf(std::size_t(num_window + n_entries) * dh);
  if (ring_n > 0) {
    dvec<uint8_t*> src(ring_records(*it.kv, li.layer_idx, ring_lo, ring_n));
    cuda::load_records(cuda::record_kind::fp8, src.get(), ring_n, dh, buf.get());
  }
  cuda::copy_device(buf.get() + std::size_t(ring_n) * dh, kv, sizeof(float) * std::size_t(T) * dh);
  if (n_entries > 0) {
    dvec<uint8_t*> src(entry_records(*it.kv, li.kv_source_slot, 0, n_entries, true));
    cuda::load_records(latent_kind(), src.get(), n_entries, dh, buf.get() + std::size_t(num_window) * dh);
  }
  const int num_idx = W + K;
  dvec<int32_t> idx(std::size_t(T) * num_idx);
  cuda::attention_candidates(K > 0 ? it.topk.get() : nullptr, T, K, W, p0, floor_pos, ring_lo, num_window,
                             idx.get());
  const float scale = 1.0f / std::sqrt(float(dh));
  cuda::sparse_attention(q, T, nh, dh, buf.get(), idx.get(), num_idx, layers[l].sink, scale, o);
}

void gpu_model::impl::attention(int l, gbatch& b, const float* x, float* out) const {
  const model_args& a = args;
  const layer_info& li = a.layers[l];
  const dev_layer& w = layers[l];
  const int n = b.num_rows, D = a.hidden_size, dh = a.head_dim, nh = a.num_attention_heads;
  const float eps = float(a.rms_norm_eps);
  const int32_t* pos = b.d_positions.get();

  dvec<float> qr(std::size_t(n) * a.q_lora_rank);
  cuda::linear_fp8(x, n, w.wq_a, qr.get());
  cuda::rmsnorm(qr.get(), n, a.q_lora_rank, w.q_norm, eps, qr.get());
  dvec<float> q(std::size_t(n) * nh * dh);
  cuda::linear_fp8(qr.get(), n, w.wq_b, q.get());
  cuda::rope(q.get(), n, nh, dh, pos, rope[l], false);

  dvec<float> kv(std::size_t(n) * dh);
  cuda::linear_fp8(x, n, w.wkv, kv.get());
  cuda::rmsnorm(kv.get(), n, dh, w.kv_norm, eps, kv.get());
  cuda::rope(kv.get(), n, 1, dh, pos, rope[l], false);
  cuda::fake_quant_fp8_rows(kv.get(), n, dh);

  dvec<float> o(std::size_t(n) * nh * dh);
  for (gitem& it : b.items) {
    if (it.num_rows == 0) continue;
    const std::size_t r0 = it.row_begin;
    if (li.is_kv_source) compressor(l, it, x + r0 * D);
    if (li.is_index_source) indexer(l, it, qr.get() + r0 * a.q_lora_rank, x + r0 * D);
    attend(l, it, q.get() + r0 * nh * dh, kv.get() + r0 * dh, o.get() + r0 * nh * dh);
    // ring records of the item's last min(T, window) rows
    const int first_t = std::max(0, it.num_rows - a.sliding_window);
    const int cnt = it.num_rows - first_t;
    dvec<uint8_t*> dst(ring_records(*it.kv, li.layer_idx, it.first_pos + first_t, cnt));
    cuda::store_records(cuda::record_kind::fp8, kv.get() + (r0 + first_t) * dh, cnt, dh, dst.get());
  }
  cuda::rope(o.get(), n, nh, dh, pos, rope[l], true);
  cuda::grouped_output(o.get(), n, a.o_groups, w.wo_a, w.wo_b, out);
}

// ---- MoE, Engram, layer, head ----------------------------------------------------------------------

void gpu_model::impl::moe(int l, const float* y, int n, float* out) const {
  const dev_layer& w = layers[l];
  const int k = args.num_experts_per_tok;
  dvec<int32_t> sel(std::size_t(n) * k);
  dvec<float> weights(std::size_t(n) * k);
  cuda::moe_route(y, n, w.gate, w.gate_bias, k, float(args.routed_scaling_factor), sel.get(), weights.get());
  cuda::moe_ffn(y, n, args.hidden_size, sel.get(), weights.get(), k, w.experts.data(), int(w.experts.size()),
                args.n_shared_experts > 0 ? &w.shared : nullptr, float(args.swiglu_limit), out);
  cuda::round_bf16(out, std::size_t(n) * args.hidden_size);
}

void gpu_model::impl::apply_engram(int l, gbatch& b) const {
  const int per_token = args.engram_rows_per_token();
  const int lookback = args.engram_max_ngram_size - 1;
  std::vector<int64_t> rows(std::size_t(b.num_rows) * per_token);
  std::vector<int32_t> cids;
  for (const gitem& it : b.items) {
    if (it.num_rows == 0) continue;
    const auto& hist = it.item->history;
    const std::size_t keep = std::min<std::size_t>(hist.size(), std::size_t(lookback));
    CEDAR_OP_CHECK(int64_t(hist.size()) >= std::min<int64_t>(it.first_pos, lookback),
                   "history lacks the Engram look-back");
    cids.assign(hist.end() - keep, hist.end());
    cids.insert(cids.end(), it.item->tokens.begin(), it.item->tokens.end());
    const int64_t dropped = it.first_pos - it.item->kv->num_tokens;  // truncated rows
    cpu::engram_rows(cids.data(), int64_t(keep) + dropped, it.num_rows, engram_hash[l],
                     rows.data() + std::size_t(it.row_begin) * per_token);
  }
  dvec<int64_t> d_rows(rows);
  cuda::engram(b.X.get(), b.num_rows, args.hc_mult, args.hidden_size, d_rows.get(), per_token,
               layers[l].engram, float(args.rms_norm_eps));
}

void gpu_model::impl::run_layer(int l, gbatch& b, forward_stats* stats) const {
  const int n = b.num_rows, hc = args.hc_mult, D = args.hidden_size;
  const float eps = float(args.rms_norm_eps), hc_eps = float(args.hc_eps);
  const dev_layer& lw = layers[l];
  if (stats) stats->rows_per_layer[l] = n;
  if (args.layers[l].has_engram) apply_engram(l, b);
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
  mix(lw.hc_attn, a_pre.get());
  collapse_norm(b.pre.get(), lw.attn_norm);
  attention(l, b, x.get(), f.get());
  cuda::hc_post(f.get(), b.X.get(), post.get(), comb.get(), n, hc, D, b.X.get());
  mix(lw.hc_ffn, b.pre.get());
  collapse_norm(a_pre.get(), lw.ffn_norm);
  moe(l, x.get(), n, f.get());
  cuda::hc_post(f.get(), b.X.get(), post.get(), comb.get(), n, hc, D, b.X.get());
  if (stats) stats->max_abs_residual[l] = cuda::max_abs(b.X.get(), std::size_t(n) * hc * D);
}

// Drops, for each item with truncate_below >= 0, its rows below that position (stream.cpp's
// drop_truncated_rows): the kept rows are a suffix of each item, moved down with device copies.
void gpu_model::impl::drop_truncated_rows(gbatch& b) const {
  const int hc = args.hc_mult, D = args.hidden_size, K = args.index_topk;
  const std::size_t x_row = std::size_t(hc) * D;
  dvec<float> X(std::size_t(std::max(1, b.num_rows)) * x_row), pre(std::size_t(std::max(1, b.num_rows)) * hc);
  std::vector<int32_t> positions;
  int out = 0;
  for (gitem& it : b.items) {
    const int64_t tb = it.item->truncate_below;
    const int drop = tb < 0 ? 0 : int(std::clamp<int64_t>(tb - it.first_pos, 0, it.num_rows));
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
  b.X = std::move(X);
  b.pre = std::move(pre);
  b.positions = std::move(positions);
  b.d_positions = dvec<int32_t>(b.positions);
}

void gpu_model::impl::head_logits(const gbatch& b, std::vector<float>& logits) const {
  const int hc = args.hc_mult, D = args.hidden_size;
  std::vector<int> rows;
  for (const gitem& it : b.items) {
    const logits_mode mode = it.item->logits;
    if (mode == logits_mode::none) continue;
    CEDAR_OP_CHECK(it.num_rows > 0, "logits asked of an item whose rows were all truncated");
    for (int r = mode == logits_mode::last ? it.num_rows - 1 : 0; r < it.num_rows; ++r) rows.push_back(it.row_begin + r);
  }
  const int m = int(rows.size());
  if (m == 0) return;
  dvec<float> X(std::size_t(m) * hc * D), pre(std::size_t(m) * hc), h(std::size_t(m) * D),
      out(std::size_t(m) * args.vocab_size);
  for (int i = 0; i < m; ++i) {
    cuda::copy_device(X.get() + std::size_t(i) * hc * D, b.X.get() + std::size_t(rows[i]) * hc * D,
                      sizeof(float) * hc * D);
    cuda::copy_device(pre.get() + std::size_t(i) * hc, b.pre.get() + std::size_t(rows[i]) * hc, sizeof(float) * hc);
  }
  cuda::hc_collapse(X.get(), pre.get(), m, hc, D, h.get());
  cuda::rmsnorm(h.get(), m, D, norm, float(args.rms_norm_eps), h.get());
  cuda::linear_bf16(h.get(), m, head, out.get());
  const std::size_t old = logits.size();
  logits.resize(old + std::size_t(m) * args.vocab_size);
  cuda::copy_to_host(logits.data() + old, out.get(), sizeof(float) * std::size_t(m) * args.vocab_size);
}

void gpu_model::forward(std::span<forward_item> batch, std::vector<float>& logits, forward_stats* stats) const {
  const impl& m = *impl_;
  const int hc = m.args.hc_mult, D = m.args.hidden_size;
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
  if (n > 0) {
    b.d_positions = dvec<int32_t>(b.positions);
    dvec<int32_t> d_tokens(tokens);
    dvec<float> e(std::size_t(n) * D);
    cuda::embed(d_tokens.get(), n, m.embed, e.get());
    b.X = dvec<float>(std::size_t(n) * hc * D);
    b.pre = dvec<float>(std::size_t(n) * hc);
    cuda::hc_expand(e.get(), n, hc, D, b.X.get(), b.pre.get());
    for (int l = 0; l < m.args.num_hidden_layers && b.num_rows > 0; ++l) {
      if (l == m.args.truncate_from_layer) m.drop_truncated_rows(b);
      m.run_layer(l, b, stats);
    }
    m.head_logits(b, logits);
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

// ---- KV arena ----------------------------------------------------------------------------------

gpu_kv_arena::gpu_kv_arena(const kv_layout& layout, double memory_fraction) : layout_(layout) {
  std::size_t free_b = 0, total_b = 0;
  cuda::memory_info(&free_b, &total_b);
  const std::size_t want = std::size_t(double(free_b) * std::clamp(memory_fraction, 0.0, 0.95));
  const int64_t pages = int64_t(want / std::max<std::size_t>(1, layout.page_bytes));
  if (pages <= 0) throw std::runtime_error("gpu_kv_arena: no room for one KV page");
  base_ = static_cast<uint8_t*>(cuda::device_alloc(std::size_t(pages) * layout.page_bytes));
  for (int64_t p = pages - 1; p >= 0; --p) free_.push_back(base_ + std::size_t(p) * layout.page_bytes);
}

gpu_kv_arena::~gpu_kv_arena() { cuda::device_free(base_); }

std::optional<request_kv> gpu_kv_arena::allocate(int64_t max_tokens) {
  const int64_t need = max_tokens / layout_.page_tokens + 1;
  if (need > int64_t(free_.size())) return std::nullopt;
  request_kv kv;
  for (int64_t i = 0; i < need; ++i) {
    kv.pages.push_back(free_.back());
    free_.pop_back();
  }
  used_ += need;
  kv.swa_ring = static_cast<uint8_t*>(cuda::device_alloc(layout_.ring_bytes()));
  kv.tails = static_cast<float*>(cuda::device_alloc(layout_.tail_floats() * sizeof(float)));
  cuda::fill_bytes(kv.swa_ring, 0, layout_.ring_bytes());
  cuda::fill_bytes(kv.tails, 0, layout_.tail_floats() * sizeof(float));
  for (uint8_t* p : kv.pages) cuda::fill_bytes(p, 0, layout_.page_bytes);
  cuda::synchronize();
  return kv;
}

void gpu_kv_arena::release(request_kv& kv) {
  for (uint8_t* p : kv.pages) free_.push_back(p);
  used_ -= int64_t(kv.pages.size());
  kv.pages.clear();
  cuda::device_free(kv.swa_ring);
  cuda::device_free(kv.tails);
  kv.swa_ring = nullptr;
  kv.tails = nullptr;
  kv.num_tokens = 0;
}

}  // namespace cedar

#endif  // CEDAR_HAVE_CUDA
