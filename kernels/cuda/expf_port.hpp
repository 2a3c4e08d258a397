// Single-precision exp and log1p with the algorithms of the host C library (glibc), so that
// the CUDA ops reproduce the CPU reference's transcendentals bit for bit.
//
// exp follows glibc's expf (glibc 2.28 and later:
// a 32-entry table of 2^(i/32), the reduction x*32/ln2 = k + r in double, a cubic in r), so
// the CUDA ops get the CPU reference's exp bit for bit: a value rounded from double exp differs
// from glibc's expf for about 8 inputs in 100,000, and such a last-ulp difference can flip a
// near-tied expert or top-k choice. Every step is one rounded double operation (no fused
// multiply-add), which is what the CPU library computes on every input (checked over all 2^32
// floats in tests/gpu). log1p follows glibc's log1pf (the fdlibm reduction 1+x = 2^k (1+f) with a
// correction term c, and the Lp1..Lp7 series in s = f/(2+f)), all in float, as the CPU's
// softplus uses it: rounding log1p in double instead differs for about 1 input in 200.
// Usable from host and device code.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define CEDAR_HD __host__ __device__ __forceinline__
#else
#define CEDAR_HD inline
#endif

namespace cedar::libm_port {

/// bits(2^(i/32)) - (i << 47): 2^(k/32) is then bits(table[k % 32] + (k << 47)).
#define CEDAR_EXP2_TABLE \
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull, \
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull, \
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull, \
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull, \
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull, \
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull, \
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull, \
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull

#ifdef __CUDACC__
static __constant__ uint64_t exp2_table_device[32] = {CEDAR_EXP2_TABLE};
#endif
inline constexpr uint64_t exp2_table_host[32] = {CEDAR_EXP2_TABLE};

CEDAR_HD uint64_t exp2_table(uint64_t i) {
#ifdef __CUDA_ARCH__
  return exp2_table_device[i];
#else
  return exp2_table_host[i];
#endif
}

CEDAR_HD uint64_t bits_of(double d) {
  uint64_t u;
  __builtin_memcpy(&u, &d, 8);
  return u;
}
CEDAR_HD double double_of(uint64_t u) {
  double d;
  __builtin_memcpy(&d, &u, 8);
  return d;
}

/// exp(x) as the C library's expf computes it (round to nearest).
CEDAR_HD float expf(float x) {
  constexpr double inv_ln2_n = 0x1.71547652b82fep+0 * 32, shift = 0x1.8p+52;
  constexpr double c0 = 0x1.c6af84b912394p-5 / 32 / 32 / 32, c1 = 0x1.ebfce50fac4f3p-3 / 32 / 32,
                   c2 = 0x1.62e42ff0c52d6p-1 / 32;
  uint32_t ux;
  __builtin_memcpy(&ux, &x, 4);
  const uint32_t abstop = (ux >> 20) & 0x7ff;
  if (abstop >= 0x42b) {  // |x| >= 88, or NaN
    if (ux == 0xff800000u) return 0.0f;
    if (abstop >= 0x7f8) return x + x;
    if (x > 0x1.62e42ep6f) return __builtin_huge_valf();
    if (x < -0x1.9fe368p6f) return 0.0f;
  }
  const double xd = double(x);
  const double z = inv_ln2_n * xd;
  double kd = z + shift;
  const uint64_t ki = bits_of(kd);
  kd -= shift;
  const double r = z - kd;
  const double s = double_of(exp2_table(ki % 32) + (ki << 47));
  const double zz = c0 * r + c1;
  const double r2 = r * r;
  double y = c2 * r + 1.0;
  y = zz * r2 + y;
  y = y * s;
  return float(y);
}

CEDAR_HD uint32_t float_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}
CEDAR_HD float float_of(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

/// log(1 + x) as the C library's log1pf computes it (round to nearest, no fused operations).
CEDAR_HD float log1pf(float x) {
  constexpr float ln2_hi = 6.9313812256e-01f, ln2_lo = 9.0580006145e-06f;
  constexpr float lp1 = 6.6666668653e-01f, lp2 = 4.0000000596e-01f, lp3 = 2.8571429849e-01f,
                  lp4 = 2.2222198546e-01f, lp5 = 1.8183572590e-01f, lp6 = 1.5313838422e-01f,
                  lp7 = 1.4798198640e-01f;
  const int32_t hx = int32_t(float_bits(x));
  const int32_t ax = hx & 0x7fffffff;
  int32_t k = 1, hu = 0;
  float f = 0.0f, c = 0.0f;
  if (hx < 0x3ed413d7) {          // x < 0.41422
    if (ax >= 0x3f800000) {       // x <= -1
      if (x == -1.0f) return -__builtin_huge_valf();
      return __builtin_nanf("");
    }
    if (ax < 0x31000000) {        // |x| < 2^-29
      if (ax < 0x24800000) return x;
      return x - x * x * 0.5f;
    }
    if (hx > 0 || hx <= int32_t(0xbe95f61f)) {  // -0.2929 < x < 0.41422: no reduction
      k = 0;
      f = x;
      hu = 1;
    }
  }
  if (hx >= 0x7f800000) return x + x;
  if (k != 0) {
    float u;
    if (hx < 0x5a000000) {
      u = 1.0f + x;
      hu = int32_t(float_bits(u));
      k = (hu >> 23) - 127;
      c = k > 0 ? 1.0f - (u - x) : x - (u - 1.0f);  // the rounding error of 1 + x
      c /= u;
    } else {
      u = x;
      hu = int32_t(float_bits(u));
      k = (hu >> 23) - 127;
      c = 0.0f;
    }
    hu &= 0x007fffff;
    if (hu < 0x3504f7) {
      u = float_of(uint32_t(hu | 0x3f800000));  // u in [1, sqrt 2)
    } else {
      k += 1;
      u = float_of(uint32_t(hu | 0x3f000000));  // u / 2
      hu = (0x00800000 - hu) >> 2;
    }
    f = u - 1.0f;
  }
  const float hfsq = 0.5f * f * f;
  const float fk = float(k);
  if (hu == 0) {  // |f| < 2^-20
    if (f == 0.0f) {
      if (k == 0) return 0.0f;
      c += fk * ln2_lo;
      return fk * ln2_hi + c;
    }
    const float r = hfsq * (1.0f - 0.66666666666666666f * f);
    if (k == 0) return f - r;
    return fk * ln2_hi - ((r - (fk * ln2_lo + c)) - f);
  }
  const float s = f / (2.0f + f);
  const float z = s * s;
  const float r = z * (lp1 + z * (lp2 + z * (lp3 + z * (lp4 + z * (lp5 + z * (lp6 + z * lp7))))));
  if (k == 0) return f - (hfsq - s * (hfsq + r));
  return fk * ln2_hi - ((hfsq - (s * (hfsq + r) + (fk * ln2_lo + c))) - f);
}

}  // namespace cedar::libm_port
