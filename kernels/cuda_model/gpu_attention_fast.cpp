// The attention sublayer's per-item steps with the fast kernel set (gpu_forward.hpp): every item
// of the batch at once, KV read through device page tables built once per forward call
// (fast_attention_state), the indexer's scores and top-k for all rows in one pass, the fused
// sparse attention kernel (kernels/cuda/fast/attention.hpp), and the ring writes. The compressor
// runs for all items at once when each brings one row (decode), else per item (gpu_layers.cpp),
// storing its records through the same page tables.
// One forward call, the calling thread.
#ifdef CEDAR_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/cuda/fast/attention.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda_model/gpu_forward.hpp"
#include "kernels/model/kv_io.hpp"

namespace cedar {

namespace fast = cuda::fast;

namespace gpu_detail {

/// Device arrays of one batch's items, and the top-k and candidate blocks of all its rows.
struct fast_attention_state {
  int num_rows = 0;
  std::vector<int32_t> row_begin, num_rows_of;  // host copies: the rows the device arrays describe
  std::vector<int64_t> first_pos;
  std::vector<int32_t> page_begin;
  dvec<int32_t> d_row_item, d_row_begin, d_row_end, d_page_begin;  // [rows], [items] x 3
  dvec<int64_t> d_first_pos, d_floor, d_floor_truncated;           // [items]
  dvec<uint8_t*> d_rings, d_pages;                                 // [items], [sum of pages]
  dvec<int32_t> topk;        // [rows, index_topk] of the latest index source
  dvec<uint8_t> candidates;  // [rows, num_candidate_blocks] of the candidate source
  int num_candidate_blocks = 0;
  /// Counts the reallocations of the device arrays: a state kept in a graph workspace is
  /// rewritten in place each step, and graphs captured before a reallocation read stale addresses.
  int generation = 0;

  /// v into d: in place where d holds it, else in a new array (twice d's, for a table that grows).
  template <class T>
  void put(dvec<T>& d, const std::vector<T>& v) {
    if (d.size() < v.size()) {
      d = dvec<T>(std::max(v.size(), 2 * d.size()));
      ++generation;
    }
    cuda::copy_to_device_async(d.get(), v.data(), v.size() * sizeof(T));
  }

  fast::kv_items items(bool truncated) const {
    return {d_row_item.get(),  d_row_begin.get(), d_row_end.get(), d_first_pos.get(),
            truncated ? d_floor_truncated.get() : d_floor.get(), d_rings.get(), d_pages.get(),
            d_page_begin.get()};
  }

  /// (Re)writes the per-row and per-item arrays from the batch's current rows.
  void describe_rows(const gbatch& b) {
    const std::size_t n = b.items.size();
    std::vector<int32_t> row_item(std::size_t(b.num_rows)), row_end(n);
    row_begin.assign(n, 0), num_rows_of.assign(n, 0), first_pos.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      const gitem& it = b.items[i];
      row_begin[i] = it.row_begin, num_rows_of[i] = it.num_rows, first_pos[i] = it.first_pos;
      row_end[i] = it.row_begin + it.num_rows;
      std::fill(row_item.begin() + it.row_begin, row_item.begin() + it.row_begin + it.num_rows, int32_t(i));
    }
    num_rows = b.num_rows;
    put(d_row_item, row_item);
    put(d_row_begin, row_begin);
    put(d_row_end, row_end);
    put(d_first_pos, first_pos);
  }

  /// Writes the per-item arrays (window floors, rings, page tables) and points each item at
  /// its page table, then describes the rows.
  void describe_items(gbatch& b) {
    const std::size_t n = b.items.size();
    std::vector<int64_t> floor(n), floor_truncated(n);
    std::vector<uint8_t*> rings(n), pages;
    page_begin.clear();
    for (std::size_t i = 0; i < n; ++i) {
      const gitem& it = b.items[i];
      floor[i] = it.ring_valid_from;  // window_floor of the CPU model, before and after truncation
      floor_truncated[i] = it.item->truncate_below >= 0 ? std::max(it.ring_valid_from, it.item->truncate_below)
                                                        : it.ring_valid_from;
      rings[i] = it.kv->swa_ring;
      page_begin.push_back(int32_t(pages.size()));
      pages.insert(pages.end(), it.kv->pages.begin(), it.kv->pages.end());
    }
    if (pages.empty()) pages.push_back(nullptr);
    put(d_floor, floor);
    put(d_floor_truncated, floor_truncated);
    put(d_rings, rings);
    put(d_pages, pages);
    put(d_page_begin, page_begin);
    for (std::size_t i = 0; i < n; ++i) b.items[i].d_pages = d_pages.get() + page_begin[i];
    describe_rows(b);
  }

