// The attention cases of `cedar kernel-lab` (kernel_lab.hpp): decode at 8K context with the
// V4.1-Flash shapes (64 x 512 heads, window 128, top-512 of the 4096 entries of a ratio-2 source,
// indexer 32 x 128), batch 1, 64, 256 and 1024, global KV records in FP4 and FP8. The fused
// kernels (kernels/cuda/fast/attention.hpp: records read through page tables; the automatic
// choice, and from 64 rows each kernel forced) against the exact path
// (load_records of every visible entry, then the exact ops, one item at a time, record addresses
// already on the device). The exact outputs are the CPU's bits, so the fused ones are checked
// against them; bytes are what a call must move (KV records read, q and o, top-k).
#ifdef CEDAR_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>

#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/fast/attention.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/formats.hpp"
#include "tools/cli/kernel_lab.hpp"

namespace cedar::lab {
namespace {

namespace fast = cuda::fast;

constexpr int heads = 64, dim = 512, window = 128, topk_k = 512, index_heads = 32, index_dim = 128;
constexpr int context = 8192, ratio = 2, page_tokens = 256;
constexpr int entries = context / ratio, entries_per_page = page_tokens / ratio, pages_per_item = context / page_tokens;

/// One decode batch: every item at position context - 1 with its pages, ring and top-k.
struct decode_batch {
  int batch;
  fast::kv_format format;
  fast::kv_source_view source;
  std::size_t page_bytes;
  std::unique_ptr<dbuf<uint8_t>> pages_mem, rings_mem;
  std::unique_ptr<dbuf<uint8_t*>> pages, rings;
  std::unique_ptr<dbuf<int32_t>> row_item, row_begin, row_end, page_begin, topk;
  std::unique_ptr<dbuf<int64_t>> first_pos, floor;
  std::unique_ptr<dbuf<float>> q, kv, sink, iq, iw;
  std::unique_ptr<dbuf<uint8_t>> kv_rec;

