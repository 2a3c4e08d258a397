// The number formats against hand-computed bit patterns and against brute-force searches over
// every code (the nearest value, ties to the even code), plus KV record layouts and sizes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/formats.hpp"
#include "kernels/model/kv_layout.hpp"

using namespace cedar;
using namespace cedar::fmt;

namespace {

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

/// The nearest code among `codes` (all non-negative values, one sign), ties to the even code.
template <class Decode>
uint8_t nearest_code(float a, int num_codes, Decode decode) {
  int best = 0;
  double best_err = INFINITY;
  for (int c = 0; c < num_codes; ++c) {
    const double v = decode(uint8_t(c));
    if (std::isnan(v)) continue;
    const double err = std::fabs(double(a) - v);
    if (err < best_err || (err == best_err && c % 2 == 0)) best = c, best_err = err;
  }
  return uint8_t(best);
}

/// Smallest power of two >= v, by doubling (v > 0, finite).
float pow2_at_least(float v) {
  float p = std::ldexp(1.0f, -140);
  while (p < v) p *= 2.0f;
  return p;
}

std::vector<float> random_values(int n, uint32_t seed, float spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> expo(-spread, spread);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng) * std::exp2(expo(rng));
  return x;
}

}  // namespace

TEST_CASE("bf16 rounds to nearest even and keeps NaN") {
  CHECK(f32_to_bf16(1.0f) == 0x3F80);
  CHECK(f32_to_bf16(-2.0f) == 0xC000);
  CHECK(f32_to_bf16(1.0f + 0x1p-8f) == 0x3F80);             // tie, even stays
  CHECK(f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3F82);         // tie, odd rounds up
  CHECK(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3F81);  // above the tie
  CHECK(f32_to_bf16(3.4028235e38f) == 0x7F80);              // overflows to inf
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  CHECK(bf16_to_f32(0x3FC0) == 1.5f);
  CHECK(round_bf16(1.0f + 0x1p-7f) == 1.0f + 0x1p-7f);
}

TEST_CASE("e4m3 decodes and encodes the hand-computed patterns") {
  CHECK(f32_to_e4m3(448.0f) == 0x7E);
  CHECK(f32_to_e4m3(-448.0f) == 0xFE);
  CHECK(f32_to_e4m3(1.0f) == 0x38);
  CHECK(f32_to_e4m3(-1.0f) == 0xB8);
  CHECK(f32_to_e4m3(0x1p-9f) == 0x01);
  CHECK(f32_to_e4m3(0x1p-6f) == 0x08);
  CHECK(f32_to_e4m3(0.5f * 0x1p-9f) == 0x00);   // tie between 0 and 2^-9: even
  CHECK(f32_to_e4m3(1.5f * 0x1p-9f) == 0x02);   // tie between codes 1 and 2
  CHECK(f32_to_e4m3(7.5f * 0x1p-9f) == 0x08);   // tie across the subnormal/normal edge
  CHECK(f32_to_e4m3(1.0625f) == 0x38);          // tie between 1 and 1.125
  CHECK(f32_to_e4m3(1.1875f) == 0x3A);          // tie between 1.125 and 1.25
  CHECK(f32_to_e4m3(464.0f) == 0x7E);           // saturates, never NaN
  CHECK(f32_to_e4m3(1e6f) == 0x7E);
  CHECK(f32_to_e4m3(-INFINITY) == 0xFE);
  CHECK(f32_to_e4m3(NAN) == 0x7F);
  CHECK(e4m3_to_f32(0x7E) == 448.0f);
  CHECK(e4m3_to_f32(0x01) == 0x1p-9f);
  CHECK(e4m3_to_f32(0x08) == 0x1p-6f);
  CHECK(e4m3_to_f32(0x3B) == 1.375f);
  CHECK(std::isnan(e4m3_to_f32(0x7F)));
  CHECK(std::isnan(e4m3_to_f32(0xFF)));
  CHECK(std::signbit(e4m3_to_f32(0x80)));
}

