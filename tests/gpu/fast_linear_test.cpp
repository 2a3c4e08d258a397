// GPU tests of the fast kernel set's ops (kernels/cuda/fast/linear_fast.cu) against the CPU ops,
// fresh random inputs, outputs poisoned first, every row count run through both paths (the
// decode kernels and, with the thresholds at 0, the bf16 cuBLAS path):
// - linears (FP8, W4A8, bf16): |y - y_cpu| <= 2^-16 * sum_k |x_k w_k| per output (both paths
//   compute the CPU's products, or for bf16 the CPU's rounded products up to one rounding, and
//   only sum in another order; fp32 sums of <= 1024 terms stay far below 2^-16 of sum|xw|);
// - grouped_output and moe_ffn compose linears with an FP8 quantization of an intermediate (and
//   the SwiGLU): a last-bit difference before a quantization can move a value by one e4m3 step
//   (2^-4 relative), so these are checked as max |out - out_cpu| <= 2^-8 of max |out_cpu|;
// - the decode paths give a row the same bits whatever the other rows (batch invariance; not
//   the bf16 GEMV's fallback for k % 8 != 0, which is the cuBLAS path).
#include <algorithm>
#include <functional>
#include <memory>
#include <random>

#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/layer_ops.hpp"
#include "kernels/formats.hpp"
#include "tests/gpu/gpu_test_util.hpp"

namespace {

using namespace cedar;
using namespace cedar::gpu_test;
namespace fast = cuda::fast;
namespace ref = cedar::op_reference;

constexpr double linear_bound = 1.0 / 65536;
constexpr double composed_bound = 1.0 / 256;

/// Runs fn with the default thresholds ("decode") and with every threshold 0 ("prefill").
void both_paths(const std::function<void(const char*)>& fn) {
  const fast::tuning saved = fast::tuning_now();
  fn("decode");
  fast::tuning_now() = {0, 0, 0, 0};
  fn("prefill");
  fast::tuning_now() = saved;
}

/// s[r, n] = sum_k |x[r, k] w[n, k]| with x fake-quantized to FP8 first when quant.
std::vector<double> abs_products(const std::vector<float>& x, int m, int k, const std::vector<float>& w, int n,
                                 bool quant) {
  std::vector<double> s(std::size_t(m) * n);
  std::vector<float> xq(k);
  for (int r = 0; r < m; ++r) {
    std::copy(x.begin() + std::size_t(r) * k, x.begin() + std::size_t(r + 1) * k, xq.begin());
    if (quant) fmt::fake_quant_fp8(xq.data(), k);
    for (int c = 0; c < n; ++c) {
      double acc = 0;
      for (int i = 0; i < k; ++i) acc += std::fabs(double(xq[i]) * w[std::size_t(c) * k + i]);
      s[std::size_t(r) * n + c] = acc;
    }
  }
  return s;
}

/// A random FP8 and a random W4A8 weight [n, k], on the host and on the device.
struct weight_pair {
  ref::owned_fp8 w8;
  ref::owned_fp4 w4;
  dev_fp8 d8;
  dev_fp4 d4;
  weight_pair(std::mt19937_64& rng, int n, int k)
      : w8(ref::random_fp8(rng, n, k)), w4(ref::random_fp4(rng, n, k)), d8(w8), d4(w4) {}
};

/// Random routed experts (FP4; expert 3 held by another shard: no weights) and a shared expert
/// (FP8), on the host and on the device.
struct random_experts {
  std::vector<ref::owned_fp4> host_w;
  std::vector<std::unique_ptr<dev_fp4>> dev_w;
  std::vector<cpu::expert_weights> cpu_e, gpu_e;
  ref::owned_fp8 s1, s3, s2;
  dev_fp8 g1, g3, g2;
  cpu::shared_expert_weights shared, gshared;
  random_experts(std::mt19937_64& rng, int d, int inter, int num_experts)
      : cpu_e(num_experts),
        gpu_e(num_experts),
        s1(ref::random_fp8(rng, inter, d)),
        s3(ref::random_fp8(rng, inter, d)),
        s2(ref::random_fp8(rng, d, inter)),
        g1(s1),
        g3(s3),
        g2(s2),
        shared{s1.view, s3.view, s2.view},
        gshared{g1.view, g3.view, g2.view} {
    for (int e = 0; e < num_experts; ++e) {
      if (e == missing) continue;  // adds nothing
      for (auto [out, in] : {std::pair{inter, d}, {inter, d}, {d, inter}}) host_w.push_back(ref::random_fp4(rng, out, in));
    }
    for (auto& w : host_w) w.view = fp4_weight{w.view.out, w.view.in, w.data.data(), w.scale.data()};
    for (auto& w : host_w) dev_w.push_back(std::make_unique<dev_fp4>(w));
    for (int e = 0, i = 0; e < num_experts; ++e) {
      if (e == missing) continue;
      cpu_e[e] = {host_w[i].view, host_w[i + 1].view, host_w[i + 2].view};
      gpu_e[e] = {dev_w[i]->view, dev_w[i + 1]->view, dev_w[i + 2]->view};
      i += 3;
    }
  }
  static constexpr int missing = 3;
};

}  // namespace