  decode_batch(int b, fast::kv_format f, std::mt19937_64& rng) : batch(b), format(f) {
    const bool fp8 = f == fast::kv_format::fp8;
    source.entries_per_page = entries_per_page;
    source.latent_bytes = fp8 ? fmt::fp8_record_bytes(dim) : fmt::fp4_e4m3_record_bytes(dim);
    source.key_bytes = fp8 ? fmt::fp8_record_bytes(index_dim) : fmt::fp4_pow2_record_bytes(index_dim);
    source.key_offset = entries_per_page * source.latent_bytes;
    page_bytes = source.key_offset + entries_per_page * source.key_bytes;
    // 8 distinct random pages, copied over every page of every item on the device
    std::vector<uint8_t> pool(8 * page_bytes);
    for (int p = 0; p < 8; ++p)
      for (int e = 0; e < entries_per_page; ++e) {
        uint8_t* page = pool.data() + p * page_bytes;
        const auto lat = values(rng, dim), key = values(rng, index_dim);
        if (fp8) {
          fmt::pack_fp8(lat.data(), dim, page + e * source.latent_bytes);
          fmt::pack_fp8(key.data(), index_dim, page + source.key_offset + e * source.key_bytes);
        } else {
          fmt::pack_fp4_e4m3(lat.data(), dim, page + e * source.latent_bytes);
          fmt::pack_fp4_pow2(key.data(), index_dim, page + source.key_offset + e * source.key_bytes);
        }
      }
    const std::size_t num_pages = std::size_t(b) * pages_per_item;
    pages_mem = std::make_unique<dbuf<uint8_t>>(num_pages * page_bytes);
    const dbuf<uint8_t> d_pool(pool);
    for (std::size_t p = 0; p < num_pages; p += 8)
      cuda::copy_device(pages_mem->p + p * page_bytes, d_pool.p, std::min<std::size_t>(8, num_pages - p) * page_bytes);
    // pages of an item scattered over the allocation (a page table, not an offset)
    std::vector<uint32_t> order(num_pages);
    std::iota(order.begin(), order.end(), 0u);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<uint8_t*> page_ptr(num_pages);
    for (std::size_t p = 0; p < num_pages; ++p) page_ptr[p] = pages_mem->p + std::size_t(order[p]) * page_bytes;
    pages = std::make_unique<dbuf<uint8_t*>>(page_ptr);
    const std::size_t ring_rec = fmt::fp8_record_bytes(dim);
    std::vector<uint8_t> ring(std::size_t(window) * ring_rec);
    for (int s = 0; s < window; ++s) fmt::pack_fp8(values(rng, dim).data(), dim, ring.data() + s * ring_rec);
    rings_mem = std::make_unique<dbuf<uint8_t>>(std::size_t(b) * ring.size());
    const dbuf<uint8_t> d_ring(ring);
    std::vector<uint8_t*> ring_ptr(b);
    for (int i = 0; i < b; ++i) {
      cuda::copy_device(rings_mem->p + std::size_t(i) * ring.size(), d_ring.p, ring.size());
      ring_ptr[i] = rings_mem->p + std::size_t(i) * ring.size();
    }
    rings = std::make_unique<dbuf<uint8_t*>>(ring_ptr);
    std::vector<int32_t> ids(b), ends(b), pb(b), tk(std::size_t(b) * topk_k);
    std::iota(ids.begin(), ids.end(), 0);
    for (int i = 0; i < b; ++i) {
      ends[i] = i + 1, pb[i] = i * pages_per_item;
      std::vector<int32_t> all(entries);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      std::sort(all.begin(), all.begin() + topk_k);
      std::copy_n(all.begin(), topk_k, tk.begin() + std::size_t(i) * topk_k);
    }
    row_item = std::make_unique<dbuf<int32_t>>(ids);
    row_begin = std::make_unique<dbuf<int32_t>>(ids);
    row_end = std::make_unique<dbuf<int32_t>>(ends);
    page_begin = std::make_unique<dbuf<int32_t>>(pb);
    topk = std::make_unique<dbuf<int32_t>>(tk);
    first_pos = std::make_unique<dbuf<int64_t>>(std::vector<int64_t>(b, context - 1));
    floor = std::make_unique<dbuf<int64_t>>(std::vector<int64_t>(b, 0));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> hq(std::size_t(b) * heads * dim), hkv(std::size_t(b) * dim), hs(heads);
    for (float& v : hq) v = 8.0f * u(rng);
    for (float& v : hkv) v = u(rng);
    for (int r = 0; r < b; ++r) fmt::fake_quant_fp8(hkv.data() + std::size_t(r) * dim, dim);
    for (float& v : hs) v = 2.0f * u(rng);
    q = std::make_unique<dbuf<float>>(hq);
    kv = std::make_unique<dbuf<float>>(hkv);
    kv_rec = std::make_unique<dbuf<uint8_t>>(std::size_t(b) * fmt::fp8_record_bytes(dim));
    cuda::pack_fp8_rows(kv->p, b, dim, kv_rec->p);
    sink = std::make_unique<dbuf<float>>(hs);
    std::vector<float> hiq(std::size_t(b) * index_heads * index_dim), hiw(std::size_t(b) * index_heads);
    for (float& v : hiq) v = 2.0f * u(rng);
    for (int r = 0; r < b; ++r) fmt::fake_quant_fp4_pow2(hiq.data() + std::size_t(r) * index_heads * index_dim, index_heads * index_dim);
    for (float& v : hiw) v = 0.05f * u(rng);
    iq = std::make_unique<dbuf<float>>(hiq);
    iw = std::make_unique<dbuf<float>>(hiw);
  }

  static std::vector<float> values(std::mt19937_64& rng, int n) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (int i = 0; i < n; ++i) v[i] = u(rng) * std::ldexp(1.0f, int(rng() % 5) - 2);
    return v;
  }

  fast::kv_items items() const {
    return {row_item->p, row_begin->p, row_end->p, first_pos->p, floor->p, rings->p, pages->p, page_begin->p};
  }

  /// The model's call: the fresh rows as the ring's FP8 records (kv_records; the same values).
  fast::sparse_attention_params attention(float* out, int variant = fast::attention_auto) const {
    fast::sparse_attention_params p;
    p.q = q->p, p.kv_records = kv_rec->p, p.topk = topk->p, p.sink = sink->p, p.out = out, p.variant = variant;
    p.rows = batch, p.heads = heads, p.dim = dim, p.window = window, p.topk_k = topk_k, p.layer = 0;
    p.ring_record_bytes = fmt::fp8_record_bytes(dim), p.scale = 1.0f / std::sqrt(float(dim));
    p.format = format, p.source = source;
    return p;
  }

  fast::index_scores_params indexer(float* scores) const {
    fast::index_scores_params p;
    p.q = iq->p, p.w = iw->p, p.scores = scores;
    p.rows = batch, p.heads = index_heads, p.dim = index_dim, p.num_keys = entries, p.ratio = ratio;
    p.format = format, p.source = source;
    return p;
  }

  /// Host copies of the device page table and ring table (for the exact path's addresses).
  std::vector<uint8_t*> page_table() const { return pages->host(); }
  std::vector<uint8_t*> ring_table() const { return rings->host(); }
};

/// The exact path of one batch: per item, record addresses (built here once, before timing),
/// a buffer of every visible entry unpacked to fp32, then the exact ops.
struct exact_path {
  const decode_batch& b;
  std::vector<std::unique_ptr<dbuf<uint8_t*>>> ring_src, latent_src, key_src;
  dbuf<float> buf, keys, scores;
  dbuf<int32_t> idx, visible;

