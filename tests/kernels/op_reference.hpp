// Test support for the CPU ops: random weights in the checkpoint formats (owning buffers with
// a view), their dense dequantized form, and a slow dense GEMM in double used as the
// obviously-correct reference. Header-only; shared by tests/kernels/*_test.cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/formats.hpp"
#include "kernels/weights.hpp"

namespace cedar::op_reference {

inline std::vector<float> random_floats(std::mt19937_64& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

/// A UE8M0 code for a scale of about 2^-10..2^-6, so random weights stay in a sane range.
inline uint8_t random_scale_code(std::mt19937_64& rng) {
  return static_cast<uint8_t>(117 + rng() % 5);
}

struct owned_fp8 {
  std::vector<uint8_t> data, scale;
  fp8_weight view;
};
inline owned_fp8 random_fp8(std::mt19937_64& rng, int out, int in) {
  owned_fp8 w;
  w.data.resize(static_cast<size_t>(out) * in);
  for (uint8_t& c : w.data) {
    do c = static_cast<uint8_t>(rng()); while ((c & 0x7F) == 0x7F);  // never NaN
  }
  w.scale.resize(static_cast<size_t>((out + 31) / 32) * ((in + 31) / 32));
  for (uint8_t& c : w.scale) c = random_scale_code(rng);
  w.view = fp8_weight{out, in, w.data.data(), w.scale.data()};
  return w;
}
inline std::vector<float> dequant(const fp8_weight& w) {
  std::vector<float> d(static_cast<size_t>(w.out) * w.in);
  const int sc = (w.in + 31) / 32;
  for (int n = 0; n < w.out; ++n)
    for (int k = 0; k < w.in; ++k)
      d[static_cast<size_t>(n) * w.in + k] =
          fmt::e4m3_to_f32(w.data[static_cast<size_t>(n) * w.in + k]) *
          fmt::ue8m0_to_f32(w.scale[(n / 32) * sc + k / 32]);
  return d;
}

struct owned_fp4 {
  std::vector<uint8_t> data, scale;
  fp4_weight view;
};
inline owned_fp4 random_fp4(std::mt19937_64& rng, int out, int in) {
  owned_fp4 w;
  w.data.resize(static_cast<size_t>(out) * in / 2);
  for (uint8_t& c : w.data) c = static_cast<uint8_t>(rng());
  w.scale.resize(static_cast<size_t>(out) * (in / 32));
  for (uint8_t& c : w.scale) c = static_cast<uint8_t>(random_scale_code(rng) + 3);
  w.view = fp4_weight{out, in, w.data.data(), w.scale.data()};
  return w;
}
inline std::vector<float> dequant(const fp4_weight& w) {
  std::vector<float> d(static_cast<size_t>(w.out) * w.in);
  for (int n = 0; n < w.out; ++n)
    for (int k = 0; k < w.in; ++k) {
      const uint8_t byte = w.data[(static_cast<size_t>(n) * w.in + k) / 2];
      const uint8_t code = k % 2 == 0 ? (byte & 0x0F) : (byte >> 4);
      d[static_cast<size_t>(n) * w.in + k] =
          fmt::e2m1_to_f32(code) * fmt::ue8m0_to_f32(w.scale[static_cast<size_t>(n) * (w.in / 32) + k / 32]);
    }
  return d;
}

struct owned_bf16 {
  std::vector<uint16_t> data;
  bf16_weight view;
};
inline owned_bf16 random_bf16(std::mt19937_64& rng, int out, int in, float amp) {
  owned_bf16 w;
  w.data.resize(static_cast<size_t>(out) * in);
  std::uniform_real_distribution<float> dist(-amp, amp);
  for (uint16_t& b : w.data) b = fmt::f32_to_bf16(dist(rng));
  w.view = bf16_weight{out, in, w.data.data()};
  return w;
}
inline std::vector<float> dequant(const bf16_weight& w) {
  std::vector<float> d(static_cast<size_t>(w.out) * w.in);
  for (size_t i = 0; i < d.size(); ++i) d[i] = fmt::bf16_to_f32(w.data[i]);
  return d;
}

/// y = W x in double for m rows; W dense [out, in]. With fp8_act, each row of x is first
/// FP8-fake-quantized per 32 (the rule every FP8/FP4 GEMM applies to its input).
inline std::vector<double> dense_linear(const float* x, int m, const std::vector<float>& w,
                                        int out, int in, bool fp8_act) {
  std::vector<double> y(static_cast<size_t>(m) * out);
  std::vector<float> row(in);
  for (int r = 0; r < m; ++r) {
    std::memcpy(row.data(), x + static_cast<size_t>(r) * in, sizeof(float) * in);
    if (fp8_act) fmt::fake_quant_fp8(row.data(), in);
    for (int n = 0; n < out; ++n) {
      double s = 0;
      for (int k = 0; k < in; ++k) s += double(w[static_cast<size_t>(n) * in + k]) * row[k];
      y[static_cast<size_t>(r) * out + n] = s;
    }
  }
  return y;
}

/// ||a - b|| / ||b|| over n values.
template <class A, class B>
double rel_error(const A* a, const B* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

inline bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

}  // namespace cedar::op_reference