TEST_CASE("fast linears: FP8, W4A8 and bf16 within 2^-16 of sum|xw| of the CPU op, decode and prefill paths") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(61);
  struct shape {
    int n, k;
  };
  // real tile shapes, the small presets' shapes (n % 16, k % 32 only) and, for bf16, a k that
  // the GEMV cannot take (k % 8 != 0: the split path at every m)
  for (const shape s : {shape{384, 1024}, shape{64, 256}, shape{256, 96}}) {
    const auto w8 = ref::random_fp8(rng, s.n, s.k);
    const auto w4 = ref::random_fp4(rng, s.n, s.k);
    const dev_fp8 d8(w8);
    const dev_fp4 d4(w4);
    const auto wd8 = ref::dequant(w8.view), wd4 = ref::dequant(w4.view);
    for (int m : {1, 5, 16, 64, 130}) {
      const std::vector<float> x = activations(rng, m, s.k);
      dev<float> xd(x);
      for (bool fp4 : {false, true}) {
        std::vector<float> ref_y(std::size_t(m) * s.n);
        if (fp4) cpu::linear_fp4(x.data(), m, w4.view, ref_y.data());
        else cpu::linear_fp8(x.data(), m, w8.view, ref_y.data());
        const auto sabs = abs_products(x, m, s.k, fp4 ? wd4 : wd8, s.n, true);
        both_paths([&](const char* path) {
          dev<float> y(std::size_t(m) * s.n);
          if (fp4) fast::linear_fp4(xd.get(), m, d4.view, y.get());
          else fast::linear_fp8(xd.get(), m, d8.view, y.get());
          const auto got = y.host();
          check_bound(std::string(fp4 ? "linear_fp4 " : "linear_fp8 ") + path + " " + std::to_string(s.n) + "x" +
                          std::to_string(s.k) + " m=" + std::to_string(m),
                      got, ref_y, sabs, linear_bound);
          if (std::string(path) == "decode" && m > 1 && m <= fast::tuning_now().gemv_max_rows) {
            // batch invariance: the last row alone gives the same bits
            dev<float> y1(s.n);
            if (fp4) fast::linear_fp4(xd.get() + std::size_t(m - 1) * s.k, 1, d4.view, y1.get());
            else fast::linear_fp8(xd.get() + std::size_t(m - 1) * s.k, 1, d8.view, y1.get());
            CHECK(ref::same_bits(y1.host().data(), got.data() + std::size_t(m - 1) * s.n, s.n));
          }
          if (!fp4 && m > fast::tuning_now().gemv_max_rows) {
            // a bf16 copy kept with the weight (fp8_weight::bf16) gives the same bits
            dev<uint16_t> kept(std::size_t(s.n) * s.k);
            fast::detail::dequant_bf16(d8.view, kept.get());
            fp8_weight with = d8.view;
            with.bf16 = kept.get();
            dev<float> y2(std::size_t(m) * s.n);
            fast::linear_fp8(xd.get(), m, with, y2.get());
            CHECK_MESSAGE(ref::same_bits(y2.host().data(), got.data(), got.size()),
                          (std::string("linear_fp8 with a kept bf16 copy m=") + std::to_string(m)));
          }
        });
      }
    }
  }
  // column GEMV mode (1,100 columns: a last block of 12), split mode (1,000: 125 column blocks)
  for (const shape s : {shape{2048, 264}, shape{1100, 264}, shape{1000, 264}, shape{128, 260}}) {
    const auto wb = ref::random_bf16(rng, s.n, s.k, 0.1f);
    const dev_bf16 db(wb);
    const auto wd = ref::dequant(wb.view);
    for (int m : {1, 2, 3, 8, 11, 16, 17, 100}) {
      const std::vector<float> x = activations(rng, m, s.k);
      dev<float> xd(x);
      std::vector<float> ref_y(std::size_t(m) * s.n);
      cpu::linear_bf16(x.data(), m, wb.view, ref_y.data());
      const auto sabs = abs_products(x, m, s.k, wd, s.n, false);
      both_paths([&](const char* path) {
        dev<float> y(std::size_t(m) * s.n);
        fast::linear_bf16(xd.get(), m, db.view, y.get());
        const auto got = y.host();
        check_bound(std::string("linear_bf16 ") + path + " " + std::to_string(s.n) + "x" + std::to_string(s.k) +
                        " m=" + std::to_string(m),
                    got, ref_y, sabs, linear_bound);
        if (std::string(path) == "decode" && m > 1 && m <= fast::tuning_now().bf16_gemv_max_rows && s.k % 8 == 0) {
          dev<float> y1(s.n);
          fast::linear_bf16(xd.get() + std::size_t(m - 1) * s.k, 1, db.view, y1.get());
          CHECK(ref::same_bits(y1.host().data(), got.data() + std::size_t(m - 1) * s.n, s.n));
        }
      });
    }
  }
}