  explicit exact_path(const decode_batch& batch)
      : b(batch), buf(std::size_t(window + entries) * dim), keys(std::size_t(entries) * index_dim),
        scores(std::size_t(batch.batch) * entries), idx(std::size_t(window + topk_k)), visible(std::vector<int32_t>{entries}) {
    const auto pages = b.page_table(), rings = b.ring_table();
    const std::size_t ring_rec = fmt::fp8_record_bytes(dim);
    for (int i = 0; i < b.batch; ++i) {
      std::vector<uint8_t*> r(window - 1), l(entries), k(entries);
      for (int s = 0; s < window - 1; ++s) r[s] = rings[i] + std::size_t((context - window + s) % window) * ring_rec;
      for (int j = 0; j < entries; ++j) {
        uint8_t* page = pages[std::size_t(i) * pages_per_item + j / entries_per_page];
        l[j] = page + std::size_t(j % entries_per_page) * b.source.latent_bytes;
        k[j] = page + b.source.key_offset + std::size_t(j % entries_per_page) * b.source.key_bytes;
      }
      ring_src.push_back(std::make_unique<dbuf<uint8_t*>>(r));
      latent_src.push_back(std::make_unique<dbuf<uint8_t*>>(l));
      key_src.push_back(std::make_unique<dbuf<uint8_t*>>(k));
    }
  }

  void attention(float* out) {
    const bool fp8 = b.format == fast::kv_format::fp8;
    const int ring_n = window - 1, num_window = window;
    for (int i = 0; i < b.batch; ++i) {
      cuda::load_records(cuda::record_kind::fp8, ring_src[i]->p, ring_n, dim, buf.p);
      cuda::copy_device(buf.p + std::size_t(ring_n) * dim, b.kv->p + std::size_t(i) * dim, sizeof(float) * dim);
      cuda::load_records(fp8 ? cuda::record_kind::fp8 : cuda::record_kind::fp4_e4m3, latent_src[i]->p, entries, dim,
                         buf.p + std::size_t(num_window) * dim);
      cuda::attention_candidates(b.topk->p + std::size_t(i) * topk_k, 1, topk_k, window, context - 1, 0,
                                 context - window, num_window, idx.p);
      cuda::sparse_attention(b.q->p + std::size_t(i) * heads * dim, 1, heads, dim, buf.p, idx.p, window + topk_k,
                             b.sink->p, 1.0f / std::sqrt(float(dim)), out + std::size_t(i) * heads * dim);
    }
  }

  void indexer(int32_t* topk_out) {
    const bool fp8 = b.format == fast::kv_format::fp8;
    for (int i = 0; i < b.batch; ++i) {
      cuda::load_records(fp8 ? cuda::record_kind::fp8 : cuda::record_kind::fp4_pow2, key_src[i]->p, entries,
                         index_dim, keys.p);
      cuda::index_scores(b.iq->p + std::size_t(i) * index_heads * index_dim, b.iw->p + std::size_t(i) * index_heads, 1,
                         index_heads, index_dim, keys.p, entries, visible.p, scores.p + std::size_t(i) * entries);
      cuda::topk_indices(scores.p + std::size_t(i) * entries, 1, entries, topk_k, topk_out + std::size_t(i) * topk_k);
    }
  }
};

double max_rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double mx = 0, err = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    mx = std::max(mx, std::fabs(double(ref[i])));
    err = std::max(err, std::isfinite(a[i]) ? std::fabs(double(a[i]) - ref[i]) : INFINITY);
  }
  return err / std::max(mx, 1e-30);
}

lab_case make_case(const char* op, const char* variant, fast::kv_format f, int batch, double bytes, double flops) {
  lab_case c;
  c.op = op, c.variant = variant, c.shape = f == fast::kv_format::fp4 ? "8K ctx fp4" : "8K ctx fp8";
  c.m = batch, c.n = context, c.k = topk_k, c.bytes = bytes, c.flops = flops;
  return c;
}

}  // namespace