  bool rows_changed(const gbatch& b) const {
    if (b.num_rows != num_rows) return true;
    for (std::size_t i = 0; i < b.items.size(); ++i)
      if (b.items[i].row_begin != row_begin[i] || b.items[i].first_pos != first_pos[i]) return true;
    return false;
  }

  /// After decoder truncation dropped each item's first rows: keep the top-k and candidate rows
  /// of the kept ones, then describe the new rows.
  void drop_rows(const gbatch& b, int topk_k) {
    const auto keep = [&](dvec<int32_t>* i32, dvec<uint8_t>* u8, std::size_t width) {
      const std::size_t elem = i32 ? sizeof(int32_t) : 1;
      const std::size_t total = std::size_t(std::max(1, b.num_rows)) * width;
      dvec<int32_t> n32(i32 ? total : 0);
      dvec<uint8_t> n8(u8 ? total : 0);
      for (std::size_t i = 0; i < b.items.size(); ++i) {
        const gitem& it = b.items[i];
        if (it.num_rows == 0) continue;
        const int64_t src_row = row_begin[i] + (it.first_pos - first_pos[i]);
        const std::size_t bytes = std::size_t(it.num_rows) * width * elem;
        if (i32) cuda::copy_device(n32.get() + std::size_t(it.row_begin) * width, i32->get() + src_row * width, bytes);
        else cuda::copy_device(n8.get() + std::size_t(it.row_begin) * width, u8->get() + src_row * width, bytes);
      }
      if (i32) *i32 = std::move(n32);
      else *u8 = std::move(n8);
    };
    if (topk.size() > 0) keep(&topk, nullptr, std::size_t(topk_k));
    if (candidates.size() > 0) keep(nullptr, &candidates, std::size_t(num_candidate_blocks));
    describe_rows(b);
  }
};

}  // namespace gpu_detail

bool gpu_model::impl::fast_attention() const {
  if (kernels != gpu_kernels::fast || !fast::supports(args.head_dim, args.index_head_dim) || args.index_n_heads > 32)
    return false;
  const char* env = std::getenv("CEDAR_GPU_FAST_ATTENTION");  // "0": the exact per-item path (A/B)
  return !(env && std::string(env) == "0");
}

namespace {

int attention_kernel_choice() {
  // $CEDAR_GPU_ATTENTION_KERNEL: per16 or all_heads forces that kernel (A/B runs); else automatic
  static const int choice = [] {
    const char* env = std::getenv("CEDAR_GPU_ATTENTION_KERNEL");
    const std::string v = env ? env : "";
    if (v == "per16") return int(fast::attention_per16);
    if (v == "all_heads") return int(fast::attention_all_heads);
    if (!v.empty() && v != "auto")
      std::fprintf(stderr, "cedar: CEDAR_GPU_ATTENTION_KERNEL='%s' is not per16, all_heads or auto; ignored\n", env);
    return int(fast::attention_auto);
  }();
  return choice;
}

}  // namespace

fast_attention_state& gpu_model::impl::fast_state(gbatch& b) const {
  if (!b.fast) {
    // whole-layer graphs read the workspace's state, rewritten in place
    if (!b.whole_layers) b.fast = std::make_shared<fast_attention_state>();
    else if (b.ws->attention) b.fast = b.ws->attention;
    else b.fast = b.ws->attention = std::make_shared<fast_attention_state>();
    b.fast->describe_items(b);
  } else if (b.fast->rows_changed(b)) {
    b.fast->drop_rows(b, args.index_topk);
  }
  return *b.fast;
}