TEST_CASE("fast linears past the gemv rows: the narrow32 tile for large weights, bounded and batch-invariant") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(64);
  const int n = 384, k = 1024;
  const weight_pair w(rng, n, k);
  const fast::tuning saved = fast::tuning_now();
  fast::tuning_now().fp8_narrow_min_weight = 0;  // this small weight takes the tile too
  for (int m : {40, 64}) {
    REQUIRE(m > fast::tuning_now().gemv_max_rows);
    REQUIRE(m <= fast::tuning_now().fp8_narrow_max_rows);
    const std::vector<float> x = activations(rng, m, k);
    dev<float> xd(x);
    for (bool fp4 : {false, true}) {
      std::vector<float> ref_y(std::size_t(m) * n);
      if (fp4) cpu::linear_fp4(x.data(), m, w.w4.view, ref_y.data());
      else cpu::linear_fp8(x.data(), m, w.w8.view, ref_y.data());
      const auto sabs = abs_products(x, m, k, fp4 ? ref::dequant(w.w4.view) : ref::dequant(w.w8.view), n, true);
      dev<float> y(std::size_t(m) * n), y1(n);
      if (fp4) fast::linear_fp4(xd.get(), m, w.d4.view, y.get());
      else fast::linear_fp8(xd.get(), m, w.d8.view, y.get());
      const auto got = y.host();
      check_bound(std::string(fp4 ? "linear_fp4" : "linear_fp8") + " narrow32 m=" + std::to_string(m), got, ref_y, sabs,
                  linear_bound);
      // the last row alone (the gemv tile) gives the same bits
      if (fp4) fast::linear_fp4(xd.get() + std::size_t(m - 1) * k, 1, w.d4.view, y1.get());
      else fast::linear_fp8(xd.get() + std::size_t(m - 1) * k, 1, w.d8.view, y1.get());
      CHECK(ref::same_bits(y1.host().data(), got.data() + std::size_t(m - 1) * n, n));
    }
  }
  fast::tuning_now() = saved;
}

