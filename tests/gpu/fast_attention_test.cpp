// GPU tests of the fused attention and indexer (kernels/cuda/fast/attention.hpp) against the CPU
// ops on random KV records laid out in shuffled pages and rings:
// - sparse attention: several items of different lengths in one launch (decode rows, prefill
//   chunks, a raised window floor, rows with fewer top-k entries than K, a dominant sink), both
//   KV dtypes, the real shape (64 x 512, W 128, K 512) and the tiny one; outputs poisoned first;
//   max |o - o_cpu| <= 1e-4 of the largest |o_cpu|; the automatic kernel choice, then each
//   kernel (16 heads a block; all 64 heads on wgmma, on sm_90a devices) forced.
// - indexer: scores within 1e-5 of the row's largest |score| (-inf past each row's visible
//   count), and top-k equal to the CPU's except where the CPU's own scores tie within that error.
// - the GPU model with the fast kernel set on the mixed batch of model_test.cpp: logits within
//   2e-2 of the largest |logit| of the CPU model.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>

#include "config/model_config.hpp"
#include "kernels/cuda/fast/attention.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/layer_ops.hpp"
#include "kernels/cuda_model/gpu_model.hpp"
#include "kernels/formats.hpp"
#include "kernels/model/model.hpp"
#include "kernels/model/random_weights.hpp"
#include "kernels/ops.hpp"
#include "tests/gpu/gpu_test_util.hpp"
#include "tests/kernels/model_test_util.hpp"

namespace {

using namespace cedar;
using namespace cedar::gpu_test;
namespace fast = cuda::fast;

struct test_item {
  int64_t first_pos = 0;
  int num_rows = 0;
  int64_t window_floor = 0;
};

/// Random global KV of several items (latents and index keys of one KV source, pages shuffled
/// in one device allocation per item) and SWA rings of two layers, with host copies.
struct synthetic_kv {
  int dim, index_dim, ratio, window;
  fast::kv_format format;
  fast::kv_source_view source;
  std::size_t page_bytes = 0, ring_record = 0;
  std::vector<test_item> items;
  std::vector<std::vector<uint8_t>> host_pages;  // [item] pages in logical order
  std::vector<std::vector<uint8_t>> host_rings;  // [item] [2, window, ring_record]
  std::vector<std::unique_ptr<dev<uint8_t>>> page_mem, ring_mem;
  std::unique_ptr<dev<uint8_t*>> d_pages, d_rings;
  std::unique_ptr<dev<int32_t>> d_row_item, d_row_begin, d_row_end, d_page_begin;
  std::unique_ptr<dev<int64_t>> d_first_pos, d_floor;
  int rows = 0;

