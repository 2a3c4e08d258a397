// Random weights in the checkpoint formats, and their slow full dequantization to fp32, for
// comparing the CPU ops against plain loops. Test-only.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/formats.hpp"
#include "kernels/weights.hpp"

namespace cedar::test {

/// Owns the bytes of a random weight in one of the checkpoint formats.
struct fp8_weight_data {
  std::vector<uint8_t> data, scale;
  fp8_weight view;
};
struct fp4_weight_data {
  std::vector<uint8_t> data, scale;
  fp4_weight view;
};
struct bf16_weight_data {
  std::vector<uint16_t> data;
  bf16_weight view;
};

inline std::vector<float> random_floats(std::size_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  return x;
}

/// E4M3 codes uniform over all non-NaN codes; UE8M0 scales in [2^-8, 2^2].
inline fp8_weight_data random_fp8_weight(int out, int in, std::mt19937& rng) {
  fp8_weight_data w;
  std::uniform_int_distribution<int> byte(0, 255), sc(119, 129);
  w.data.resize(std::size_t(out) * in);
  for (auto& c : w.data) {
    do c = uint8_t(byte(rng)); while ((c & 0x7F) == 0x7F);
  }
  w.scale.resize(std::size_t((out + 31) / 32) * ((in + 31) / 32));
  for (auto& s : w.scale) s = uint8_t(sc(rng));
  w.view = {out, in, w.data.data(), w.scale.data()};
  return w;
}

inline fp4_weight_data random_fp4_weight(int out, int in, std::mt19937& rng) {
  fp4_weight_data w;
  std::uniform_int_distribution<int> byte(0, 255), sc(119, 129);
  w.data.resize(std::size_t(out) * in / 2);
  for (auto& c : w.data) c = uint8_t(byte(rng));
  w.scale.resize(std::size_t(out) * (in / 32));
  for (auto& s : w.scale) s = uint8_t(sc(rng));
  w.view = {out, in, w.data.data(), w.scale.data()};
  return w;
}

inline bf16_weight_data random_bf16_weight(int out, int in, std::mt19937& rng) {
  bf16_weight_data w;
  for (float v : random_floats(std::size_t(out) * in, rng, 0.2f)) w.data.push_back(fmt::f32_to_bf16(v));
  w.view = {out, in, w.data.data()};
  return w;
}

/// W [out, in] in fp32, element by element from the formats' scalar decoders.
inline std::vector<float> dequantize(const fp8_weight& w) {
  std::vector<float> f(std::size_t(w.out) * w.in);
  const int blocks = (w.in + 31) / 32;
  for (int n = 0; n < w.out; ++n)
    for (int k = 0; k < w.in; ++k)
      f[std::size_t(n) * w.in + k] = fmt::e4m3_to_f32(w.data[std::size_t(n) * w.in + k]) *
                                     fmt::ue8m0_to_f32(w.scale[(n / 32) * blocks + k / 32]);
  return f;
}

inline std::vector<float> dequantize(const fp4_weight& w) {
  std::vector<float> f(std::size_t(w.out) * w.in);
  for (int n = 0; n < w.out; ++n)
    for (int k = 0; k < w.in; ++k) {
      const uint8_t byte = w.data[(std::size_t(n) * w.in + k) / 2];
      const uint8_t code = k % 2 == 0 ? (byte & 0xF) : (byte >> 4);
      f[std::size_t(n) * w.in + k] =
          fmt::e2m1_to_f32(code) * fmt::ue8m0_to_f32(w.scale[std::size_t(n) * (w.in / 32) + k / 32]);
    }
  return f;
}

inline std::vector<float> dequantize(const bf16_weight& w) {
  std::vector<float> f(std::size_t(w.out) * w.in);
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = fmt::bf16_to_f32(w.data[i]);
  return f;
}

}  // namespace cedar::test
