// The number formats of V4.1-Flash (spec §3.1, §3.3, §4.2), bit-exact: scalar codecs, the
// activation fake-quant rules and the KV record layouts. Pure functions, any thread.
// Rounding is done with exact power-of-two scaling plus one rint (round half to even), so no
// step depends on the precision of log2 or on the platform's libm.
#include "kernels/formats.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/op_check.hpp"

namespace cedar::fmt {

namespace {

/// ceil(log2(v)) for a finite v > 0, exact: frexp gives v = f * 2^e with f in [0.5, 1),
/// and v is a power of two exactly when f == 0.5.
int ceil_log2(float v) {
  int e = 0;
  const float f = std::frexp(v, &e);
  return f == 0.5f ? e - 1 : e;
}

/// Power-of-two group scale 2^ceil(log2(max(amax, floor) * inv_max)), the product in fp32.
float pow2_scale(float amax, float floor_value, float inv_max) {
  if (std::isnan(amax)) return NAN;
  const float v = std::max(amax, floor_value) * inv_max;
  if (std::isinf(v)) return INFINITY;
  return std::ldexp(1.0f, ceil_log2(v));
}

float group_amax(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

/// UE8M0 code of a power-of-two scale produced by pow2_scale.
uint8_t pow2_code(float s) {
  int e = 0;
  std::frexp(s, &e);
  return ue8m0_from_exponent(e - 1);
}

/// The value of e4m3 code f32_to_e4m3(v) for |v| <= 448, without building the code: below
/// 2^-6 adding 2^14 rounds to the subnormal step 2^-9 (fp32 round-half-even), above it the
/// mantissa is rounded to 3 bits on the fp32 bit pattern (a carry moves into the exponent).
float round_to_e4m3(float v) {
  const float a = std::fabs(v);
  float r;
  if (a < 0x1p-6f) {
    r = (a + 0x1p14f) - 0x1p14f;
  } else {
    uint32_t u;
    std::memcpy(&u, &a, 4);
    u = (u + 0x7FFFF + ((u >> 20) & 1)) & 0xFFF00000u;
    std::memcpy(&r, &u, 4);
  }
  return std::copysign(r, v);
}

/// E2M1 codes of one group of values divided by `scale` (exact for power-of-two scales).
void e2m1_group(const float* x, int n, float scale, uint8_t* codes) {
  for (int i = 0; i < n; ++i) codes[i] = f32_to_e2m1(x[i] / scale);
}

// Packed E2M1: byte i holds element 2i in its low nibble and 2i+1 in its high nibble.
void pack_nibbles(const uint8_t* codes, int n, uint8_t* packed) {
  for (int i = 0; i < n / 2; ++i)
    packed[i] = uint8_t((codes[2 * i] & 0xF) | ((codes[2 * i + 1] & 0xF) << 4));
}

const float e2m1_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace

// ---- scalar codecs -------------------------------------------------------------------

float bf16_to_f32(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

uint16_t f32_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return uint16_t((u >> 16) | 0x0040);  // keep sign, force a quiet NaN
  const uint32_t lsb = (u >> 16) & 1;
  return uint16_t((u + 0x7FFF + lsb) >> 16);
}

float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

float e4m3_to_f32(uint8_t code) {
  const bool neg = code & 0x80;
  const int exp = (code >> 3) & 0xF;
  const int mant = code & 0x7;
  if (exp == 0xF && mant == 0x7) return NAN;
  const float mag = exp == 0 ? std::ldexp(float(mant), -9)  // subnormal: m * 2^-9
                             : std::ldexp(float(8 + mant), exp - 10);
  return neg ? -mag : mag;
}

uint8_t f32_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7E;
  int code;
  if (a < 0x1p-6f) {
    // Subnormal range, step 2^-9; a result of 8 is the smallest normal, code 0x08.
    code = int(std::rint(std::ldexp(a, 9)));
  } else {
    int e = 0;
    std::frexp(a, &e);
    --e;  // a = 1.m * 2^e
    // a * 2^(3-e) is in [8, 16); its rounded value 16 carries into the exponent field.
    code = ((e + 7) << 3) + int(std::rint(std::ldexp(a, 3 - e))) - 8;
  }
  return uint8_t(sign | code);
}

float ue8m0_to_f32(uint8_t code) {
  if (code == 255) return NAN;
  return std::ldexp(1.0f, int(code) - 127);
}

uint8_t ue8m0_from_exponent(int e) {
  CEDAR_OP_CHECK(e >= -127 && e <= 127, "ue8m0 exponent in range");
  return uint8_t(e + 127);
}

float e2m1_to_f32(uint8_t code) { return e2m1_values[code & 0xF]; }

uint8_t f32_to_e2m1(float x) {
  if (std::isnan(x)) return 0;
  const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  // Midpoints of the grid; a tie goes to the even code (even mantissa bit).
  uint8_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return uint8_t(sign | c);
}

// ---- activation fake-quant -----------------------------------------------------------

float fp8_group_scale(float amax) { return pow2_scale(amax, 1e-4f, 1.0f / 448.0f); }

void quantize_fp8(const float* x, int n, uint8_t* codes, uint8_t* scale_codes) {
  CEDAR_OP_CHECK(n % fp8_group == 0, "length is a multiple of the group");
  for (int g = 0; g < n / fp8_group; ++g) {
    const float* xg = x + g * fp8_group;
    const float s = fp8_group_scale(group_amax(xg, fp8_group));
    scale_codes[g] = pow2_code(s);
    for (int i = 0; i < fp8_group; ++i)
      codes[g * fp8_group + i] = f32_to_e4m3(std::clamp(xg[i] / s, -448.0f, 448.0f));
  }
}

void fake_quant_fp8(float* x, int n) {
  CEDAR_OP_CHECK(n % fp8_group == 0, "length is a multiple of the group");
  for (int g = 0; g < n / fp8_group; ++g) {
    float* xg = x + g * fp8_group;
    const float s = fp8_group_scale(group_amax(xg, fp8_group));
    for (int i = 0; i < fp8_group; ++i)
      xg[i] = round_to_e4m3(std::clamp(xg[i] / s, -448.0f, 448.0f)) * s;
  }
}

float fp4_pow2_scale(float amax) { return pow2_scale(amax, 6.0f * 0x1p-126f, 1.0f / 6.0f); }

void fake_quant_fp4_pow2(float* x, int n) {
  CEDAR_OP_CHECK(n % fp4_pow2_group == 0, "length is a multiple of the group");
  for (int g = 0; g < n / fp4_pow2_group; ++g) {
    float* xg = x + g * fp4_pow2_group;
    const float s = fp4_pow2_scale(group_amax(xg, fp4_pow2_group));
    for (int i = 0; i < fp4_pow2_group; ++i) xg[i] = e2m1_to_f32(f32_to_e2m1(xg[i] / s)) * s;
  }
}

uint8_t fp4_e4m3_scale_code(float amax) {
  return f32_to_e4m3(std::max(amax, 6.0f * 0x1p-9f) / 6.0f);
}

void fake_quant_fp4_e4m3(float* x, int n) {
  CEDAR_OP_CHECK(n % fp4_kv_group == 0, "length is a multiple of the group");
  for (int g = 0; g < n / fp4_kv_group; ++g) {
    float* xg = x + g * fp4_kv_group;
    const float s = e4m3_to_f32(fp4_e4m3_scale_code(group_amax(xg, fp4_kv_group)));
    for (int i = 0; i < fp4_kv_group; ++i) xg[i] = e2m1_to_f32(f32_to_e2m1(xg[i] / s)) * s;
  }
}

// ---- KV records ----------------------------------------------------------------------

void pack_fp4_e4m3(const float* x, int d, uint8_t* rec) {
  CEDAR_OP_CHECK(d % 32 == 0, "length is a multiple of the group");
  uint8_t* scales = rec + d / 2;
  for (int g = 0; g < d / fp4_kv_group; ++g) {
    const float* xg = x + g * fp4_kv_group;
    scales[g] = fp4_e4m3_scale_code(group_amax(xg, fp4_kv_group));
    uint8_t codes[fp4_kv_group];
    e2m1_group(xg, fp4_kv_group, e4m3_to_f32(scales[g]), codes);
    pack_nibbles(codes, fp4_kv_group, rec + g * fp4_kv_group / 2);
  }
}

void unpack_fp4_e4m3(const uint8_t* rec, int d, float* x) {
  CEDAR_OP_CHECK(d % 32 == 0, "length is a multiple of the group");
  const uint8_t* scales = rec + d / 2;
  for (int i = 0; i < d; ++i) {
    const uint8_t code = (rec[i / 2] >> (4 * (i & 1))) & 0xF;
    x[i] = e2m1_to_f32(code) * e4m3_to_f32(scales[i / fp4_kv_group]);
  }
}

void pack_fp4_pow2(const float* x, int d, uint8_t* rec) {
  CEDAR_OP_CHECK(d % 32 == 0, "length is a multiple of the group");
  uint8_t* scales = rec + d / 2;
  for (int g = 0; g < d / fp4_pow2_group; ++g) {
    const float* xg = x + g * fp4_pow2_group;
    const float s = fp4_pow2_scale(group_amax(xg, fp4_pow2_group));
    scales[g] = pow2_code(s);
    uint8_t codes[fp4_pow2_group];
    e2m1_group(xg, fp4_pow2_group, s, codes);
    pack_nibbles(codes, fp4_pow2_group, rec + g * fp4_pow2_group / 2);
  }
}

void unpack_fp4_pow2(const uint8_t* rec, int d, float* x) {
  CEDAR_OP_CHECK(d % 32 == 0, "length is a multiple of the group");
  const uint8_t* scales = rec + d / 2;
  for (int i = 0; i < d; ++i) {
    const uint8_t code = (rec[i / 2] >> (4 * (i & 1))) & 0xF;
    x[i] = e2m1_to_f32(code) * ue8m0_to_f32(scales[i / fp4_pow2_group]);
  }
}

void pack_fp8(const float* x, int d, uint8_t* rec) {
  CEDAR_OP_CHECK(d % 32 == 0, "length is a multiple of the group");
  quantize_fp8(x, d, rec, rec + d);
}

void unpack_fp8(const uint8_t* rec, int d, float* x) {
  CEDAR_OP_CHECK(d % 32 == 0, "length is a multiple of the group");
  const uint8_t* scales = rec + d;
  for (int i = 0; i < d; ++i) x[i] = e4m3_to_f32(rec[i]) * ue8m0_to_f32(scales[i / fp8_group]);
}

}  // namespace cedar::fmt
