// `cedar gpu-bench`: synthetic KV and the device ceilings (see gpu_bench.hpp). Decode is timed
// on requests whose KV holds random records written with the storage codecs (kv_io.hpp), so
// every FP4/FP8 scale is a real power of two: a step's cost does not depend on the values, but
// NaN or huge scales from random bytes could send kernels down other paths.
#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>

#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/formats.hpp"
#include "kernels/model/kv_io.hpp"
#include "tools/cli/gpu_bench.hpp"

#ifdef CEDAR_HAVE_CUDA
#include "kernels/cuda/fast/fast_ops.hpp"
#endif

namespace cedar::cli::gpu_bench {
namespace {

/// One request's worth of records on the host: a few distinct pages, a ring, the tails.
struct kv_images {
  std::vector<std::vector<uint8_t>> pages;  // [num_pages][page_bytes]
  std::vector<uint8_t> ring;                // [num_layers, window, swa_record_bytes]
  std::vector<float> tails;                 // [num_ratio2_sources, 2, latent_dim]
};

kv_images make_images(const kv_layout& layout, int num_pages, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  kv_images im;
  im.pages.assign(std::size_t(num_pages), std::vector<uint8_t>(layout.page_bytes));
  im.ring.resize(layout.ring_bytes());
  im.tails.resize(layout.tail_floats());
  request_kv view;  // host pointers into the images, for the codecs
  for (auto& p : im.pages) view.pages.push_back(p.data());
  view.swa_ring = im.ring.data();
  std::vector<float> v(std::size_t(std::max(layout.latent_dim, layout.index_dim)));
  auto random_row = [&](int d) {
    for (int i = 0; i < d; ++i) v[std::size_t(i)] = normal(rng);
  };
  for (int slot = 0; slot < int(layout.sources.size()); ++slot) {
    const int64_t entries = int64_t(num_pages) * layout.sources[std::size_t(slot)].entries_per_page;
    for (int64_t e = 0; e < entries; ++e) {
      random_row(layout.latent_dim);
      model_detail::quantize_latent(layout, v.data());
      model_detail::store_latent(layout, view, slot, e, v.data());
      random_row(layout.index_dim);
      model_detail::quantize_index_key(layout, v.data());
      model_detail::store_index_key(layout, view, slot, e, v.data());
    }
  }
  for (int l = 0; l < layout.num_layers; ++l)
    for (int pos = 0; pos < layout.window; ++pos) {
      random_row(layout.latent_dim);
      fmt::fake_quant_fp8(v.data(), layout.latent_dim);
      model_detail::store_ring(layout, view, l, pos, v.data());
    }
  for (float& t : im.tails) t = 0.1f * normal(rng);
  return im;
}

}  // namespace

void fill_synthetic_kv(const kv_layout& layout, kv_arena& arena, const std::vector<bench_request>& requests,
                       int64_t context, uint64_t seed, int first_index) {
  // Request r's page p gets image (p + first_index + r) mod 8: neighbouring requests attend to
  // different records, so their rows (and the experts they route to) differ.
  const int64_t num_pages = (context + layout.page_tokens - 1) / layout.page_tokens;
  const int num_images = int(std::min<int64_t>(8, std::max<int64_t>(1, num_pages)));
  const kv_images im = make_images(layout, num_images, seed);
  const std::size_t tail_bytes = im.tails.size() * sizeof(float);
  for (const bench_request& req : requests)
    if (int64_t(req.page_ids.size()) < num_pages) throw std::runtime_error("synthetic KV: request has too few pages");
  const auto page_of = [&](std::size_t r, int64_t p) {
    return std::size_t((p + first_index + int64_t(r)) % num_images);
  };
  if (!arena.on_device()) {
    for (std::size_t r = 0; r < requests.size(); ++r) {
      const bench_request& req = requests[r];
      for (int64_t p = 0; p < num_pages; ++p)
        std::memcpy(arena.page(req.page_ids[std::size_t(p)]), im.pages[page_of(r, p)].data(), layout.page_bytes);
      std::memcpy(arena.ring(req.slot), im.ring.data(), im.ring.size());
      if (tail_bytes) std::memcpy(arena.tails(req.slot), im.tails.data(), tail_bytes);
    }
    return;
  }
#ifdef CEDAR_HAVE_CUDA
  // The images go up once; every request is then filled by device-to-device copies.
  std::vector<uint8_t*> staged;
  for (const auto& p : im.pages) {
    staged.push_back(static_cast<uint8_t*>(cuda::device_alloc(layout.page_bytes)));
    cuda::copy_to_device(staged.back(), p.data(), layout.page_bytes);
  }
  auto* ring = static_cast<uint8_t*>(cuda::device_alloc(im.ring.size()));
  cuda::copy_to_device(ring, im.ring.data(), im.ring.size());
  float* tails = nullptr;
  if (tail_bytes) {
    tails = static_cast<float*>(cuda::device_alloc(tail_bytes));
    cuda::copy_to_device(tails, im.tails.data(), tail_bytes);
  }
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const bench_request& req = requests[r];
    for (int64_t p = 0; p < num_pages; ++p)
      cuda::copy_device(arena.page(req.page_ids[std::size_t(p)]), staged[page_of(r, p)], layout.page_bytes);
    cuda::copy_device(arena.ring(req.slot), ring, im.ring.size());
    if (tails) cuda::copy_device(arena.tails(req.slot), tails, tail_bytes);
  }
  cuda::synchronize();
  for (uint8_t* p : staged) cuda::device_free(p);
  cuda::device_free(ring);
  if (tails) cuda::device_free(tails);
#else
  throw std::runtime_error("synthetic KV on the device: cedar was built without CUDA");
#endif
}

ceilings measure_ceilings(device_kind device) {
  ceilings c;
  c.device = device == device_kind::cpu ? "cpu" : cuda::status();
#ifdef CEDAR_HAVE_CUDA
  if (device != device_kind::cuda || !cuda::available()) return c;
  c.copy_gbps = cuda::fast::copy_bandwidth_gbps(std::size_t(1) << 30);
  constexpr int n = 8192;
  cuda::fast::blaslt_gemm blas(n, n, n);
  if (blas.ok()) {
    const double ms = cuda::fast::time_ms([&](int) { blas.run(); }, 3, 20);
    c.blas_tflops = 2.0 * n * double(n) * n / (ms * 1e9);
    c.blas_dtype = blas.dtype();
  }
  cuda::synchronize();
#endif
  return c;
}

}  // namespace cedar::cli::gpu_bench
