// The bf16 GEMV cases of `cedar kernel-lab` (kernel_lab.hpp, `--op gemv` and the one-row cases
// of `--op prefill`): the decode step's bf16 weights and wo_a's FP8 form at 1 to 16 rows, each
// checked (against the CPU op on sampled outputs, the FP8 form against the bf16 form's bits) and
// timed past one row in both the staged and the plain column mode, whose bits must agree.
#ifdef CEDAR_HAVE_CUDA

#include <cmath>
#include <cstring>
#include <memory>

#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/formats.hpp"
#include "tools/cli/kernel_lab.hpp"

namespace cedar::lab {
namespace {

namespace fast = cuda::fast;

/// `c` as another form of the dispatch: `call` once more (under the tuning the caller set),
/// bound to the bits in `want`, then timed.
template <class Call>
void time_form(lab_case c, const char* variant, const std::vector<float>& want, float* y, const Call& call,
               std::vector<lab_case>& out) {
  std::vector<float> got(want.size());
  c.variant = variant;
  cuda::fill_bytes(y, 0xFF, sizeof(float) * want.size());
  call(0);
  cuda::copy_to_host(got.data(), y, sizeof(float) * want.size());
  c.same_bits = std::memcmp(want.data(), got.data(), sizeof(float) * want.size()) == 0;
  c.pass = c.pass && c.same_bits;
  time_case(call, c);
  out.push_back(c);
}

/// Times `call` as variant "gemv" (the dispatch); at m > 1 as "gemv.unstaged" too (the plain
/// column mode, tuning::gemv_staged_min_rows past m), and at one row in the column mode as
/// "gemv.cC" / "gemv.cCxU" (each tuning::gemv_one_row_cols form); the other forms keep the
/// dispatch's bits or fail.
template <class Call>
void time_gemv_forms(lab_case c, float* y, std::size_t outputs, const Call& call, std::vector<lab_case>& out) {
  time_case(call, c);
  out.push_back(c);
  std::vector<float> want(outputs);
  cuda::copy_to_host(want.data(), y, sizeof(float) * outputs);
  fast::tuning& tune = fast::tuning_now();
  const fast::tuning saved = tune;
  if (c.m > 1) {
    tune.gemv_staged_min_rows = c.m + 1;
    time_form(c, "gemv.unstaged", want, y, call, out);
  } else if (c.n >= 8192) {  // (weights of few columns, the router gate and compressor, take the split mode)
    for (const auto [cols, unroll] : {std::pair{1, 2}, {2, 2}, {2, 4}, {4, 2}, {4, 4}}) {
      tune.gemv_one_row_cols = cols, tune.gemv_one_row_unroll = unroll;
      const std::string name = cols == 1 ? "gemv.c1" : "gemv.c" + std::to_string(cols) + "x" + std::to_string(unroll);
      time_form(c, name.c_str(), want, y, call, out);
    }
  }
  tune = saved;
}

/// The bf16 GEMV at m rows against the exact op and the copy rate: |y - y_cpu| <= 2^-16 sum|x w|
/// on 256 sampled outputs. groups > 1: wo_a's grouped form (group g reads x[g k ...]).
void run_bf16_gemv(const char* name, int m, int groups, int n, int k, lab_rng& r, std::vector<lab_case>& out) {
  const std::size_t count = std::size_t(groups) * n * k, outputs = std::size_t(m) * groups * n;
  std::vector<uint16_t> w(count);
  for (std::size_t i = 0; i < count; i += 4) {  // sign, exponent 2^-9 .. 2^-5, 7 mantissa bits
    const uint64_t bits = r.next();
    for (std::size_t j = 0; j < 4 && i + j < count; ++j) {
      const uint32_t b = uint32_t(bits >> (16 * j));
      w[i + j] = uint16_t((b & 0x807F) | ((118 + (b >> 7) % 5) << 7));
    }
  }
  const std::vector<float> x = random_x(m, groups * k, r);
  const int copies = int(std::clamp<std::size_t>(l2_defeat_bytes() / (2 * count) + 1, 1, 16));
  std::vector<std::unique_ptr<dev_buf>> wc;
  for (int i = 0; i < copies; ++i) {
    wc.push_back(std::make_unique<dev_buf>(2 * count));
    cuda::copy_to_device(wc.back()->p, w.data(), 2 * count);
  }
  dev_buf xd(sizeof(float) * x.size()), y(sizeof(float) * outputs);
  cuda::copy_to_device(xd.p, x.data(), sizeof(float) * x.size());
  auto gemv = [&](int i) {
    fast::detail::gemv_bf16(xd.as<float>(), groups * k, m, wc[i % copies]->as<uint16_t>(), n, k, y.as<float>(),
                            groups * n, groups, k, (long long)n * k, n);
  };
  lab_case c{"gemv_bf16", "gemv", name, m, groups * n, k};
  c.groups = groups;
  c.bytes = 2.0 * count + 4.0 * x.size() + 4.0 * outputs;
  c.flops = 2.0 * m * count;
  cuda::fill_bytes(y.p, 0xFF, sizeof(float) * outputs);
  gemv(0);
  std::vector<float> got(outputs);
  cuda::copy_to_host(got.data(), y.p, sizeof(float) * got.size());
  c.checked = true;
  for (int t = 0; t < 256; ++t) {
    const int row = int(r.next() % uint64_t(m));
    const std::size_t col = std::size_t(r.next() % (std::size_t(groups) * n));
    const int g = int(col / n);
    const uint16_t* wr = w.data() + col * k;
    const float* xr = x.data() + std::size_t(row) * groups * k + std::size_t(g) * k;
    float ref = 0;
    double sabs = 0;
    for (int i = 0; i < k; ++i) {
      const float p = fmt::bf16_to_f32(wr[i]) * xr[i];
      ref = ref + p, sabs += std::fabs(double(p));
    }
    const double ratio = sabs > 0 ? std::fabs(double(got[std::size_t(row) * groups * n + col]) - ref) / sabs : 0;
    if (!(ratio <= err_bound)) c.pass = false;
    c.max_err_ratio = std::max(c.max_err_ratio, std::isnan(ratio) ? INFINITY : ratio);
  }
  time_gemv_forms(c, y.as<float>(), outputs, gemv, out);
  if (groups == 1 && m == 1) {
    lab_case b{"gemv_bf16", "baseline", name, 1, n, k};
    b.bytes = c.bytes, b.flops = c.flops;
    time_case([&](int i) {
      cuda::linear_bf16(xd.as<float>(), 1, bf16_weight{n, k, wc[i % copies]->as<uint16_t>()}, y.as<float>());
    }, b);
    out.push_back(b);
  }
}

/// wo_a's FP8 form through the few-row GEMV (fast::detail::gemv_fp8w) at m rows: the bits of the
/// bf16 GEMV on the same values (checked on every output), from half the bytes.
void run_fp8w_gemv(const char* name, int m, int groups, int n, int k, lab_rng& r, std::vector<lab_case>& out) {
  const std::size_t count = std::size_t(groups) * n * k, scales = count / 1024, outputs = std::size_t(m) * groups * n;
  std::vector<uint8_t> codes(count), scale(scales);
  for (std::size_t i = 0; i < count; ++i) {
    uint8_t c = uint8_t(r.next());
    if ((c & 0x7F) == 0x7F) c &= 0xFE;  // no NaN codes
    codes[i] = c;
  }
  for (auto& c : scale) c = uint8_t(112 + r.next() % 8);
  std::vector<uint16_t> w16(count);
  for (std::size_t row = 0; row < std::size_t(groups) * n; ++row)
    for (int i = 0; i < k; ++i)
      w16[row * k + i] = fmt::f32_to_bf16(fmt::e4m3_to_f32(codes[row * k + i]) *
                                          fmt::ue8m0_to_f32(scale[(row / 32) * (k / 32) + i / 32]));
  const std::vector<float> x = random_x(m, groups * k, r);
  const int copies = int(std::clamp<std::size_t>(l2_defeat_bytes() / count + 1, 1, 16));
  std::vector<std::unique_ptr<dev_buf>> wc, sc;
  for (int i = 0; i < copies; ++i) {
    wc.push_back(std::make_unique<dev_buf>(count));
    cuda::copy_to_device(wc.back()->p, codes.data(), count);
    sc.push_back(std::make_unique<dev_buf>(scales));
    cuda::copy_to_device(sc.back()->p, scale.data(), scales);
  }
  dev_buf w16d(2 * count), xd(sizeof(float) * x.size()), y(sizeof(float) * outputs), y16(sizeof(float) * outputs);
  cuda::copy_to_device(w16d.p, w16.data(), 2 * count);
  cuda::copy_to_device(xd.p, x.data(), sizeof(float) * x.size());
  auto gemv = [&](int i) {
    const fp8_weight w{groups * n, k, wc[i % copies]->as<uint8_t>(), sc[i % copies]->as<uint8_t>()};
    fast::detail::gemv_fp8w(xd.as<float>(), groups * k, m, w, n, k, y.as<float>(), groups * n, groups, k, n);
  };
  lab_case c{"gemv_fp8w", "gemv", name, m, groups * n, k};
  c.groups = groups;
  c.bytes = double(count) + double(scales) + 4.0 * x.size() + 4.0 * outputs;
  c.flops = 2.0 * m * count;
  cuda::fill_bytes(y.p, 0xFF, sizeof(float) * outputs);
  gemv(0);
  fast::detail::gemv_bf16(xd.as<float>(), groups * k, m, w16d.as<uint16_t>(), n, k, y16.as<float>(), groups * n,
                          groups, k, (long long)n * k, n);
  std::vector<float> got(outputs), want(outputs);
  cuda::copy_to_host(got.data(), y.p, sizeof(float) * got.size());
  cuda::copy_to_host(want.data(), y16.p, sizeof(float) * want.size());
  c.checked = true;
  c.pass = std::memcmp(got.data(), want.data(), sizeof(float) * got.size()) == 0;
  time_gemv_forms(c, y.as<float>(), outputs, gemv, out);
}

}  // namespace

/// The bf16 GEMV's weights of a decode step at m rows.
void run_gemv_weights(int m, lab_rng& r, std::vector<lab_case>& out) {
  run_bf16_gemv("head", m, 1, 129280, 5120, r, out);
  run_bf16_gemv("attn.wo_a (8 groups)", m, 8, 1024, 4096, r, out);
  run_fp8w_gemv("attn.wo_a FP8 (8 groups)", m, 8, 1024, 4096, r, out);
  run_bf16_gemv("router gate", m, 1, 64, 5120, r, out);
  run_bf16_gemv("compressor wkv", m, 1, 512, 5120, r, out);
}

std::vector<lab_case> run_gemv_cases(int rows) {
  std::vector<lab_case> out;
  lab_rng r{47};
  for (int m : rows > 0 ? std::vector<int>{rows} : std::vector<int>{1, 2, 4, 8, 16}) run_gemv_weights(m, r, out);
  return out;
}

}  // namespace cedar::lab

#endif  // CEDAR_HAVE_CUDA