TEST_CASE("fast linears at up to 8 rows: a short-K weight of many rows takes the stream tile, batch-invariant") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(65);
  const int n = 384, k = 1024;
  const weight_pair w(rng, n, k);
  const fast::tuning saved = fast::tuning_now();
  fast::tuning_now().stream_min_out = n;  // this small weight qualifies
  const auto wd = ref::dequant(w.w8.view);
  for (int m : {1, 3, 8}) {
    const std::vector<float> x = activations(rng, m, k);
    dev<float> xd(x);
    std::vector<float> ref_y(std::size_t(m) * n);
    cpu::linear_fp8(x.data(), m, w.w8.view, ref_y.data());
    dev<float> y(std::size_t(m) * n), by_tile(std::size_t(m) * n), y1(n);
    fast::linear_fp8(xd.get(), m, w.d8.view, y.get());
    const auto got = y.host();
    const std::string what = "linear_fp8 stream m=" + std::to_string(m);
    check_bound(what, got, ref_y, abs_products(x, m, k, wd, n, true), linear_bound);
    // the tile the op took is the stream tile: its bits
    dev<uint8_t> xq(std::size_t(m) * k);
    dev<float> xs(std::size_t(m) * (k / 32));
    fast::quantize_rows_fp8(xd.get(), m, k, xq.get(), xs.get());
    fast::gemm_fp8(xq.get(), xs.get(), m, w.d8.view, by_tile.get(), fast::tile_kind::stream);
    CHECK_MESSAGE(ref::same_bits(by_tile.host().data(), got.data(), got.size()), (what + " vs the stream tile"));
    // the last row alone gives the same bits
    fast::linear_fp8(xd.get() + std::size_t(m - 1) * k, 1, w.d8.view, y1.get());
    CHECK_MESSAGE(ref::same_bits(y1.host().data(), got.data() + std::size_t(m - 1) * n, n), (what + " last row alone"));
  }
  fast::tuning_now() = saved;
}

TEST_CASE("fast linears at up to 8 rows: wide weights through the narrow tile give the gemv tile's bits") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(65);
  const int n = 384, k = 1024;
  const weight_pair w(rng, n, k);
  REQUIRE(n < fast::tuning_now().dense_stream_min_out);  // the default: the gemv tile
  for (int m : {1, 5, 8}) {
    const std::vector<float> x = activations(rng, m, k);
    dev<float> xd(x);
    for (bool fp4 : {false, true}) {
      dev<float> by_gemv(std::size_t(m) * n), by_narrow(std::size_t(m) * n);
      const auto run = [&](float* y) {
        if (fp4) fast::linear_fp4(xd.get(), m, w.d4.view, y);
        else fast::linear_fp8(xd.get(), m, w.d8.view, y);
      };
      run(by_gemv.get());
      const fast::tuning saved = fast::tuning_now();
      fast::tuning_now().dense_stream_min_out = 64;  // this weight takes the narrow tile
      run(by_narrow.get());
      fast::tuning_now() = saved;
      const std::string what = std::string(fp4 ? "linear_fp4" : "linear_fp8") + " narrow = gemv, m=" + std::to_string(m);
      CHECK_MESSAGE(ref::same_bits(by_narrow.host().data(), by_gemv.host().data(), std::size_t(m) * n), what);
    }
  }
}

TEST_CASE("fast grouped_output: within 2^-8 of the CPU op's largest output, decode and prefill paths") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(62);
  const int groups = 4, group_in = 512, rank = 128, out_dim = 384;
  const auto wo_a = ref::random_bf16(rng, groups * rank, group_in, 0.05f);
  const auto wo_b = ref::random_fp8(rng, out_dim, groups * rank);
  const dev_bf16 da(wo_a);
  const dev_fp8 db(wo_b);
  for (int m : {1, 7, 80}) {
    const auto o = activations(rng, m, groups * group_in);
    dev<float> dq(o);
    std::vector<float> ref_y(std::size_t(m) * out_dim);
    cpu::grouped_output(o.data(), m, groups, wo_a.view, wo_b.view, ref_y.data());
    both_paths([&](const char* path) {
      dev<float> y(ref_y.size());
      fast::grouped_output(dq.get(), m, groups, da.view, db.view, y.get());
      check_close(std::string("grouped_output ") + path + " m=" + std::to_string(m), y.host().data(), ref_y.data(),
                  ref_y.size(), composed_bound);
    });
  }
}