TEST_CASE("e4m3 encoding is the nearest code with ties to even, for every code and random values") {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    CHECK(f32_to_e4m3(e4m3_to_f32(uint8_t(c))) == c);
    // the midpoint to the next code up (within the same sign)
    if ((c & 0x7F) < 0x7E) {
      const float mid = 0.5f * (e4m3_to_f32(uint8_t(c)) + e4m3_to_f32(uint8_t(c + 1)));
      CHECK(f32_to_e4m3(mid) == ((c % 2 == 0) ? c : c + 1));
    }
  }
  const auto x = random_values(20000, 1, 12.0f);
  for (float v : x) {
    const float a = std::min(std::fabs(v), 448.0f);
    const uint8_t want = nearest_code(a, 128, e4m3_to_f32) | (v < 0 ? 0x80 : 0);
    REQUIRE(f32_to_e4m3(v) == want);
  }
}

TEST_CASE("ue8m0 is a power of two with 127 = 1 and 255 = NaN") {
  CHECK(ue8m0_to_f32(127) == 1.0f);
  CHECK(ue8m0_to_f32(128) == 2.0f);
  CHECK(ue8m0_to_f32(120) == 0x1p-7f);
  CHECK(ue8m0_to_f32(0) == std::ldexp(1.0f, -127));
  CHECK(std::isnan(ue8m0_to_f32(255)));
  CHECK(ue8m0_from_exponent(0) == 127);
  CHECK(ue8m0_from_exponent(-127) == 0);
  CHECK(ue8m0_from_exponent(127) == 254);
}

TEST_CASE("e2m1 grid, ties to even and saturation") {
  const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 8; ++c) {
    CHECK(e2m1_to_f32(uint8_t(c)) == grid[c]);
    CHECK(e2m1_to_f32(uint8_t(c + 8)) == -grid[c]);
    CHECK(f32_to_e2m1(grid[c]) == c);
    if (c > 0) CHECK(f32_to_e2m1(-grid[c]) == c + 8);
  }
  CHECK(f32_to_e2m1(0.25f) == 0);   // 0 | .5  -> 0
  CHECK(f32_to_e2m1(0.75f) == 2);   // .5 | 1  -> 1
  CHECK(f32_to_e2m1(1.25f) == 2);   // 1 | 1.5 -> 1
  CHECK(f32_to_e2m1(1.75f) == 4);   // 1.5 | 2 -> 2
  CHECK(f32_to_e2m1(2.5f) == 4);    // 2 | 3   -> 2
  CHECK(f32_to_e2m1(3.5f) == 6);    // 3 | 4   -> 4
  CHECK(f32_to_e2m1(5.0f) == 6);    // 4 | 6   -> 4
  CHECK(f32_to_e2m1(-5.0f) == 14);
  CHECK(f32_to_e2m1(100.0f) == 7);
  CHECK(f32_to_e2m1(-100.0f) == 15);
  const auto x = random_values(5000, 2, 3.0f);
  for (float v : x) {
    const uint8_t want = nearest_code(std::min(std::fabs(v), 6.0f), 8, e2m1_to_f32) | (v < 0 ? 8 : 0);
    REQUIRE(f32_to_e2m1(v) == want);
  }
}

TEST_CASE("power-of-two group scales are exact at powers of two") {
  CHECK(fp8_group_scale(448.0f) == 1.0f);  // 448 * fp32(1/448) rounds to exactly 1
  CHECK(fp8_group_scale(449.0f) == 2.0f);
  CHECK(fp8_group_scale(224.0f) == 0.5f);
  CHECK(fp8_group_scale(0.0f) == 0x1p-22f);  // floor 1e-4
  CHECK(fp4_pow2_scale(6.0f) == 1.0f);
  CHECK(fp4_pow2_scale(1.0f) == 0.25f);
  CHECK(fp4_pow2_scale(0.0f) == 0x1p-126f);
  const auto x = random_values(20000, 3, 40.0f);
  for (float v : x) {
    const float a = std::fabs(v);
    REQUIRE(fp8_group_scale(a) == pow2_at_least(std::max(a, 1e-4f) * (1.0f / 448.0f)));
    REQUIRE(fp4_pow2_scale(a) == pow2_at_least(std::max(a, 6.0f * 0x1p-126f) * (1.0f / 6.0f)));
  }
  for (int e = -20; e < 20; ++e) {  // amax right at, just under and just over a power of two
    for (float a : {448.0f * std::ldexp(1.0f, e), std::nextafter(448.0f * std::ldexp(1.0f, e), 0.0f),
                    std::nextafter(448.0f * std::ldexp(1.0f, e), INFINITY)})
      REQUIRE(fp8_group_scale(a) == pow2_at_least(std::max(a, 1e-4f) * (1.0f / 448.0f)));
  }
}

