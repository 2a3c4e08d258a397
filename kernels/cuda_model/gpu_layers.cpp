// The GPU sublayers, step for step as the CPU's compressor_layer.cpp, indexer_layer.cpp,
// attention_layer.cpp, ffn_layer.cpp and stream.cpp (Engram): each step a CUDA op on device
// buffers; record addresses, positions and Engram rows are computed here and uploaded without
// waiting. With the fast kernel set the attention sublayer's per-item steps run for all items
// at once through device page tables (gpu_attention_fast.cpp). One forward call, the calling
// thread.
#ifdef CEDAR_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <optional>

#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/layer_ops.hpp"
#include "kernels/cuda_model/gpu_forward.hpp"
#include "kernels/model/kv_io.hpp"
#include "kernels/model/shard_forward.hpp"
#include "kernels/model/weights.hpp"

namespace cedar {

// ---- compressor (compressor_layer.cpp) -----------------------------------------------------------

void gpu_model::impl::compressor(int l, gitem& it, const float* x) const {
  const layer_info& li = args.layers[l];
  const dev_layer& w = layers[l];
  const int ratio = li.compress_ratio, dh = args.head_dim, T = it.num_rows;
  const float eps = float(args.rms_norm_eps);
  const int64_t p0 = it.first_pos;
  CEDAR_OP_CHECK(ratio == 1 || ratio == 2, "compressor ratio");
  dvec<float> latents(std::size_t(T / ratio + 1) * dh);
  int num = 0;
  int64_t first_entry = 0;
  if (ratio == 2) {
    float* tail = it.kv->tails + std::size_t(model_detail::tail_index(layout, li.kv_source_slot)) * 2 * dh;
    num = cuda::compress_ratio2(x, T, p0, w.c_wkv, w.c_wgate, w.c_norm, eps, tail, latents.get(), bf16_linear());
    first_entry = p0 / 2;
  } else {
    cuda::compress_ratio1(x, T, w.c_wkv, w.c_norm, eps, latents.get(), bf16_linear());
    num = T;
    first_entry = p0;
  }
  if (it.item->replay || num == 0) return;
  std::vector<int32_t> entry_pos(num);
  for (int e = 0; e < num; ++e) entry_pos[e] = int32_t((first_entry + e) * ratio);
  dvec<int32_t> d_pos(entry_pos);
  finish_entries(l, latents.get(), num, d_pos.get(), [&](const float* v, int d, bool latent) {
    store_entries(it, li.kv_source_slot, first_entry, num, v, d, latent);
  });
}

void gpu_model::impl::finish_entries(int l, float* latents, int num, const int32_t* d_pos,
                                     const std::function<void(const float*, int, bool)>& store) const {
  const dev_layer& w = layers[l];
  const int dh = args.head_dim, dih = args.index_head_dim;
  const float eps = float(args.rms_norm_eps);
  // index keys from the raw latents
  dvec<float> k(std::size_t(num) * dih);
  linear(latents, num, w.c_index_wk, k.get());
  cuda::rmsnorm(k.get(), num, dih, w.c_index_k_norm, eps, k.get());
  cuda::rope(k.get(), num, 1, dih, d_pos, rope[l], false);
  if (layout.dtype == kv_dtype::fp8) cuda::fake_quant_fp8_rows(k.get(), num, dih);
  else cuda::fake_quant_fp4_pow2_rows(k.get(), num, dih);
  store(k.get(), dih, false);
  // latents, rotated at their entry positions
  cuda::rope(latents, num, 1, dh, d_pos, rope[l], false);
  if (layout.dtype == kv_dtype::fp8) cuda::fake_quant_fp8_rows(latents, num, dh);
  else cuda::fake_quant_fp4_e4m3_rows(latents, num, dh);
  store(latents, dh, true);
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
  linear(qr, T, w.i_wq_b, q.get());
  std::vector<int32_t> pos(T), visible(T);
  for (int t = 0; t < T; ++t) {
    pos[t] = int32_t(it.first_pos + t);
    visible[t] = int32_t((it.first_pos + t + 1) / ratio);
  }
  dvec<int32_t> d_pos(pos), d_vis(visible);
  cuda::rope(q.get(), T, nih, dih, d_pos.get(), rope[l], false);
  cuda::fake_quant_fp4_pow2_rows(q.get(), T, nih * dih);
  linear(x, T, w.i_weights_proj, hw.get());
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
  const int T = it.num_rows, dh = args.head_dim, W = args.sliding_window, nh = num_heads();
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
  cuda::sparse_attention(q, T, nh, dh, buf.get(), idx.get(), num_idx, layers[l].sink + head_begin(), scale, o);
}

void gpu_model::impl::attention(int l, gbatch& b, const float* x, float* out, const uint8_t* xq,
                                const float* xs) const {
  const model_args& a = args;
  const layer_info& li = a.layers[l];
  const dev_layer& w = layers[l];
  const int n = b.num_rows, D = a.hidden_size, dh = a.head_dim, nh = num_heads();
  const float eps = float(a.rms_norm_eps);
  const int32_t* pos = b.d_positions.get();
  // a TP rank's query heads: their rows of wq_b (the other projections are every rank's)
  const fp8_weight wq_b = splits_heads() ? model_detail::head_rows(w.wq_b, head_begin(), nh, dh) : w.wq_b;

  std::optional<phase_profile::scope> proj_time(std::in_place, profile, phase_profile::attn_proj);
  dvec<float> qr(std::size_t(n) * a.q_lora_rank), kv(std::size_t(n) * dh);
  linear_pair(x, n, w.wq_a, qr.get(), w.wkv, kv.get(), xq, xs);  // both read x
  dvec<float> q(std::size_t(n) * nh * dh);
  const bool fast_attn = fast_attention();
  // the fast set: each row chain in one launch, the same bits as the separate ops: RMSNorm with
  // wq_b's codes; then the kv row's RMSNorm, RoPE, FP8 fake quantization and ring record with
  // the queries' RoPE (its cos and sin kept for the attention output's inverse)
  const bool qr_codes = kernels == gpu_kernels::fast && cuda::fast::linear_fp8_takes_codes(n, wq_b);
  dvec<uint8_t> qr_q(qr_codes ? std::size_t(n) * a.q_lora_rank : 0);
  dvec<float> qr_s(qr_codes ? std::size_t(n) * (a.q_lora_rank / 32) : 0);
  dvec<uint8_t> kv_rec(fast_attn ? std::size_t(n) * layout.swa_record_bytes : 0);
  dvec<float> rope_cs(fast_attn ? std::size_t(n) * rope[l].rope_dim : 0);
  // where the attention kernel rotates the queries as it loads them, both row chains run before
  // wq_b in one launch (one launch less a layer; the same bits)
  const bool q_unrotated = fast_attn && qr_codes && attention_takes_unrotated_q(n);
  if (fast_attn)
    CEDAR_OP_CHECK(layout.swa_record_bytes == std::size_t(dh + dh / 32), "ring records: FP8 codes and scales");
  const auto kv_chain = [&] {
    cuda::fast::row_finish f;
    f.norm_w = w.kv_norm, f.eps = eps, f.positions = pos, f.rope = &rope[l], f.fake_fp8 = true;
    f.record = kv_rec.get(), f.rope_cs = rope_cs.get();
    return f;
  };
  if (qr_codes) {
    cuda::fast::row_finish f;
    f.norm_w = w.q_norm, f.eps = eps, f.codes = qr_q.get(), f.scales = qr_s.get();
    if (q_unrotated)
      cuda::fast::finish_rows_pair(n, qr.get(), a.q_lora_rank, f, qr.get(), kv.get(), dh, kv_chain(), kv.get());
    else
      cuda::fast::finish_rows(qr.get(), n, a.q_lora_rank, f, qr.get());
    cuda::fast::linear_fp8(qr.get(), n, wq_b, q.get(), qr_q.get(), qr_s.get());
  } else {
    cuda::rmsnorm(qr.get(), n, a.q_lora_rank, w.q_norm, eps, qr.get());
    linear(qr.get(), n, wq_b, q.get());
  }
  if (fast_attn) {
    // the kv chain with the queries' rotation, after wq_b (with q_unrotated it ran with the qr
    // chain's, and the attention rotates the queries)
    if (!q_unrotated) {
      cuda::fast::row_finish f = kv_chain();
      f.rotate = q.get(), f.rotate_heads = nh, f.rotate_head_dim = dh;
      cuda::fast::finish_rows(kv.get(), n, dh, f, kv.get());
    }
  } else {
    cuda::rope(q.get(), n, nh, dh, pos, rope[l], false);
    cuda::rmsnorm(kv.get(), n, dh, w.kv_norm, eps, kv.get());
    cuda::rope(kv.get(), n, 1, dh, pos, rope[l], false);
    cuda::fake_quant_fp8_rows(kv.get(), n, dh);
  }

  proj_time.reset();
  dvec<float> o(std::size_t(n) * nh * dh);
  if (fast_attn) {
    attn_rows in;
    in.qr = qr.get(), in.x = x, in.q = q.get(), in.kv = kv.get(), in.kv_records = kv_rec.get();
    in.rope_cs = rope_cs.get(), in.q_unrotated = q_unrotated;
    if (qr_codes && a.q_lora_rank == layers[l].i_wq_b.in && cuda::fast::linear_fp8_takes_codes(n, layers[l].i_wq_b))
      in.qr_codes = qr_q.get(), in.qr_scales = qr_s.get();
    attend_fast(l, b, in, o.get());
  } else {
    phase_profile::scope t(profile, phase_profile::attend);
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
  }
  phase_profile::scope t(profile, phase_profile::out_proj);
  if (!fast_attn) cuda::rope(o.get(), n, nh, dh, pos, rope[l], true);  // else sparse_attention's
  if (splits_heads()) {  // every rank runs the output LoRA on all heads
    dvec<float> all(std::size_t(n) * a.num_attention_heads * dh);
    gather_heads(o.get(), n, all.get());
    o = std::move(all);
  }
  grouped_output(o.get(), n, w, out);
}

// ---- MoE, Engram, layer, head ----------------------------------------------------------------------

void gpu_model::impl::moe(int l, const float* y, int n, float* out, const uint8_t* yq, const float* ys) const {
  const dev_layer& w = layers[l];
  const int k = args.num_experts_per_tok;
  dvec<int32_t> sel(std::size_t(n) * k);
  dvec<float> weights(std::size_t(n) * k);
  // at decode sizes the router's launch also groups the slots by expert for the experts' launches
  cuda::fast::expert_plan plan;
  const bool planned = kernels == gpu_kernels::fast && !sharded() && cuda::fast::route_makes_plan(n, k);
  const int num_experts = int(w.experts.size());
  dvec<uint8_t> plan_buffer(planned ? cuda::fast::expert_plan_bytes(n, k, num_experts) : 0);
  if (planned) plan.experts = w.experts.data(), plan.num_experts = num_experts, plan.buffer = plan_buffer.get();
  if (n > 0) {
    phase_profile::scope t(profile, phase_profile::route);
    if (kernels == gpu_kernels::fast)
      cuda::fast::moe_route(y, n, w.gate, w.gate_bias, k, float(args.routed_scaling_factor), sel.get(), weights.get(),
                            planned ? &plan : nullptr);
    else
      cuda::moe_route(y, n, w.gate, w.gate_bias, k, float(args.routed_scaling_factor), sel.get(), weights.get());
  }
  phase_profile::scope t(profile, phase_profile::experts);
  if (sharded()) moe_sharded(l, y, n, sel.get(), weights.get(), out, yq, ys);
  else experts(y, n, sel.get(), weights.get(), w, out, yq, ys, planned ? &plan : nullptr);  // rounded to bf16
}

void gpu_model::impl::apply_engram(int l, gbatch& b) const {
  const int per_token = args.engram_rows_per_token();
  std::vector<int64_t> rows(std::size_t(b.num_rows) * per_token);
  for (const gitem& it : b.items) {
    if (it.num_rows == 0) continue;
    model_detail::engram_item_rows(engram_hash[l], it.item->history, it.item->tokens, it.item->kv->num_tokens,
                                   it.first_pos, it.num_rows, rows.data() + std::size_t(it.row_begin) * per_token);
  }
  dvec<int64_t> d_rows(rows);
  const auto op = kernels == gpu_kernels::fast ? &cuda::fast::engram : &cuda::engram;
  op(b.X.get(), b.num_rows, args.hc_mult, args.hidden_size, d_rows.get(), per_token, layers[l].engram,
     float(args.rms_norm_eps));
}

}  // namespace cedar

#endif  // CEDAR_HAVE_CUDA