TEST_CASE("fast grouped_output: wo_a in its FP8 form gives the bf16 form's bits at few rows") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(64);
  // 256 column blocks of 8: the GEMV's column mode (the model's wo_a, 8 x 1024 x 4096, too)
  const int groups = 4, group_in = 512, rank = 512, out_dim = 384;
  const auto a8 = ref::random_fp8(rng, groups * rank, group_in);
  REQUIRE(std::all_of(a8.scale.begin(), a8.scale.end(), [](uint8_t c) { return c >= 3 && c <= 254; }));
  ref::owned_bf16 a16;  // the same values as bf16, as the model dequantizes wo_a at load
  const std::vector<float> values = ref::dequant(a8.view);
  for (const float v : values) a16.data.push_back(fmt::f32_to_bf16(v));
  a16.view = bf16_weight{groups * rank, group_in, a16.data.data()};
  std::size_t inexact = 0;
  for (std::size_t i = 0; i < values.size(); ++i) inexact += fmt::bf16_to_f32(a16.data[i]) != values[i];
  REQUIRE(inexact == 0);
  const auto wo_b = ref::random_fp8(rng, out_dim, groups * rank);
  const dev_fp8 d8(a8), db(wo_b);
  const dev_bf16 d16(a16);
  for (int m : {1, 2, 3, 8, 13, 16}) {
    const auto o = activations(rng, m, groups * group_in);
    dev<float> dq(o);
    dev<float> u16(std::size_t(m) * groups * rank), u8(std::size_t(m) * groups * rank);
    REQUIRE(fast::detail::gemv_bf16(dq.get(), groups * group_in, m, d16.view.data, rank, group_in, u16.get(),
                                    groups * rank, groups, group_in, (long long)rank * group_in, rank));
    REQUIRE(fast::detail::gemv_fp8w(dq.get(), groups * group_in, m, d8.view, rank, group_in, u8.get(), groups * rank,
                                    groups, group_in, rank));
    const auto h16 = u16.host(), h8 = u8.host();
    CHECK_MESSAGE(ref::same_bits(h8.data(), h16.data(), h16.size()), ("gemv_fp8w m=" + std::to_string(m)));
    // one row: every column mode (columns a warp, pieces in flight) gives the same bits
    if (m == 1) {
      const fast::tuning saved = fast::tuning_now();
      for (const auto [cols, unroll] : {std::pair{1, 2}, {2, 2}, {2, 4}, {4, 2}, {4, 4}}) {
        fast::tuning_now().gemv_one_row_cols = cols, fast::tuning_now().gemv_one_row_unroll = unroll;
        dev<float> c8(std::size_t(groups) * rank), c16(std::size_t(groups) * rank);
        REQUIRE(fast::detail::gemv_fp8w(dq.get(), groups * group_in, 1, d8.view, rank, group_in, c8.get(),
                                        groups * rank, groups, group_in, rank));
        REQUIRE(fast::detail::gemv_bf16(dq.get(), groups * group_in, 1, d16.view.data, rank, group_in, c16.get(),
                                        groups * rank, groups, group_in, (long long)rank * group_in, rank));
        const std::string form = std::to_string(cols) + "x" + std::to_string(unroll);
        CHECK_MESSAGE(ref::same_bits(c8.host().data(), h8.data(), h8.size()), ("gemv_fp8w one row, cols " + form));
        CHECK_MESSAGE(ref::same_bits(c16.host().data(), h16.data(), h16.size()), ("gemv_bf16 one row, cols " + form));
      }
      fast::tuning_now() = saved;
    }
    // every row alone (one row: the plain column mode; more: x staged, several columns a warp)
    // gives the bits it has among m
    for (int r = 0; r < m && m > 1; ++r) {
      dev<float> u1(std::size_t(groups) * rank);
      REQUIRE(fast::detail::gemv_fp8w(dq.get() + std::size_t(r) * groups * group_in, groups * group_in, 1, d8.view,
                                      rank, group_in, u1.get(), groups * rank, groups, group_in, rank));
      CHECK_MESSAGE(ref::same_bits(u1.host().data(), h8.data() + std::size_t(r) * groups * rank, groups * rank),
                    ("gemv_fp8w row " + std::to_string(r) + " of m=" + std::to_string(m)));
    }
    dev<float> y16(std::size_t(m) * out_dim), y8(std::size_t(m) * out_dim);
    fast::grouped_output(dq.get(), m, groups, d16.view, db.view, y16.get());
    fast::grouped_output(dq.get(), m, groups, d16.view, db.view, y8.get(), &d8.view);
    CHECK_MESSAGE(ref::same_bits(y8.host().data(), y16.host().data(), std::size_t(m) * out_dim),
                  ("grouped_output with wo_a8 m=" + std::to_string(m)));
  }
}