  synthetic_kv(int d, int di, int r, int w, fast::kv_format f, std::vector<test_item> its, std::mt19937_64& rng)
      : dim(d), index_dim(di), ratio(r), window(w), format(f), items(std::move(its)) {
    const bool fp8 = f == fast::kv_format::fp8;
    source.entries_per_page = 64 / ratio;  // 64-token pages: many pages per item
    source.latent_bytes = fp8 ? fmt::fp8_record_bytes(dim) : fmt::fp4_e4m3_record_bytes(dim);
    source.key_bytes = fp8 ? fmt::fp8_record_bytes(index_dim) : fmt::fp4_pow2_record_bytes(index_dim);
    source.latent_offset = 0;
    source.key_offset = source.entries_per_page * source.latent_bytes;
    page_bytes = source.key_offset + source.entries_per_page * source.key_bytes;
    ring_record = fmt::fp8_record_bytes(dim);
    std::vector<uint8_t*> pages;
    std::vector<int32_t> row_item, row_begin, row_end, page_begin;
    std::vector<int64_t> first_pos, floor;
    std::vector<uint8_t*> rings;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const test_item& it = items[i];
      const int64_t entries = (it.first_pos + it.num_rows) / ratio;
      const int num_pages = int(entries / source.entries_per_page) + 1;
      std::vector<uint8_t> host(std::size_t(num_pages) * page_bytes);
      for (int64_t j = 0; j < int64_t(num_pages) * source.entries_per_page; ++j) {
        uint8_t* page = host.data() + std::size_t(j / source.entries_per_page) * page_bytes;
        const int64_t in_page = j % source.entries_per_page;
        const auto lat = values(rng, dim), key = values(rng, index_dim);
        uint8_t* lr = page + source.latent_offset + in_page * source.latent_bytes;
        uint8_t* kr = page + source.key_offset + in_page * source.key_bytes;
        if (fp8) fmt::pack_fp8(lat.data(), dim, lr), fmt::pack_fp8(key.data(), index_dim, kr);
        else fmt::pack_fp4_e4m3(lat.data(), dim, lr), fmt::pack_fp4_pow2(key.data(), index_dim, kr);
      }
      std::vector<uint8_t> ring(std::size_t(2) * window * ring_record);
      for (int s = 0; s < 2 * window; ++s) fmt::pack_fp8(values(rng, dim).data(), dim, ring.data() + s * ring_record);
      // pages stored in shuffled order: the page table is what finds them
      std::vector<int> slot(num_pages);
      std::iota(slot.begin(), slot.end(), 0);
      std::shuffle(slot.begin(), slot.end(), rng);
      std::vector<uint8_t> shuffled(host.size());
      for (int p = 0; p < num_pages; ++p)
        std::copy_n(host.data() + std::size_t(p) * page_bytes, page_bytes, shuffled.data() + std::size_t(slot[p]) * page_bytes);
      page_mem.push_back(std::make_unique<dev<uint8_t>>(shuffled));
      ring_mem.push_back(std::make_unique<dev<uint8_t>>(ring));
      page_begin.push_back(int32_t(pages.size()));
      for (int p = 0; p < num_pages; ++p) pages.push_back(page_mem.back()->get() + std::size_t(slot[p]) * page_bytes);
      rings.push_back(ring_mem.back()->get());
      host_pages.push_back(std::move(host));
      host_rings.push_back(std::move(ring));
      row_begin.push_back(rows);
      rows += it.num_rows;
      row_end.push_back(rows);
      for (int t = 0; t < it.num_rows; ++t) row_item.push_back(int32_t(i));
      first_pos.push_back(it.first_pos);
      floor.push_back(it.window_floor);
    }
    d_pages = std::make_unique<dev<uint8_t*>>(pages);
    d_rings = std::make_unique<dev<uint8_t*>>(rings);
    d_row_item = std::make_unique<dev<int32_t>>(row_item);
    d_row_begin = std::make_unique<dev<int32_t>>(row_begin);
    d_row_end = std::make_unique<dev<int32_t>>(row_end);
    d_page_begin = std::make_unique<dev<int32_t>>(page_begin);
    d_first_pos = std::make_unique<dev<int64_t>>(first_pos);
    d_floor = std::make_unique<dev<int64_t>>(floor);
  }

  /// Values with a different magnitude per group of 16.
  static std::vector<float> values(std::mt19937_64& rng, int n) {
    auto v = op_reference::random_floats(rng, std::size_t(n), -1.0f, 1.0f);
    for (int g = 0; g < n / 16; ++g) {
      const float mag = std::ldexp(1.0f, int(rng() % 5) - 2);
      for (int i = 0; i < 16; ++i) v[g * 16 + i] *= mag;
    }
    return v;
  }