TEST_CASE("e4m3 scale of an FP4 group of 16") {
  CHECK(fp4_e4m3_scale_code(6.0f) == 0x38);
  CHECK(fp4_e4m3_scale_code(0.0f) == 0x01);      // floor 6*2^-9 -> 2^-9
  CHECK(fp4_e4m3_scale_code(6.375f) == 0x38);    // 1.0625: tie to even
  CHECK(fp4_e4m3_scale_code(1e5f) == 0x7E);      // saturates at 448
  CHECK(fp4_e4m3_scale_code(1.0f) == 0x23);      // 1/6 -> 1.375 * 2^-3
}

TEST_CASE("fake-quant FP8 equals nearest-code quantization with the group scale") {
  auto x = random_values(32 * 64, 4, 10.0f);
  x[5] = 0.0f;
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero group stays zero
  auto y = x;
  fake_quant_fp8(y.data(), int(y.size()));
  std::vector<uint8_t> codes(x.size()), scales(x.size() / 32);
  quantize_fp8(x.data(), int(x.size()), codes.data(), scales.data());
  for (size_t g = 0; g < x.size() / 32; ++g) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[g * 32 + i]));
    const float s = pow2_at_least(std::max(amax, 1e-4f) * (1.0f / 448.0f));
    REQUIRE(ue8m0_to_f32(scales[g]) == s);
    for (int i = 0; i < 32; ++i) {
      const float v = x[g * 32 + i] / s;
      const uint8_t want = nearest_code(std::min(std::fabs(v), 448.0f), 128, e4m3_to_f32) | (v < 0 ? 0x80 : 0);
      REQUIRE(codes[g * 32 + i] == want);
      REQUIRE(bits_of(y[g * 32 + i]) == bits_of(e4m3_to_f32(want) * s));
    }
  }
  for (int i = 64; i < 96; ++i) CHECK(y[i] == 0.0f);
}

TEST_CASE("fake-quant FP4 (pow2 per 32 and e4m3 per 16) land on the scaled grid") {
  auto x = random_values(32 * 32, 5, 8.0f);
  auto p = x, q = x;
  fake_quant_fp4_pow2(p.data(), int(p.size()));
  fake_quant_fp4_e4m3(q.data(), int(q.size()));
  for (size_t g = 0; g < x.size() / 32; ++g) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[g * 32 + i]));
    const float s = pow2_at_least(std::max(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f));
    for (int i = 0; i < 32; ++i) {
      const float v = x[g * 32 + i] / s;
      const uint8_t c = nearest_code(std::min(std::fabs(v), 6.0f), 8, e2m1_to_f32);
      REQUIRE(std::fabs(p[g * 32 + i]) == e2m1_to_f32(c) * s);
    }
  }
  for (size_t g = 0; g < x.size() / 16; ++g) {
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[g * 16 + i]));
    const float s = e4m3_to_f32(f32_to_e4m3(std::max(amax, 6.0f * 0x1p-9f) / 6.0f));
    for (int i = 0; i < 16; ++i) {
      const float v = x[g * 16 + i] / s;
      const uint8_t c = nearest_code(std::min(std::fabs(v), 6.0f), 8, e2m1_to_f32);
      REQUIRE(std::fabs(q[g * 16 + i]) == e2m1_to_f32(c) * s);
      // the error is at most half a grid step (1.0 at the top of the grid) times the scale
      CHECK(std::fabs(q[g * 16 + i] - x[g * 16 + i]) <= s * 1.0f + 1e-30f);
    }
  }
}