TEST_CASE("fast moe_ffn: within 2^-8 of the CPU op's largest output, device grouping, decode and prefill paths") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(63);
  // (d and inter multiples of 256: the skinny tile and the wgmma experts apply; d = 512: their
  // products over K = d take more steps than the wgmma kernel's pipeline has slots)
  const int d = 512, inter = 256, num_experts = 16, topk = 4;
  const random_experts ex(rng, d, inter, num_experts);
  const auto &cpu_e = ex.cpu_e, &gpu_e = ex.gpu_e;
  const cpu::shared_expert_weights &shared = ex.shared, &gshared = ex.gshared;
  // on the "decode" thresholds m = 20 and 150 run the grouped narrow16 tile, 200 narrow32 (and
  // m = 1 narrow); the "prefill" ones run the bf16 path: on sm_90a the wgmma experts (their own
  // test: fast_experts_test.cpp), and the cuBLAS products per expert; the defaults take the
  // wgmma experts from 129 tokens on (sm_90a) and the grouped tiles below
  for (int m : {1, 2, 20, 150, 200}) {
    const auto y = activations(rng, m, d);
    std::vector<int32_t> sel;
    std::vector<float> wts;
    random_routing(rng, m, topk, num_experts, sel, wts);
    dev<float> dy(y), dw(wts);
    dev<int32_t> ds(sel);
    std::vector<float> ref_y(std::size_t(m) * d);
    cpu::moe_ffn(y.data(), m, d, sel.data(), wts.data(), topk, cpu_e.data(), num_experts, &shared, 10.0f, ref_y.data());
    const auto run = [&](const char* path) {
      dev<float> out(ref_y.size());
      fast::moe_ffn(dy.get(), m, d, ds.get(), dw.get(), topk, gpu_e.data(), num_experts, &gshared, 10.0f, out.get());
      const auto got = out.host();
      check_close(std::string("moe_ffn ") + path + " m=" + std::to_string(m), got.data(), ref_y.data(), ref_y.size(),
                  composed_bound);
      // (the shared expert's linears take their own threshold)
      if (std::string(path) == "decode" && m > 1 && m <= fast::tuning_now().expert_gemv_max_rows &&
          m <= fast::tuning_now().gemv_max_rows) {
        dev<float> o1(d);
        fast::moe_ffn(dy.get() + std::size_t(m - 1) * d, 1, d, ds.get() + std::size_t(m - 1) * topk,
                      dw.get() + std::size_t(m - 1) * topk, topk, gpu_e.data(), num_experts, &gshared, 10.0f, o1.get());
        CHECK(ref::same_bits(o1.host().data(), got.data() + std::size_t(m - 1) * d, d));
      }
    };
    // the default thresholds, then without the wgmma experts (the grouped tiles at every m
    // here), then the bf16 path: the wgmma experts, and the cuBLAS products per expert
    const fast::tuning saved = fast::tuning_now();
    run("default");
    fast::tuning_now().expert_wgmma = false;
    run("decode");
    if (m <= 2) {  // the stream tile where rows need not be batch-invariant
      fast::tuning_now().expert_stream_max_rows = 2;
      run("stream");
      fast::tuning_now().expert_stream_max_rows = saved.expert_stream_max_rows;
    }
    fast::tuning_now() = {0, 0, 0, 0};
    run("prefill");
    fast::tuning_now().expert_wgmma = false;
    run("prefill, cuBLAS per expert");
    fast::tuning_now() = saved;
  }
}