  fast::kv_items view() const {
    return {d_row_item->get(), d_row_begin->get(), d_row_end->get(), d_first_pos->get(), d_floor->get(),
            d_rings->get(),    d_pages->get(),     d_page_begin->get()};
  }
  const uint8_t* host_record(int item, int64_t j, bool latent) const {
    const uint8_t* page = host_pages[item].data() + std::size_t(j / source.entries_per_page) * page_bytes;
    const int64_t in_page = j % source.entries_per_page;
    return latent ? page + source.latent_offset + in_page * source.latent_bytes
                  : page + source.key_offset + in_page * source.key_bytes;
  }
  std::vector<float> latent(int item, int64_t j) const {
    std::vector<float> v(dim);
    if (format == fast::kv_format::fp8) fmt::unpack_fp8(host_record(item, j, true), dim, v.data());
    else fmt::unpack_fp4_e4m3(host_record(item, j, true), dim, v.data());
    return v;
  }
  std::vector<float> key(int item, int64_t j) const {
    std::vector<float> v(index_dim);
    if (format == fast::kv_format::fp8) fmt::unpack_fp8(host_record(item, j, false), index_dim, v.data());
    else fmt::unpack_fp4_pow2(host_record(item, j, false), index_dim, v.data());
    return v;
  }
};

constexpr int ring_layer = 1;

/// The CPU model's attend_item for one item: candidate buffer and indices, then cpu::sparse_attention.
void cpu_attention(const synthetic_kv& s, int item, int row0, int heads, int K, const std::vector<float>& q,
                   const std::vector<float>& kv, const std::vector<int32_t>& topk, const std::vector<float>& sink,
                   float scale, std::vector<float>& out) {
  const test_item& it = s.items[item];
  const int T = it.num_rows, dh = s.dim, W = s.window;
  const int64_t p0 = it.first_pos, ring_lo = std::max(it.window_floor, p0 - (W - 1));
  const int ring_n = int(std::max<int64_t>(0, p0 - ring_lo));
  std::vector<int32_t> entries;
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k)
      if (topk[std::size_t(row0 + t) * K + k] >= 0) entries.push_back(topk[std::size_t(row0 + t) * K + k]);
  std::sort(entries.begin(), entries.end());
  entries.erase(std::unique(entries.begin(), entries.end()), entries.end());
  const int num_window = ring_n + T;
  std::vector<float> buf(std::size_t(num_window + entries.size()) * dh);
  for (int k = 0; k < ring_n; ++k)
    fmt::unpack_fp8(s.host_rings[item].data() + (std::size_t(ring_layer) * W + (ring_lo + k) % W) * s.ring_record, dh,
                    buf.data() + std::size_t(k) * dh);
  std::copy_n(kv.data() + std::size_t(row0) * dh, std::size_t(T) * dh, buf.data() + std::size_t(ring_n) * dh);
  for (std::size_t e = 0; e < entries.size(); ++e) {
    const auto v = s.latent(item, entries[e]);
    std::copy(v.begin(), v.end(), buf.begin() + (num_window + e) * dh);
  }
  const int num_idx = W + K;
  std::vector<int32_t> idx(std::size_t(T) * num_idx, -1);
  for (int t = 0; t < T; ++t) {
    const int64_t i = p0 + t;
    int32_t* row = idx.data() + std::size_t(t) * num_idx;
    int n = 0;
    for (int64_t p = std::max(it.window_floor, i - (W - 1)); p <= i; ++p) row[n++] = int32_t(p - ring_lo);
    for (int k = 0; k < K; ++k) {
      const int32_t j = topk[std::size_t(row0 + t) * K + k];
      if (j >= 0) row[W + k] = int32_t(num_window + (std::lower_bound(entries.begin(), entries.end(), j) - entries.begin()));
    }
  }
  cpu::sparse_attention(q.data() + std::size_t(row0) * heads * dh, T, heads, dh, buf.data(), idx.data(), num_idx,
                        sink.data(), scale, out.data() + std::size_t(row0) * heads * dh);
}