std::vector<lab_case> run_attention_cases(bool quick) {
  std::vector<lab_case> cases;
  std::mt19937_64 rng(2026);
  const int batches[] = {1, 64, 256, 1024};
  for (fast::kv_format f : {fast::kv_format::fp4, fast::kv_format::fp8}) {
    for (int batch : batches) {
      if (quick && (batch == 64 || batch == 1024)) continue;
      decode_batch b(batch, f, rng);
      exact_path ex(b);
      const fast::kv_items items = b.items();
      const std::size_t out_n = std::size_t(batch) * heads * dim;
      dbuf<float> out_fast(out_n), out_exact(out_n), scores(std::size_t(batch) * entries);
      dbuf<int32_t> topk_fast(std::size_t(batch) * topk_k), topk_exact(std::size_t(batch) * topk_k);
      cuda::fill_bytes(out_fast.p, 0xFF, out_n * sizeof(float));
      cuda::fill_bytes(topk_fast.p, 0xFF, topk_fast.n * sizeof(int32_t));

      // attention: per row the top-512 latents, 127 ring records, the fresh row, q in, o out, top-k
      const double row_bytes = double(topk_k) * b.source.latent_bytes + double(window - 1) * fmt::fp8_record_bytes(dim) +
                               4.0 * dim + 2.0 * 4.0 * heads * dim + 4.0 * topk_k;
      // the automatic choice ("fused"), then each kernel forced where it runs ("per16", "all_heads")
      const double flops = 4.0 * heads * dim * (window + topk_k) * batch;
      ex.attention(out_exact.p);
      const auto exact_out = out_exact.host();
      lab_case ea = make_case("attention", "exact", f, batch, row_bytes * batch, flops);
      ea.eager_us = ea.time_us = 1e3 * fast::time_ms([&](int) { ex.attention(out_exact.p); }, 1, 2);
      const std::pair<const char*, int> variants[] = {
          {"fused", fast::attention_auto}, {"per16", fast::attention_per16}, {"all_heads", fast::attention_all_heads}};
      std::vector<lab_case> fused;
      for (const auto& [name, variant] : variants) {
        if (!fast::attention_variant_available(b.attention(out_fast.p), variant)) continue;
        if (variant != fast::attention_auto && batch < 64) continue;  // decode: the automatic choice only
        lab_case fa = make_case("attention", name, f, batch, row_bytes * batch, flops);
        const auto run_fast = [&](int) { fast::sparse_attention(b.attention(out_fast.p, variant), items); };
        cuda::fill_bytes(out_fast.p, 0xFF, out_n * sizeof(float));
        run_fast(0);
        fa.checked = true;
        fa.max_err_ratio = max_rel_err(out_fast.host(), exact_out);
        fa.pass = fa.max_err_ratio <= 1e-4;
        fa.eager_us = 1e3 * fast::time_ms(run_fast, 3, 20);
        fa.time_us = 1e3 * fast::graph_time_ms(run_fast, 20);
        std::printf("attention %s batch %d %s: max rel err %.2e, %.1f us\n", fa.shape.c_str(), batch, name,
                    fa.max_err_ratio, fa.time_us);
        fused.push_back(fa);
      }

      // indexer: per row 4096 index keys, q and head weights in, top-k out
      const double irow = double(entries) * b.source.key_bytes + 4.0 * index_heads * (index_dim + 1) + 4.0 * topk_k;
      lab_case fi = make_case("indexer", "fused", f, batch, irow * batch, 2.0 * index_heads * index_dim * entries * batch);
      lab_case ei = fi;
      ei.variant = "exact";
      const auto run_index = [&](int) {
        fast::index_scores(b.indexer(scores.p), items);
        cuda::topk_indices(scores.p, batch, entries, topk_k, topk_fast.p);
      };
      run_index(0);
      ex.indexer(topk_exact.p);
      const auto tf = topk_fast.host(), te = topk_exact.host();
      int same_rows = 0;
      for (int r = 0; r < batch; ++r)
        same_rows += std::equal(tf.begin() + std::size_t(r) * topk_k, tf.begin() + std::size_t(r + 1) * topk_k,
                                te.begin() + std::size_t(r) * topk_k);
      fi.checked = true;
      fi.max_err_ratio = max_rel_err(scores.host(), ex.scores.host());  // scores vs the exact ones
      fi.pass = fi.max_err_ratio <= 1e-5;
      fi.eager_us = 1e3 * fast::time_ms(run_index, 3, 20);
      fi.time_us = 1e3 * fast::graph_time_ms(run_index, 20);
      ei.eager_us = ei.time_us = 1e3 * fast::time_ms([&](int) { ex.indexer(topk_exact.p); }, 1, 2);
      std::printf("indexer %s batch %d: top-k rows identical %d/%d\n", fi.shape.c_str(), batch, same_rows, batch);
      for (const lab_case& c : fused) cases.push_back(c);
      for (lab_case* c : {&ea, &fi, &ei}) cases.push_back(*c);
    }
  }
  return cases;
}

}  // namespace cedar::lab

#endif  // CEDAR_HAVE_CUDA
