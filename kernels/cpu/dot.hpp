// fp32 dot products in one fixed summation order, shared by the CPU linear layers and norms so
// that a row's result never depends on which other rows are computed with it.
//
// dot_order: for a length-n dot, k < n32 = n - n % 32 is summed in two 16-lane accumulators
// a[j] (lane l of a[j] holds k = 32b + 16j + l): for b ascending, a[j] += x*w lane-wise (a
// rounded product, then a rounded sum; never a fused multiply-add). Then v = a0 + a1, and the
// 16 lanes are folded in halves: v[l] += v[l + 8], then + 4, + 2, + 1. The tail k >= n32 is
// added to that sum one element at a time in ascending k.
//
// The widest vector build the CPU supports is used (AVX-512, AVX2 or baseline x86-64; all give
// the same bits); CEDAR_CPU_ISA=base|avx2 caps it, to check exactly that.
#pragma once

#include <cstdint>

namespace cedar::cpu {

/// y[r * ldy + i] = dot(x[r], w[i]) for r < m, i < rows (rows <= 4), in dot_order.
void dot_tile(const float* x,         // [m, n]
              int m, int n,
              const float* const* w,  // rows pointers to [n]
              int rows, float* y, int ldy);

/// dot(a, b) of length n in dot_order.
float dot(const float* a, const float* b, int n);

// Exact fp32 decoding of one weight row, vectorized: the values of the fmt:: scalar codecs,
// except that the e4m3 NaN codes (never present in weights) decode as 480 * scale.

/// dst[k] = e4m3(codes[k]) * ue8m0(scales[k / 32]) for k < n (n % 32 == 0).
void decode_fp8_row(const uint8_t* codes, const uint8_t* scales, int n, float* dst);
/// dst[k] = e2m1(nibble k of packed) * ue8m0(scales[k / 32]), low nibble = even k (n % 32 == 0).
void decode_fp4_row(const uint8_t* packed, const uint8_t* scales, int n, float* dst);
/// dst[k] = bf16 bits[k] widened to fp32.
void decode_bf16_row(const uint16_t* bits, int n, float* dst);

}  // namespace cedar::cpu