void attention_case(const std::string& base, int dh, int heads, int W, int K, int ratio, fast::kv_format format,
                    const std::vector<test_item>& items, uint64_t seed) {
  std::mt19937_64 rng(seed);
  synthetic_kv s(dh, 32, ratio, W, format, items, rng);
  const int rows = s.rows;
  auto q = op_reference::random_floats(rng, std::size_t(rows) * heads * dh, -8.0f, 8.0f);
  auto kv = op_reference::random_floats(rng, std::size_t(rows) * dh, -1.0f, 1.0f);
  for (int r = 0; r < rows; ++r) fmt::fake_quant_fp8(kv.data() + std::size_t(r) * dh, dh);
  auto sink = op_reference::random_floats(rng, std::size_t(heads), -2.0f, 2.0f);
  sink[0] = 12.0f;  // a head whose sink outweighs most candidates
  std::vector<int32_t> topk(std::size_t(rows) * std::max(K, 1), -1);
  for (std::size_t i = 0; i < items.size(); ++i)
    for (int t = 0; t < items[i].num_rows; ++t) {
      const int r = int(std::accumulate(items.begin(), items.begin() + i, 0, [](int a, const test_item& x) { return a + x.num_rows; })) + t;
      const int64_t visible = (items[i].first_pos + t + 1) / ratio;
      std::vector<int32_t> all(visible);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      int take = int(std::min<int64_t>(K, visible));
      if (r % 3 == 1) take = take * 2 / 3;  // rows with -1 entries
      std::sort(all.begin(), all.begin() + take);
      std::copy_n(all.begin(), take, topk.begin() + std::size_t(r) * K);
    }
  const float scale = 1.0f / std::sqrt(float(dh));
  std::vector<float> ref(std::size_t(rows) * heads * dh);
  for (std::size_t i = 0, row0 = 0; i < items.size(); row0 += items[i].num_rows, ++i)
    cpu_attention(s, int(i), int(row0), heads, K, q, kv, topk, sink, scale, ref);

  dev<float> d_q(q), d_kv(kv), d_sink(sink), d_out(std::size_t(rows) * heads * dh);
  dev<int32_t> d_topk(topk);
  // the automatic choice, then each kernel forced where this device runs it
  for (const auto& [vname, variant] : {std::pair<const char*, int>{"auto", fast::attention_auto},
                                       {"per16", fast::attention_per16}, {"all_heads", fast::attention_all_heads}}) {
    fast::sparse_attention_params p;
    p.q = d_q.get(), p.kv = d_kv.get(), p.topk = K > 0 ? d_topk.get() : nullptr, p.sink = d_sink.get();
    p.out = d_out.get();
    p.rows = rows, p.heads = heads, p.dim = dh, p.window = W, p.topk_k = K, p.layer = ring_layer;
    p.ring_record_bytes = s.ring_record, p.scale = scale, p.format = format, p.source = s.source;
    p.variant = variant;
    if (!fast::attention_variant_available(p, variant)) continue;
    const std::string name = base + " [" + vname + "]";
    fast::sparse_attention(p, s.view());
    const auto got = d_out.host();
    check_close(name, got.data(), ref.data(), got.size(), 1e-4);
    // within the batch-invariant rows, the first item alone gets the bits it gets in the batch
    if (rows > items[0].num_rows && rows <= fast::tuning_now().attention_split_rows) {
      dev<float> d_alone(std::size_t(items[0].num_rows) * heads * dh);
      fast::sparse_attention_params alone = p;
      alone.rows = items[0].num_rows, alone.out = d_alone.get();
      fast::sparse_attention(alone, s.view());
      const std::size_t n0 = std::size_t(alone.rows) * heads * dh;
      CHECK_MESSAGE(op_reference::same_bits(d_alone.host().data(), got.data(), n0), name,
                    ": the first item alone gets its bits in the batch of ", rows, " rows");
    }
    // the window's fresh rows as the ring's FP8 records (as the model passes them): the same values,
    // so the same bits
    dev<uint8_t> d_rec(std::size_t(rows) * s.ring_record);
    cuda::pack_fp8_rows(d_kv.get(), rows, dh, d_rec.get());
    cuda::fill_bytes(d_out.get(), 0xFF, sizeof(float) * got.size());
    p.kv = nullptr, p.kv_records = d_rec.get();
    fast::sparse_attention(p, s.view());
    const auto packed = d_out.host();
    CHECK_MESSAGE(std::memcmp(packed.data(), got.data(), sizeof(float) * got.size()) == 0, name,
                  ": fresh rows from records give the fp32 rows' bits");
    // the output rotated back by sparse_attention (rope_cs, in the combine pass or a pass of its
    // own) against the separate inverse RoPE: the same bits, with one split and with several
    cpu::rope_params rp;
    rp.rope_dim = dh >= 128 ? 64 : 16, rp.yarn = true;
    std::vector<int32_t> pos;
    for (const test_item& it : items)
      for (int t = 0; t < it.num_rows; ++t) pos.push_back(int32_t(it.first_pos + t));
    dev<int32_t> d_pos(pos);
    dev<float> d_apart(got);
    cuda::rope(d_apart.get(), rows, heads, dh, d_pos.get(), rp, true);
    // the rows' cos and sin as the model gets them: from finish_rows' RoPE of the kv rows
    dev<float> d_cs(std::size_t(rows) * rp.rope_dim), d_scratch(kv);
    fast::row_finish f;
    f.positions = d_pos.get(), f.rope = &rp, f.rope_cs = d_cs.get();
    fast::finish_rows(d_scratch.get(), rows, dh, f, d_scratch.get());
    cuda::fill_bytes(d_out.get(), 0xFF, sizeof(float) * got.size());
    fast::sparse_attention(p, s.view(), d_cs.get(), rp.rope_dim);
    CHECK_MESSAGE(op_reference::same_bits(d_out.host().data(), d_apart.host().data(), got.size()), name,
                  ": the output rotated back in sparse_attention gives the separate RoPE's bits");
    if (!fast::attention_rotates_queries(p)) continue;
    // unrotated queries rotated as the kernel loads them (q_rope_cs) against queries rotated by
    // finish_rows' rotate blocks, as the model rotates them otherwise: the same bits
    dev<float> d_qrot(q), d_scratch2(kv);
    fast::row_finish fr;
    fr.positions = d_pos.get(), fr.rope = &rp, fr.rotate = d_qrot.get(), fr.rotate_heads = heads;
    fr.rotate_head_dim = dh;
    fast::finish_rows(d_scratch2.get(), rows, dh, fr, d_scratch2.get());
    fast::sparse_attention_params rotated = p, loaded = p;
    rotated.q = d_qrot.get();
    cuda::fill_bytes(d_out.get(), 0xFF, sizeof(float) * got.size());
    fast::sparse_attention(rotated, s.view(), d_cs.get(), rp.rope_dim);
    const auto want = d_out.host();
    loaded.q_rope_cs = d_cs.get();
    cuda::fill_bytes(d_out.get(), 0xFF, sizeof(float) * got.size());
    fast::sparse_attention(loaded, s.view(), d_cs.get(), rp.rope_dim);
    CHECK_MESSAGE(op_reference::same_bits(d_out.host().data(), want.data(), got.size()), name,
                  ": queries rotated as the kernel loads them give the bits of queries rotated before");
  }
}

}  // namespace

