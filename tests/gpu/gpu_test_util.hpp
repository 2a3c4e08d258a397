// Support for the GPU op tests: device buffers (poisoned on allocation), device copies of the
// random weights of tests/kernels/op_reference.hpp, and the GPU-vs-CPU comparison that prints
// one line per op (max error relative to the largest reference value, the bound, and the share
// of bit-identical outputs).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/formats.hpp"
#include "tests/kernels/op_reference.hpp"

namespace cedar::gpu_test {

/// True when a device is present; otherwise prints why once and the test returns early.
inline bool have_gpu() {
  static const bool ok = [] {
    const bool a = cuda::available();
    if (!a) std::printf("GPU tests skipped: %s\n", cuda::status().c_str());
    else std::printf("GPU: %s\n", cuda::status().c_str());
    return a;
  }();
  return ok;
}

/// n T's on the device, every byte 0xFF first (NaN floats, -1 integers).
template <class T>
class dev {
 public:
  explicit dev(std::size_t n) : n_(n) {
    p_ = static_cast<T*>(cuda::device_alloc(n * sizeof(T)));
    cuda::fill_bytes(p_, 0xFF, n * sizeof(T));
  }
  explicit dev(const std::vector<T>& v) : dev(v.size()) { cuda::copy_to_device(p_, v.data(), v.size() * sizeof(T)); }
  ~dev() { cuda::device_free(p_); }
  dev(const dev&) = delete;
  dev& operator=(const dev&) = delete;
  T* get() const { return p_; }
  std::vector<T> host() const {
    std::vector<T> v(n_);
    cuda::copy_to_host(v.data(), p_, n_ * sizeof(T));
    return v;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

struct dev_fp8 {
  dev<uint8_t> data, scale;
  fp8_weight view;
  explicit dev_fp8(const op_reference::owned_fp8& w)
      : data(w.data), scale(w.scale), view{w.view.out, w.view.in, data.get(), scale.get()} {}
};
struct dev_fp4 {
  dev<uint8_t> data, scale;
  fp4_weight view;
  explicit dev_fp4(const op_reference::owned_fp4& w)
      : data(w.data), scale(w.scale), view{w.view.out, w.view.in, data.get(), scale.get()} {}
};
struct dev_bf16 {
  dev<uint16_t> data;
  bf16_weight view;
  explicit dev_bf16(const op_reference::owned_bf16& w) : data(w.data), view{w.view.out, w.view.in, data.get()} {}
};

/// Every |gpu - cpu| <= bound * sabs (sabs: sum_k |x_k w_k| of the output; NaN fails); prints
/// "what  worst ratio  bound  identical%".
inline void check_bound(const std::string& what, const std::vector<float>& gpu, const std::vector<float>& cpu,
                        const std::vector<double>& sabs, double bound) {
  double worst = 0;
  std::size_t same = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    const double d = std::fabs(double(gpu[i]) - cpu[i]);
    const double ratio = sabs[i] > 0 ? d / sabs[i] : (d == 0 ? 0 : INFINITY);
    worst = std::isnan(ratio) ? INFINITY : std::max(worst, ratio);
    same += std::memcmp(&gpu[i], &cpu[i], 4) == 0;
  }
  std::printf("  %-40s err/sum|xw| %.2e  bound %.1e  identical %6.2f%%\n", what.c_str(), worst, bound,
              gpu.empty() ? 100.0 : 100.0 * double(same) / double(gpu.size()));
  CHECK_MESSAGE(worst <= bound, what);
}

/// max |gpu - cpu| / max |cpu| over n values (NaN anywhere counts as infinite error); prints
/// "op  error  bound  identical%" and checks error <= bound.
inline void check_close(const std::string& op, const float* gpu, const float* cpu, std::size_t n,
                        double bound) {
  double max_ref = 0, max_err = 0;
  std::size_t same = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isfinite(cpu[i])) max_ref = std::max(max_ref, std::fabs(double(cpu[i])));
    const bool both_inf = std::isinf(cpu[i]) && gpu[i] == cpu[i];
    if (std::memcmp(&gpu[i], &cpu[i], 4) == 0) ++same;
    else if (!both_inf) max_err = std::max(max_err, std::isfinite(gpu[i]) ? std::fabs(double(gpu[i]) - cpu[i]) : INFINITY);
  }
  const double rel = max_err / std::max(max_ref, 1e-30);
  std::printf("  %-34s rel err %.3e  bound %.0e  identical %6.2f%%  (%zu values)\n", op.c_str(), rel,
              bound, n ? 100.0 * double(same) / double(n) : 100.0, n);
  CHECK_MESSAGE(rel <= bound, op);
}

