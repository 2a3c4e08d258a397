// The fixed-order dot products and row decoders of dot.hpp. GCC vector extensions spell out the
// lane order; the AVX-512, AVX2 and baseline builds of each function run the same operations in
// the same order with contraction into fused multiply-adds switched off, so every x86-64
// machine gets the same bits. The build is picked once at run time by a plain branch (not an
// ifunc, whose resolver runs before sanitizer runtimes are up).
#pragma GCC optimize("fp-contract=off")

#include "kernels/cpu/dot.hpp"

#include <immintrin.h>

#include <cstdlib>
#include <cstring>

#include "kernels/formats.hpp"

namespace cedar::cpu {

namespace {

// Everything passing vector types is internal to this file, so the ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint8_t v16u8 __attribute__((vector_size(16)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef int16_t v16i16 __attribute__((vector_size(32)));
typedef uint8_t v8u8 __attribute__((vector_size(8)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));

enum class isa_level { base, avx2, avx512 };

/// The widest build this CPU runs, capped by CEDAR_CPU_ISA (base | avx2 | avx512) if set.
isa_level detect_isa() {
  __builtin_cpu_init();
  isa_level level = __builtin_cpu_supports("avx512f") ? isa_level::avx512
                    : __builtin_cpu_supports("avx2")  ? isa_level::avx2
                                                      : isa_level::base;
  if (const char* cap = std::getenv("CEDAR_CPU_ISA")) {
    if (std::strcmp(cap, "base") == 0) level = isa_level::base;
    if (std::strcmp(cap, "avx2") == 0 && level == isa_level::avx512) level = isa_level::avx2;
  }
  return level;
}

isa_level cpu_isa() {
  static const isa_level level = detect_isa();
  return level;
}

/// Defines AVX-512, AVX2 and baseline builds of name##_body (always_inline, so each is
/// compiled for its target).
#define CEDAR_MULTIVERSION(name, params, args)                                      \
  __attribute__((target("avx512f"))) void name##_avx512 params { name##_body args; } \
  __attribute__((target("avx2"))) void name##_avx2 params { name##_body args; }      \
  void name##_base params { name##_body args; }

/// Calls the build of `name` for this CPU.
#define CEDAR_DISPATCH(name, args)                 \
  switch (cpu_isa()) {                             \
    case isa_level::avx512: return name##_avx512 args; \
    case isa_level::avx2: return name##_avx2 args;     \
    default: return name##_base args;                  \
  }

template <class V>
[[gnu::always_inline]] inline V load(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class V>
[[gnu::always_inline]] inline void store(void* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}

[[gnu::always_inline]] inline float fold(const v16f& lanes) {
  v16f v = lanes;
  for (int half = 8; half >= 1; half /= 2)
    for (int l = 0; l < half; ++l) v[l] += v[l + half];
  return v[0];
}

/// R weight rows times X rows of x (the R*X dots interleaved, each in dot_order).
template <int R, int X>
[[gnu::always_inline]] inline void dot_block(const float* x, int n, const float* const* w,
                                             float* y, int ldy) {
  v16f a[X][R][2] = {};
  const int n32 = n - n % 32;
  for (int k = 0; k < n32; k += 32) {
    v16f xv[X][2];
    for (int r = 0; r < X; ++r) {
      xv[r][0] = load<v16f>(x + static_cast<long>(r) * n + k);
      xv[r][1] = load<v16f>(x + static_cast<long>(r) * n + k + 16);
    }
    for (int i = 0; i < R; ++i) {
      const v16f w0 = load<v16f>(w[i] + k), w1 = load<v16f>(w[i] + k + 16);
      for (int r = 0; r < X; ++r) {
        a[r][i][0] += w0 * xv[r][0];
        a[r][i][1] += w1 * xv[r][1];
      }
    }
  }
  for (int r = 0; r < X; ++r)
    for (int i = 0; i < R; ++i) {
      const float* xr = x + static_cast<long>(r) * n;
      float s = fold(a[r][i][0] + a[r][i][1]);
      for (int k = n32; k < n; ++k) s += xr[k] * w[i][k];
      y[static_cast<long>(r) * ldy + i] = s;
    }
}

template <int R>
[[gnu::always_inline]] inline void dot_rows(const float* x, int m, int n, const float* const* w,
                                            float* y, int ldy) {
  int r = 0;
  for (; r + 2 <= m; r += 2)
    dot_block<R, 2>(x + static_cast<long>(r) * n, n, w, y + static_cast<long>(r) * ldy, ldy);
  if (r < m) dot_block<R, 1>(x + static_cast<long>(r) * n, n, w, y + static_cast<long>(r) * ldy, ldy);
}

/// 16 bytes widened to 32-bit lanes (in two 2x steps, which GCC keeps in vector registers).
[[gnu::always_inline]] inline v16i widen(v16u8 b) {
  return __builtin_convertvector(__builtin_convertvector(b, v16i16), v16i);
}

/// UE8M0 code -> fp32 scale, one table for all decoders.
struct scale_table {
  float v[256];
  scale_table() {
    for (int c = 0; c < 256; ++c) v[c] = fmt::ue8m0_to_f32(uint8_t(c));
  }
};
const scale_table scales_f32;

[[gnu::always_inline]] inline void dot_tile_body(const float* x, int m, int n, const float* const* w,
                                                 int rows, float* y, int ldy) {
  switch (rows) {
    case 4: dot_rows<4>(x, m, n, w, y, ldy); break;
    case 3: dot_rows<3>(x, m, n, w, y, ldy); break;
    case 2: dot_rows<2>(x, m, n, w, y, ldy); break;
    default: dot_rows<1>(x, m, n, w, y, ldy); break;
  }
}

// e4m3 -> fp32 by bits: a normal code (exponent field e > 0) is the fp32 with exponent
// e - 7 + 127 and the 3 mantissa bits on top; a subnormal code is m * 2^-9.
[[gnu::always_inline]] inline void decode_fp8_row_body(const uint8_t* codes, const uint8_t* scales,
                                                       int n, float* dst) {
  for (int k = 0; k < n; k += 16) {
    const v16i c = widen(load<v16u8>(codes + k));
    const v16i mag = c & 0x7F;
    const v16i normal_bits = (mag << 20) + (120 << 23);
    const v16f sub = __builtin_convertvector(mag & 7, v16f) * 0x1p-9f;
    v16i bits = (mag >> 3) != 0 ? normal_bits : (v16i)sub;
    bits |= (c & 0x80) << 24;
    const v16f v = (v16f)bits * scales_f32.v[scales[k / 32]];
    store(dst + k, v);
  }
}

// e2m1 -> fp32 through an 8-entry magnitude table and the sign bit.
[[gnu::always_inline]] inline void decode_fp4_row_body(const uint8_t* packed, const uint8_t* scales,
                                                       int n, float* dst) {
  const v16f grid = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                     0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int k = 0; k < n; k += 16) {
    // byte i -> 16-bit lane (low nibble, high nibble): read as bytes, nibbles in element order
    const v8u16 b = __builtin_convertvector(load<v8u8>(packed + k / 2), v8u16);
    const v8u16 pairs = (b & 0xF) | ((b >> 4) << 8);
    const v16i c = widen((v16u8)pairs);
    const v16f mag = __builtin_shuffle(grid, c & 7);
    const v16i bits = (v16i)mag | ((c & 8) << 28);
    const v16f v = (v16f)bits * scales_f32.v[scales[k / 32]];
    store(dst + k, v);
  }
}

[[gnu::always_inline]] inline void decode_bf16_row_body(const uint16_t* bits, int n, float* dst) {
  int k = 0;
  for (; k + 16 <= n; k += 16) {
    const v16i b = __builtin_convertvector(load<v16u16>(bits + k), v16i) << 16;
    store(dst + k, (v16f)b);
  }
  for (; k < n; ++k) dst[k] = fmt::bf16_to_f32(bits[k]);
}

CEDAR_MULTIVERSION(dot_tile,
                   (const float* x, int m, int n, const float* const* w, int rows, float* y, int ldy),
                   (x, m, n, w, rows, y, ldy))
CEDAR_MULTIVERSION(decode_fp8_row, (const uint8_t* codes, const uint8_t* scales, int n, float* dst),
                   (codes, scales, n, dst))
CEDAR_MULTIVERSION(decode_fp4_row, (const uint8_t* packed, const uint8_t* scales, int n, float* dst),
                   (packed, scales, n, dst))

// GCC 12's AVX-512 intrinsic headers trip -Wmaybe-uninitialized on their own placeholders.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// AVX-512 decoders, written with intrinsics (the widening and table steps above do not map to
// single instructions through vector extensions). Same values, bit for bit.

// e4m3 -> fp16 is a shift: S EEEE MMM becomes S 0EEEE MMM0000000, whose value is the e4m3 value
// times 2^-8 (biases 15 and 7), subnormals included; vcvtph2ps widens it exactly. Scaling by
// 2^8 and then by the block scale are exact multiplications by powers of two.
__attribute__((target("avx512f"))) void decode_fp8_row_avx512_cvt(const uint8_t* codes,
                                                                   const uint8_t* scales, int n,
                                                                   float* dst) {
  const __m256i mag_mask = _mm256_set1_epi16(0x7F), sign_mask = _mm256_set1_epi16(0x80);
  const __m512 two8 = _mm512_set1_ps(256.0f);
  for (int k = 0; k < n; k += 16) {
    const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k)));
    const __m256i half = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(c, mag_mask), 7),
                                         _mm256_slli_epi16(_mm256_and_si256(c, sign_mask), 8));
    const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtph_ps(half), two8),
                                   _mm512_set1_ps(scales_f32.v[scales[k / 32]]));
    _mm512_storeu_ps(dst + k, v);
  }
}