TEST_CASE("fast attention: fused sparse attention equals the CPU op within 1e-4 of max |o|") {
  if (!have_gpu()) return;
  // decode rows deep in context, a prefill chunk, a fresh prompt, a raised window floor
  const std::vector<test_item> real = {{3000, 1, 0}, {200, 5, 0}, {0, 3, 0}, {700, 2, 650}, {9000, 1, 0}};
  for (auto f : {fast::kv_format::fp4, fast::kv_format::fp8}) {
    const char* dt = f == fast::kv_format::fp4 ? "fp4" : "fp8";
    attention_case(std::string("attention 64x512 W128 K512 r2 ") + dt, 512, 64, 128, 512, 2, f, real, 11);
    attention_case(std::string("attention 64x512 W128 K512 r1 ") + dt, 512, 64, 128, 512, 1, f, real, 12);
    attention_case(std::string("attention 4x64 W8 K8 r2 ") + dt, 64, 4, 8, 8, 2, f,
                   {{30, 1, 0}, {5, 7, 0}, {0, 2, 0}, {40, 3, 38}}, 13);
  }
  attention_case("attention 64x512 window only", 512, 64, 128, 0, 2, fast::kv_format::fp4, real, 14);
  // one item alone: a single block row, so the kernel splits the candidates over blocks
  attention_case("attention 64x512 one decode row", 512, 64, 128, 512, 1, fast::kv_format::fp4, {{8191, 1, 0}}, 15);
  // a decode batch of 8 rows (each split as a row alone: its bits whatever the batch)
  attention_case("attention 64x512 decode batch of 8", 512, 64, 128, 512, 2, fast::kv_format::fp4,
                 {{3000, 1, 0}, {200, 1, 0}, {8191, 1, 0}, {700, 1, 650}, {50, 1, 0}, {5000, 1, 0}, {9000, 1, 0},
                  {128, 1, 0}},
                 18);
  // enough rows for one split (each block row its own output, no combine)
  attention_case("attention 64x512 prefill of 80 rows", 512, 64, 128, 512, 2, fast::kv_format::fp4, {{100, 80, 0}}, 16);
  // past attention_rows_min: the automatic choice takes the all-heads kernel where it runs
  attention_case("attention 64x512 prefill of 160 rows", 512, 64, 128, 512, 2, fast::kv_format::fp8, {{300, 160, 0}},
                 17);
}