void gpu_model::impl::upload_positions(gbatch& b) const {
  if (!b.whole_layers) {
    b.d_positions = dvec<int32_t>(b.positions);
    return;
  }
  graph_workspace& w = *b.ws;
  const std::size_t n = b.positions.size();
  if (w.positions.size() != n) w.positions = dvec<int32_t>(n);  // once: a workspace has one row count
  cuda::copy_to_device_async(w.positions.get(), b.positions.data(), n * sizeof(int32_t));
  b.d_positions = dvec<int32_t>::borrow(w.positions.get(), n);
  b.generation = fast_state(b).generation;
}

namespace {

/// Rows x [num, d] as storage records of `bytes` each.
dvec<uint8_t> pack_records(cuda::record_kind kind, const float* x, int num, int d, std::size_t bytes) {
  dvec<uint8_t> rec(std::size_t(num) * bytes);
  switch (kind) {
    case cuda::record_kind::fp8: cuda::pack_fp8_rows(x, num, d, rec.get()); break;
    case cuda::record_kind::fp4_e4m3: cuda::pack_fp4_e4m3_rows(x, num, d, rec.get()); break;
    case cuda::record_kind::fp4_pow2: cuda::pack_fp4_pow2_rows(x, num, d, rec.get()); break;
  }
  return rec;
}

}  // namespace

void gpu_model::impl::store_entries(const gitem& it, int slot, int64_t first, int num, const float* x, int d,
                                    bool latent) const {
  const cuda::record_kind kind = latent ? latent_kind() : key_kind();
  if (!it.d_pages) {
    dvec<uint8_t*> dst(entry_records(*it.kv, slot, first, num, latent));
    cuda::store_records(kind, x, num, d, dst.get());
    return;
  }
  const kv_source_layout& s = layout.sources.at(slot);
  const dvec<uint8_t> rec = pack_records(kind, x, num, d, latent ? s.latent_bytes : s.key_bytes);
  fast::store_entries(rec.get(), num, latent ? s.latent_bytes : s.key_bytes, it.d_pages, first, s.entries_per_page,
                      latent ? s.latent_offset : s.key_offset);
}

// compressor_layer.cpp for a batch whose every item brings one row (decode): the projections of
// all rows in one product, the pairs they complete merged against each item's parked token,
// and the entries stored through each item's page table, a dozen launches whatever the batch
// (the per-item path takes a dozen per item). False (nothing done) for any other batch.
bool gpu_model::impl::compressor_rows(int l, gbatch& b, const float* x) const {
  const layer_info& li = args.layers[l];
  const dev_layer& w = layers[l];
  const int ratio = li.compress_ratio, dh = args.head_dim;
  CEDAR_OP_CHECK(ratio == 1 || ratio == 2, "compressor ratio");
  for (const gitem& it : b.items)
    if (it.num_rows > 1 || (it.num_rows == 1 && (it.item->replay || !it.d_pages))) return false;
  std::vector<int32_t> rows, save_rows, pos;
  std::vector<float*> tails, save_tails;
  std::vector<uint8_t* const*> pages;
  std::vector<int64_t> entry;
  for (const gitem& it : b.items) {
    if (it.num_rows == 0) continue;
    const int64_t p = it.first_pos;
    float* tail = ratio == 2 ? it.kv->tails + std::size_t(model_detail::tail_index(layout, li.kv_source_slot)) * 2 * dh
                             : nullptr;
    if (ratio == 2 && p % 2 == 0) {  // the first of a pair: parked until the next step
      save_rows.push_back(it.row_begin), save_tails.push_back(tail);
      continue;
    }
    rows.push_back(it.row_begin), tails.push_back(tail), pages.push_back(it.d_pages);
    entry.push_back(p / ratio), pos.push_back(int32_t(p / ratio * ratio));
  }
  const int num = int(rows.size());
  const float eps = float(args.rms_norm_eps);
  dvec<float> latents(std::size_t(std::max(num, 1)) * dh);
  if (ratio == 2) {
    const dvec<int32_t> d_rows(rows), d_save(save_rows);
    const dvec<float*> d_tails(tails), d_save_tails(save_tails);
    cuda::compress_ratio2_rows(x, b.num_rows, w.c_wkv, w.c_wgate, w.c_norm, eps, d_rows.get(), d_tails.get(), num,
                               d_save.get(), d_save_tails.get(), int(save_rows.size()), latents.get(),
                               bf16_linear());
  } else {
    for (int e = 0; e < num; ++e) CEDAR_OP_CHECK(rows[e] == e, "one-row items cover the rows in order");
    cuda::compress_ratio1(x, num, w.c_wkv, w.c_norm, eps, latents.get(), bf16_linear());
  }
  if (num == 0) return true;
  const kv_source_layout& src = layout.sources.at(li.kv_source_slot);
  const dvec<int32_t> d_pos(pos);
  const dvec<uint8_t* const*> d_pages(pages);
  const dvec<int64_t> d_entry(entry);
  const auto store = [&](const float* v, int d, bool latent) {
    const std::size_t bytes = latent ? src.latent_bytes : src.key_bytes;
    const dvec<uint8_t> rec = pack_records(latent ? latent_kind() : key_kind(), v, num, d, bytes);
    fast::store_entries_rows(rec.get(), num, bytes, d_pages.get(), d_entry.get(), src.entries_per_page,
                             latent ? src.latent_offset : src.key_offset);
  };
  finish_entries(l, latents.get(), num, d_pos.get(), store);
  return true;
}