template <class T>
inline void check_equal(const std::string& op, const std::vector<T>& gpu, const std::vector<T>& cpu) {
  REQUIRE(gpu.size() == cpu.size());
  std::size_t same = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i) same += gpu[i] == cpu[i];
  std::printf("  %-34s exact   identical %6.2f%%  (%zu values)\n", op.c_str(),
              gpu.empty() ? 100.0 : 100.0 * double(same) / double(gpu.size()), gpu.size());
  CHECK_MESSAGE(same == gpu.size(), op);
}

/// Activations with groups of very different magnitude (distinct per-32 scales).
inline std::vector<float> activations(std::mt19937_64& rng, int m, int in) {
  auto x = op_reference::random_floats(rng, std::size_t(m) * in, -2.0f, 2.0f);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] *= std::ldexp(1.0f, int(i / 32 % 7) - 3);
  return x;
}

/// Host inputs of an Engram test: a table of E4M3 codes (no NaN) with scales near 1, wkv, the
/// q / k weights, row ids and a residual already on the bf16 grid.
struct engram_host {
  std::vector<uint8_t> table, tscale;
  op_reference::owned_fp8 wkv;
  std::vector<float> qw, kw;
  std::vector<int64_t> rows;
  std::vector<float> X;
  int64_t table_rows = 0;
  int head_dim = 0;

  engram_host(std::mt19937_64& rng, int m, int hc, int d, int head_dim_, int per, int64_t table_rows_)
      : table(std::size_t(table_rows_) * head_dim_), tscale(std::size_t(table_rows_) * head_dim_ / 32),
        table_rows(table_rows_), head_dim(head_dim_) {
    for (auto& c : table) do c = uint8_t(rng()); while ((c & 0x7F) == 0x7F);
    for (auto& c : tscale) c = uint8_t(120 + rng() % 4);
    wkv = op_reference::random_fp8(rng, (hc + 1) * d, per * head_dim);
    qw = op_reference::random_floats(rng, std::size_t(hc) * d, 0.5f, 1.5f);
    kw = op_reference::random_floats(rng, std::size_t(hc) * d, 0.5f, 1.5f);
    rows.resize(std::size_t(m) * per);
    for (auto& r : rows) r = int64_t(rng() % table_rows);
    X = activations(rng, m, hc * d);
    for (auto& v : X) v = fmt::round_bf16(v);
  }
  cpu::engram_weights weights() const {
    return {table.data(), tscale.data(), table_rows, head_dim, wkv.view, qw.data(), kw.data()};
  }
};

/// The same on the device (X is the device residual the op updates).
struct engram_device {
  dev<uint8_t> table, tscale;
  dev_fp8 wkv;
  dev<float> qw, kw, X;
  dev<int64_t> rows;
  int64_t table_rows;
  int head_dim;
  explicit engram_device(const engram_host& h)
      : table(h.table), tscale(h.tscale), wkv(h.wkv), qw(h.qw), kw(h.kw), X(h.X), rows(h.rows),
        table_rows(h.table_rows), head_dim(h.head_dim) {}
  cpu::engram_weights weights() const {
    return {table.get(), tscale.get(), table_rows, head_dim, wkv.view, qw.get(), kw.get()};
  }
};

/// Routing of m rows: topk distinct experts of num_experts a row (sel [m, topk]) with weights in
/// 0.2 .. 0.9 (w, the same shape).
inline void random_routing(std::mt19937_64& rng, int m, int topk, int num_experts, std::vector<int32_t>& sel,
                           std::vector<float>& w) {
  sel.assign(std::size_t(m) * topk, -1);
  w.assign(sel.size(), 0.0f);
  for (int r = 0; r < m; ++r)
    for (int i = 0; i < topk; ++i) {
      const auto row = sel.begin() + std::ptrdiff_t(r) * topk;
      int e;
      do e = int(rng() % num_experts);
      while (std::find(row, row + i, e) != row + i);
      sel[std::size_t(r) * topk + i] = e;
      w[std::size_t(r) * topk + i] = 0.2f + 0.1f * float(rng() % 8);
    }
}

}  // namespace cedar::gpu_test