TEST_CASE("record layouts: hand-packed first bytes and scale positions") {
  std::vector<float> x(512, 0.0f);
  x[0] = 1.0f;
  x[1] = -0.5f;
  std::vector<uint8_t> rec(latent_fp4_bytes);
  REQUIRE(fp4_e4m3_record_bytes(512) == 288);
  pack_fp4_e4m3(x.data(), 512, rec.data());
  CHECK(rec[0] == 0xD7);    // low nibble 6.0 (code 7), high nibble -3.0 (code 13)
  CHECK(rec[256] == 0x23);  // scale e4m3(1/6) = 0.171875
  CHECK(rec[257] == 0x01);  // an all-zero group gets the floor scale 2^-9

  std::vector<uint8_t> key(index_key_fp4_bytes);
  REQUIRE(fp4_pow2_record_bytes(128) == 68);
  pack_fp4_pow2(x.data(), 128, key.data());
  CHECK(key[0] == 0xC6);  // 4.0 (code 6), -2.0 (code 12) with scale 0.25
  CHECK(key[64] == 125);

  x[1] = -3.0f;
  std::vector<uint8_t> swa(swa_record_bytes);
  REQUIRE(fp8_record_bytes(512) == 528);
  pack_fp8(x.data(), 512, swa.data());
  CHECK(swa[0] == 0x70);  // 1 / 2^-7 = 128
  CHECK(swa[1] == 0xFC);  // -384
  CHECK(swa[512] == 120);
}

TEST_CASE("records round-trip to the fake-quantized values, for several dimensions") {
  for (int d : {32, 128, 512, 1024}) {
    const auto x = random_values(d, 6 + d, 6.0f);
    std::vector<uint8_t> rec(fp8_record_bytes(d));
    std::vector<float> back(d);

    auto want = x;
    fake_quant_fp4_e4m3(want.data(), d);
    pack_fp4_e4m3(x.data(), d, rec.data());
    unpack_fp4_e4m3(rec.data(), d, back.data());
    for (int i = 0; i < d; ++i) REQUIRE(back[i] == want[i]);
    // packing an already quantized vector is lossless
    std::vector<uint8_t> rec2(rec.size());
    pack_fp4_e4m3(back.data(), d, rec2.data());
    CHECK(std::memcmp(rec.data(), rec2.data(), fp4_e4m3_record_bytes(d)) == 0);

    want = x;
    fake_quant_fp4_pow2(want.data(), d);
    pack_fp4_pow2(x.data(), d, rec.data());
    unpack_fp4_pow2(rec.data(), d, back.data());
    for (int i = 0; i < d; ++i) REQUIRE(back[i] == want[i]);

    want = x;
    fake_quant_fp8(want.data(), d);
    pack_fp8(x.data(), d, rec.data());
    unpack_fp8(rec.data(), d, back.data());
    for (int i = 0; i < d; ++i) REQUIRE(back[i] == want[i]);
  }
}

TEST_CASE("KV bytes per token of the real config: 890 FP4, 1650 FP8, 2.58 MiB ring") {
  model_args args;
  args.compress_ratios.assign(2, 0);
  args.compress_ratios.insert(args.compress_ratios.end(), 18, 2);
  args.compress_ratios.insert(args.compress_ratios.end(), 20, 1);
  args.compress_ratios.insert(args.compress_ratios.end(), 3, 0);
  args.kv_source_layer_ids = {2, 8, 14, 20};
  const auto fp4 = kv_layout::make(args, kv_dtype::fp4);
  CHECK(fp4.bytes_per_token() == 890.0);
  CHECK(fp4.ring_bytes() == 2703360);
  CHECK(fp4.num_ratio2_sources == 3);
  const auto fp8 = kv_layout::make(args, kv_dtype::fp8);
  CHECK(fp8.bytes_per_token() == 1650.0);
  CHECK(fp8.sources[0].latent_bytes == latent_fp8_bytes);
  CHECK(fp8.sources[0].key_bytes == index_key_fp8_bytes);
}