namespace {

fast::kv_source_view source_view(const kv_source_layout& s) {
  return {s.entries_per_page, s.latent_offset, s.latent_bytes, s.key_offset, s.key_bytes};
}

}  // namespace

// indexer_layer.cpp for every row of the batch: scores of rows with different items side by
// side ([rows, widest visible count], -inf past each row's own), so the level-1 blocks, the
// candidate mask and the exact top-k each run once over all rows.
void gpu_model::impl::indexer_fast(int l, gbatch& b, const attn_rows& in) const {
  fast_attention_state& st = *b.fast;
  const layer_info& li = args.layers[l];
  const dev_layer& w = layers[l];
  const int n = b.num_rows, ratio = li.compress_ratio, K = args.index_topk;
  const int nih = args.index_n_heads, dih = args.index_head_dim, block = args.candidate_block_size;
  int num_keys = 0;
  for (const gitem& it : b.items) num_keys = std::max(num_keys, int((it.first_pos + it.num_rows) / ratio));
  if (st.topk.size() != std::size_t(n) * K) st.topk = dvec<int32_t>(std::size_t(n) * K);
  cuda::fill_bytes(st.topk.get(), 0xFF, st.topk.size() * sizeof(int32_t));  // -1
  if (li.is_candidate_source) {
    st.num_candidate_blocks = (num_keys + block - 1) / block;
    st.candidates = dvec<uint8_t>(std::size_t(n) * st.num_candidate_blocks);
    cuda::fill_bytes(st.candidates.get(), 0, st.candidates.size());
  }
  if (num_keys == 0) return;
  dvec<float> q(std::size_t(n) * nih * dih), hw(std::size_t(n) * nih);
  fast::linear_fp8(in.qr, n, w.i_wq_b, q.get(), in.qr_codes, in.qr_scales);
  cuda::rope(q.get(), n, nih, dih, b.d_positions.get(), rope[l], false);
  cuda::fake_quant_fp4_pow2_rows(q.get(), n, nih * dih);
  linear(in.x, n, w.i_weights_proj, hw.get());
  cuda::scale_values(hw.get(), hw.size(), float(1.0 / std::sqrt(double(dih)) / std::sqrt(double(nih))));
  const fast::kv_items items = st.items(false);
  dvec<int32_t> visible{std::size_t(n)};
  fast::visible_entries(items, n, ratio, visible.get());

  constexpr std::size_t max_score_bytes = std::size_t(128) << 20;
  const int rows_per_chunk = int(std::max<std::size_t>(1, max_score_bytes / (sizeof(float) * std::size_t(num_keys))));
  dvec<float> scores(std::size_t(std::min(rows_per_chunk, n)) * num_keys);
  for (int r0 = 0; r0 < n; r0 += rows_per_chunk) {
    const int m = std::min(rows_per_chunk, n - r0);
    fast::index_scores_params p;
    p.q = q.get() + std::size_t(r0) * nih * dih;
    p.w = hw.get() + std::size_t(r0) * nih;
    p.scores = scores.get();
    p.first_row = r0;
    p.rows = m, p.heads = nih, p.dim = dih, p.num_keys = num_keys, p.ratio = ratio;
    p.format = layout.dtype == kv_dtype::fp8 ? fast::kv_format::fp8 : fast::kv_format::fp4;
    p.source = source_view(layout.sources.at(li.kv_source_slot));
    fast::index_scores(p, items);
    const std::size_t nb = std::size_t(st.num_candidate_blocks);
    if (li.is_candidate_source)
      cuda::candidate_blocks(scores.get(), m, num_keys, block, args.candidate_topk_blocks, visible.get() + r0,
                             st.candidates.get() + std::size_t(r0) * nb);
    if (li.uses_candidates) {
      CEDAR_OP_CHECK(st.num_candidate_blocks == (num_keys + block - 1) / block, "candidate mask size");
      cuda::mask_scores(scores.get(), m, num_keys, block, st.candidates.get() + std::size_t(r0) * nb, int(nb));
    }
    cuda::topk_indices(scores.get(), m, num_keys, K, st.topk.get() + std::size_t(r0) * K);
  }
}