namespace {

void index_case(const std::string& name, int dih, int heads, int ratio, int K, fast::kv_format format,
                const std::vector<test_item>& items, uint64_t seed) {
  std::mt19937_64 rng(seed);
  synthetic_kv s(64, dih, ratio, 8, format, items, rng);
  const int rows = s.rows;
  auto q = op_reference::random_floats(rng, std::size_t(rows) * heads * dih, -2.0f, 2.0f);
  for (int r = 0; r < rows; ++r) fmt::fake_quant_fp4_pow2(q.data() + std::size_t(r) * heads * dih, heads * dih);
  const auto w = op_reference::random_floats(rng, std::size_t(rows) * heads, -0.05f, 0.05f);
  int num_keys = 0;
  for (const test_item& it : items) num_keys = std::max(num_keys, int((it.first_pos + it.num_rows) / ratio));

  std::vector<float> ref(std::size_t(rows) * num_keys, -INFINITY);
  std::vector<int32_t> ref_topk(std::size_t(rows) * K);
  for (std::size_t i = 0, row0 = 0; i < items.size(); row0 += items[i].num_rows, ++i) {
    const int T = items[i].num_rows, n = int((items[i].first_pos + T) / ratio);
    std::vector<float> keys(std::size_t(std::max(n, 1)) * dih), sc(std::size_t(T) * std::max(n, 1));
    for (int j = 0; j < n; ++j) {
      const auto k = s.key(int(i), j);
      std::copy(k.begin(), k.end(), keys.begin() + std::size_t(j) * dih);
    }
    std::vector<int32_t> vis(T);
    for (int t = 0; t < T; ++t) vis[t] = int32_t((items[i].first_pos + t + 1) / ratio);
    cpu::index_scores(q.data() + row0 * heads * dih, w.data() + row0 * heads, T, heads, dih, keys.data(), n,
                      vis.data(), sc.data());
    cpu::topk_indices(sc.data(), T, n, K, ref_topk.data() + row0 * K);
    for (int t = 0; t < T; ++t) std::copy_n(sc.data() + std::size_t(t) * n, n, ref.data() + (row0 + t) * num_keys);
  }

  dev<float> d_q(q), d_w(w), d_scores(std::size_t(rows) * num_keys);
  dev<int32_t> d_topk(std::size_t(rows) * K);
  fast::index_scores_params p;
  p.q = d_q.get(), p.w = d_w.get(), p.scores = d_scores.get();
  p.rows = rows, p.heads = heads, p.dim = dih, p.num_keys = num_keys, p.ratio = ratio;
  p.format = format, p.source = s.source;
  fast::index_scores(p, s.view());
  cuda::topk_indices(d_scores.get(), rows, num_keys, K, d_topk.get());
  const auto got = d_scores.host();
  const auto got_topk = d_topk.host();

  // scores: error relative to each row's largest |score|
  double worst = 0;
  bool inf_ok = true;
  for (int r = 0; r < rows; ++r) {
    double mx = 0, err = 0;
    for (int j = 0; j < num_keys; ++j) {
      const float c = ref[std::size_t(r) * num_keys + j], g = got[std::size_t(r) * num_keys + j];
      if (std::isinf(c)) {
        inf_ok &= std::isinf(g) && g < 0;
        continue;
      }
      mx = std::max(mx, std::fabs(double(c)));
      err = std::max(err, std::isfinite(g) ? std::fabs(double(g) - c) : INFINITY);
    }
    worst = std::max(worst, err / std::max(mx, 1e-30));
  }
  // top-k: equal, or every GPU choice scores (on the CPU) within the error of the CPU's k-th
  int same_rows = 0, tie_rows = 0;
  bool topk_ok = true;
  for (int r = 0; r < rows; ++r) {
    const int32_t* a = got_topk.data() + std::size_t(r) * K;
    const int32_t* b = ref_topk.data() + std::size_t(r) * K;
    if (std::equal(a, a + K, b)) {
      ++same_rows;
      continue;
    }
    ++tie_rows;
    const float* sr = ref.data() + std::size_t(r) * num_keys;
    float kth = INFINITY, mx = 0;
    for (int k = 0; k < K && b[k] >= 0; ++k) kth = std::min(kth, sr[b[k]]);
    for (int j = 0; j < num_keys; ++j)
      if (std::isfinite(sr[j])) mx = std::max(mx, std::fabs(sr[j]));
    for (int k = 0; k < K; ++k) topk_ok &= (a[k] < 0) == (b[k] < 0) && (a[k] < 0 || sr[a[k]] >= kth - 1e-5f * mx);
  }
  std::printf("  %-34s scores err/max %.3e  bound 1e-05  top-k rows identical %d/%d (near-tie rows %d)\n",
              name.c_str(), worst, same_rows, rows, tie_rows);
  CHECK_MESSAGE(worst <= 1e-5, name);
  CHECK_MESSAGE(inf_ok, (name + ": -inf past the visible entries"));
  CHECK_MESSAGE(topk_ok, (name + ": top-k"));
}

}  // namespace