TEST_CASE("fast moe_route's expert plan: moe_ffn gives the bits of its own grouping, the picks unchanged") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(65);
  const int d = 512, inter = 512, num_experts = 16, topk = 4;
  const random_experts ex(rng, d, inter, num_experts);  // expert 3 held elsewhere (no weights)
  const auto gate = ref::random_bf16(rng, num_experts, d, 0.1f);
  auto bias = ref::random_floats(rng, num_experts, -0.05f, 0.05f);
  bias[3] = 100.0f;  // every row picks the expert without weights: its slots go nowhere
  const dev_bf16 dgate(gate);
  dev<float> dbias(bias);
  fast::tuning& tune = fast::tuning_now();
  const fast::tuning saved = tune;
  for (int m : {1, 2, 5, 8, 9}) {  // 9: more rows than the router's one block (no plan)
    INFO("m = " << m);
    const auto y = activations(rng, m, d);
    dev<float> dy(y);
    struct result {
      bool made = false;
      std::vector<int32_t> sel;
      std::vector<float> weights, out;
    };
    const auto run = [&](bool in_route) {
      tune.expert_plan_in_route = in_route;
      dev<int32_t> ds(std::size_t(m) * topk);
      dev<float> dw(std::size_t(m) * topk), out(std::size_t(m) * d);
      dev<uint8_t> buffer(fast::expert_plan_bytes(m, topk, num_experts));
      fast::expert_plan plan;
      plan.experts = ex.gpu_e.data(), plan.num_experts = num_experts, plan.buffer = buffer.get();
      fast::moe_route(dy.get(), m, dgate.view, dbias.get(), topk, 1.5f, ds.get(), dw.get(), &plan);
      result r;
      r.made = plan.rows == m;
      fast::moe_ffn(dy.get(), m, d, ds.get(), dw.get(), topk, ex.gpu_e.data(), num_experts, &ex.gshared, 10.0f,
                    out.get(), true, nullptr, nullptr, &plan);
      tune = saved;
      r.sel = ds.host(), r.weights = dw.host(), r.out = out.host();
      return r;
    };
    const result apart = run(false), planned = run(true);
    CHECK_FALSE(apart.made);
    CHECK(planned.made == (m <= 8));
    CHECK(planned.sel == apart.sel);
    CHECK(std::count(apart.sel.begin(), apart.sel.end(), 3) == m);
    CHECK(ref::same_bits(planned.weights.data(), apart.weights.data(), apart.weights.size()));
    CHECK(ref::same_bits(planned.out.data(), apart.out.data(), apart.out.size()));
    CHECK(std::any_of(planned.out.begin(), planned.out.end(), [](float v) { return v != 0.0f; }));
  }
}

TEST_CASE("fast moe_ffn: SwiGLU in the w1 | w3 tile gives the bits of its own launch, one wave and several") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(64);
  // inter 2048: 64 blocks an expert, so that 96 tokens (3 passes of 8 slots on 16 experts) need
  // more blocks than the device holds at once (the narrow tile's 4-warp form) and 1 token fewer
  const int d = 512, inter = 2048, num_experts = 16, topk = 4;
  const random_experts ex(rng, d, inter, num_experts);
  fast::tuning& tune = fast::tuning_now();
  const fast::tuning saved = tune;
  for (int m : {1, 2, 5, 8, 40, 96}) {
    const auto y = activations(rng, m, d);
    std::vector<int32_t> sel;
    std::vector<float> wts;
    random_routing(rng, m, topk, num_experts, sel, wts);
    dev<float> dy(y), dw(wts);
    dev<int32_t> ds(sel);
    const auto run = [&](bool in_tile) {
      tune.expert_swiglu_in_tile = in_tile;
      dev<float> out(std::size_t(m) * d);
      fast::moe_ffn(dy.get(), m, d, ds.get(), dw.get(), topk, ex.gpu_e.data(), num_experts, &ex.gshared, 10.0f,
                    out.get());
      tune = saved;
      return out.host();
    };
    const auto apart = run(false), fused = run(true);
    INFO("m = " << m);
    CHECK(ref::same_bits(fused.data(), apart.data(), apart.size()));
    // and the values are the experts' at all: not every output zero
    CHECK(std::any_of(fused.begin(), fused.end(), [](float v) { return v != 0.0f; }));
  }
}