void gpu_model::impl::attend_fast(int l, gbatch& b, const attn_rows& in, float* o) const {
  const layer_info& li = args.layers[l];
  const int n = b.num_rows, D = args.hidden_size, dh = args.head_dim, W = args.sliding_window;
  fast_attention_state& st = fast_state(b);
  if (li.is_kv_source) {
    phase_profile::scope t(profile, phase_profile::compressor);
    if (!compressor_rows(l, b, in.x))
      for (gitem& it : b.items)
        if (it.num_rows > 0) compressor(l, it, in.x + std::size_t(it.row_begin) * D);
  }
  if (li.is_index_source) {
    phase_profile::scope t(profile, phase_profile::indexer);
    indexer_fast(l, b, in);
  }
  phase_profile::scope t(profile, phase_profile::attend);
  const bool truncated = l >= args.truncate_from_layer;
  const fast::kv_items items = st.items(truncated);

  fast::sparse_attention_params p;
  p.q = in.q, p.kv = in.kv, p.sink = layers[l].sink + head_begin(), p.out = o;
  p.rows = n, p.heads = num_heads(), p.dim = dh;
  p.window = W, p.layer = li.layer_idx, p.ring_record_bytes = layout.swa_record_bytes;
  p.scale = 1.0f / std::sqrt(float(dh));
  p.format = layout.dtype == kv_dtype::fp8 ? fast::kv_format::fp8 : fast::kv_format::fp4;
  if (li.compress_ratio > 0) {
    CEDAR_OP_CHECK(st.topk.size() == std::size_t(n) * args.index_topk, "top-k of an earlier index source");
    p.topk = st.topk.get(), p.topk_k = args.index_topk;
    p.source = source_view(layout.sources.at(li.kv_source_slot));
  }
  // this call's window rows as the ring's FP8 records: the attention reads them (a quarter of
  // the fp32 rows' bytes; at prefill the window's newest rows are most of its gather), then
  // they go to the ring
  dvec<uint8_t> packed(in.kv_records ? 0 : std::size_t(n) * layout.swa_record_bytes);
  if (!in.kv_records) cuda::pack_fp8_rows(in.kv, n, dh, packed.get());
  p.kv_records = in.kv_records ? in.kv_records : packed.get();
  p.store_ring = true;
  p.variant = attention_kernel_choice();
  if (in.q_unrotated) p.q_rope_cs = in.rope_cs;
  fast::sparse_attention(p, items, in.rope_cs, rope[l].rope_dim);  // o rotated back when rope_cs
}

bool gpu_model::impl::attention_takes_unrotated_q(int n) const {
  if (!fast::tuning_now().attention_rotates_q) return false;
  fast::sparse_attention_params p;
  p.rows = n, p.heads = num_heads(), p.dim = args.head_dim, p.variant = attention_kernel_choice();
  return fast::attention_rotates_queries(p);
}

}  // namespace cedar

#endif  // CEDAR_HAVE_CUDA