TEST_CASE("fast attention: fused indexer scores and top-k against the CPU's") {
  if (!have_gpu()) return;
  const std::vector<test_item> items = {{8190, 1, 0}, {1000, 6, 0}, {0, 9, 0}, {4000, 1, 0}, {2047, 2, 0}};
  for (auto f : {fast::kv_format::fp4, fast::kv_format::fp8}) {
    const char* dt = f == fast::kv_format::fp4 ? "fp4" : "fp8";
    index_case(std::string("indexer 32x128 r2 K512 ") + dt, 128, 32, 2, 512, f, items, 21);
    index_case(std::string("indexer 32x128 r1 K512 ") + dt, 128, 32, 1, 512, f, items, 22);
    index_case(std::string("indexer 2x32 r2 K8 ") + dt, 32, 2, 2, 8, f, {{40, 1, 0}, {3, 6, 0}, {17, 2, 0}}, 23);
  }
}

namespace {

/// The mixed batch of model_test.cpp (decode, all-logits prefill, chunk, decoder truncation,
/// replay), then three decode steps of the first three requests together; returns all logits and
/// the largest |residual| per layer of the mixed batch.
template <class Forward>
std::vector<float> mixed_batch(const model& m, Forward&& forward, forward_stats* stats) {
  const int vocab = m.args().vocab_size, W = m.args().sliding_window;
  const auto ta = test::random_tokens(21, vocab, 6), tb = test::random_tokens(7, vocab, 7),
             tc = test::random_tokens(18, vocab, 8), td = test::random_tokens(27, vocab, 15),
             te = test::random_tokens(24, vocab, 16);
  const kv_layout& l = m.layout();
  test::test_request a(l, 40), b(l, 40), c(l, 40), d(l, 40), e(l, 40);
  test::run(m, a, std::span(ta).first(20));  // both sides start from the CPU model's KV
  test::run(m, c, std::span(tc).first(13));
  test::run(m, e, te);
  e.kv.num_tokens = int64_t(te.size()) - W;
  e.history.resize(te.size() - W);
  std::vector<forward_item> items = {a.item(std::span(ta).subspan(20, 1)), b.item(tb, logits_mode::all),
                                     c.item(std::span(tc).subspan(13, 5)), d.item(td),
                                     e.item(std::span(te).last(W), logits_mode::last)};
  items[3].truncate_below = int64_t(td.size()) - W;
  items[4].replay = true;
  std::vector<float> logits;
  forward(items, logits, stats);
  a.history.assign(ta.begin(), ta.end());
  b.history.assign(tb.begin(), tb.end());
  c.history.assign(tc.begin(), tc.end());
  for (int step = 0; step < 3; ++step) {
    const int32_t next[1] = {int32_t(3 + step)};
    std::vector<forward_item> decode = {a.item(next), b.item(next), c.item(next)};
    forward(decode, logits, nullptr);
    for (test::test_request* r : {&a, &b, &c}) r->history.push_back(next[0]);
  }
  return logits;
}

double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  REQUIRE(got.size() == ref.size());
  double max_ref = 0, max_err = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
    max_err = std::max(max_err, std::isfinite(got[i]) ? std::fabs(double(got[i]) - ref[i]) : INFINITY);
  }
  return max_err / std::max(max_ref, 1e-30);
}

}  // namespace