// e2m1 -> fp32 as one 16-entry table lookup per nibble (vpermps uses the low 4 bits).
__attribute__((target("avx512f"))) void decode_fp4_row_avx512_cvt(const uint8_t* packed,
                                                                   const uint8_t* scales, int n,
                                                                   float* dst) {
  const __m512 grid = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f,
                                     -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  const __m128i low4 = _mm_set1_epi8(0xF);
  for (int k = 0; k < n; k += 32) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + k / 2));
    const __m128i lo = _mm_and_si128(b, low4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
    const __m512 s = _mm512_set1_ps(scales_f32.v[scales[k / 32]]);
    const __m512i first = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));   // elements k..k+15
    const __m512i second = _mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi));  // k+16..k+31
    _mm512_storeu_ps(dst + k, _mm512_mul_ps(_mm512_permutexvar_ps(first, grid), s));
    _mm512_storeu_ps(dst + k + 16, _mm512_mul_ps(_mm512_permutexvar_ps(second, grid), s));
  }
}

#pragma GCC diagnostic pop
CEDAR_MULTIVERSION(decode_bf16_row, (const uint16_t* bits, int n, float* dst), (bits, n, dst))

}  // namespace

void dot_tile(const float* x, int m, int n, const float* const* w, int rows, float* y, int ldy) {
  CEDAR_DISPATCH(dot_tile, (x, m, n, w, rows, y, ldy))
}

void decode_fp8_row(const uint8_t* codes, const uint8_t* scales, int n, float* dst) {
  if (cpu_isa() == isa_level::avx512) return decode_fp8_row_avx512_cvt(codes, scales, n, dst);
  CEDAR_DISPATCH(decode_fp8_row, (codes, scales, n, dst))
}

void decode_fp4_row(const uint8_t* packed, const uint8_t* scales, int n, float* dst) {
  if (cpu_isa() == isa_level::avx512) return decode_fp4_row_avx512_cvt(packed, scales, n, dst);
  CEDAR_DISPATCH(decode_fp4_row, (packed, scales, n, dst))
}

void decode_bf16_row(const uint16_t* bits, int n, float* dst) {
  CEDAR_DISPATCH(decode_bf16_row, (bits, n, dst))
}

float dot(const float* a, const float* b, int n) {
  float y = 0.0f;
  dot_tile(a, 1, n, &b, 1, &y, 1);
  return y;
}

}  // namespace cedar::cpu