TEST_CASE("fast attention: the GPU model with the fast kernel set on a mixed batch is close to the CPU's") {
  if (!have_gpu()) return;
  for (const std::string preset : {"micro", "tiny"}) {
    std::string error;
    const auto args = load_model_args(preset, &error);
    REQUIRE_MESSAGE(args.has_value(), error);
    const auto weights = std::make_shared<tensor_map>(make_random_weights(*args, 1234));
    const model m(*args, weights, kv_dtype::fp4);
    const gpu_model g(*args, weights, kv_dtype::fp4, {}, gpu_kernels::fast);
    forward_stats cs, xs, fs;
    const auto cpu = mixed_batch(m, [&](auto& it, auto& lg, forward_stats* s) { m.forward(it, lg, s); }, &cs);
    const auto gpu_forward = [&](auto& it, auto& lg, forward_stats* s) { g.forward_host_kv(it, lg, s); };
    setenv("CEDAR_GPU_FAST_ATTENTION", "0", 1);  // the fast set with the exact attention path
    const auto exact_attn = mixed_batch(m, gpu_forward, &xs);
    unsetenv("CEDAR_GPU_FAST_ATTENTION");
    const auto fused = mixed_batch(m, gpu_forward, &fs);
    const double err_exact = rel_err(exact_attn, cpu), err_fused = rel_err(fused, cpu);
    std::printf("  %s fast set, mixed batch + 3 batched decode steps: logits rel err %.3e with the exact attention "
                "path, %.3e with the fused one; vs each other %.3e\n",
                preset.c_str(), err_exact, err_fused, rel_err(fused, exact_attn));
    std::printf("    max|residual| per layer (cpu / exact attention / fused):");
    for (int l = 0; l < args->num_hidden_layers; ++l)
      std::printf(" %d:%.4g/%.4g/%.4g", l, cs.max_abs_residual[l], xs.max_abs_residual[l], fs.max_abs_residual[l]);
    std::printf("\n");
    CHECK(err_fused <= std::max(2e-2, 4 * err_exact));
  }
}
