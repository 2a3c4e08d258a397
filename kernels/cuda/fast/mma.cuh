// Device building blocks of the tensor-core GEMMs (kernels/cuda/fast/gemm.cu): the e4m3
// m16n8k32 mma, cp.async, and E2M1 -> e4m3 in registers.
//
// K order inside a 32-wide block: thread (g, t) of a warp (g = lane / 4, t = lane % 4) loads the
// 8 bytes k = 8t .. 8t+7 of its rows (one 8-byte load); the first 4 feed the mma's k-slots
// 4t..4t+3, the last 4 the slots 16+4t.. . A and B are permuted the same way, so the block's dot
// product is unchanged; the load is one 32-byte sector per row.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace cedar::cuda::fast::detail {

/// d = A B (from zero) or d += A B: m16n8k16, f16 in, fp32 accumulate.
template <bool Accumulate>
__device__ __forceinline__ void mma_f16x16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  if constexpr (Accumulate)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.0f));
}

/// D = A B, A 16x32 e4m3 (row), B 32x8 e4m3 (col), fp32 out: the e4m3 m16n8k32 product as sm_90
/// runs it (it has no e4m3 mma.sync path): both operands widened to f16, then one m16n8k16 of
/// every register's low code pair (k slots 4t, 4t+1, 16+4t, 16+4t+1) from zero and one of the
/// high pairs on top. Written out rather than left to the compiler, which ends the instruction
/// with four "+ 0.0" adds (a -0 result becomes +0): every tile adds D times a scale into a sum
/// that starts at +0, where a -0 changes nothing, so those adds were pure issue cost. The bits
/// of the e4m3 instruction otherwise (fast::mma_form_mismatches checks it on the device), and
/// the conversions are ordinary instructions the compiler may schedule and share.
__device__ __forceinline__ void mma_e4m3(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  uint32_t al[4], ah[4], bl[2], bh[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) cuda::detail::e4m3x4_to_f16x2(a[i], al[i], ah[i]);
#pragma unroll
  for (int i = 0; i < 2; ++i) cuda::detail::e4m3x4_to_f16x2(b[i], bl[i], bh[i]);
  mma_f16x16<false>(d, al, bl);
  mma_f16x16<true>(d, ah, bh);
}

/// The e4m3 m16n8k32 instruction itself (what mma_e4m3 reproduces; the check's reference).
__device__ __forceinline__ void mma_e4m3_instruction(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.0f));
}

/// prmt.b32 in its default mode: selector nibble i picks byte (i & 7) of {b, a} for output byte
/// i, or, with bit 3 set, that byte's sign replicated over 8 bits.
__host__ __device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else
  const uint64_t bytes = uint64_t(a) | uint64_t(b) << 32;
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (sel >> (4 * i)) & 0xF;
    uint32_t v = uint32_t(bytes >> (8 * (s & 7))) & 0xFF;
    if (s & 8) v = (v & 0x80) ? 0xFF : 0x00;
    d |= v << (8 * i);
  }
  return d;
#endif
}

/// 8 packed E2M1 values (nibble i = element i) -> 8 e4m3 bytes (element i in byte i of
/// .x for i < 4, of .y for i >= 4). Exact: every E2M1 value is an e4m3 value.
__host__ __device__ __forceinline__ uint2 e2m1x8_to_e4m3(uint32_t w) {
  // e4m3 codes of the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6
  constexpr uint32_t lut_lo = 0x3C383000u, lut_hi = 0x4C484440u;
  const uint32_t mag_lo = prmt(lut_lo, lut_hi, w & 0x7777u);
  const uint32_t mag_hi = prmt(lut_lo, lut_hi, (w >> 16) & 0x7777u);
  // sign of nibble i (bit 4i+3) is the msb of a byte of w << 4 (even i) or of w (odd i)
  const uint32_t sign_lo = prmt(w << 4, w, 0xD9C8u);
  const uint32_t sign_hi = prmt(w << 4, w, 0xFBEAu);
  return make_uint2(mag_lo | (sign_lo & 0x80808080u), mag_hi | (sign_hi & 0x80808080u));
}

/// 8 packed E2M1 values (nibble i = element i) -> their e4m3 codes times 2^-6, split by parity:
/// .x holds elements 0, 2, 4, 6 (byte i: element 2i), .y elements 1, 3, 5, 7. A magnitude's
/// three bits at bits 2..4 of a byte are the e4m3 code of that magnitude times 2^-6 (0.5 becomes
/// the subnormal 2^-7), and its sign goes to bit 7: two shifts and masks per parity, no table.
/// Exact; the 2^6 comes back once per summation chunk (fp4_unscale).
__host__ __device__ __forceinline__ uint2 e2m1x8_to_e4m3_scaled(uint32_t w) {
  const uint32_t even = ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);
  const uint32_t odd = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
  return make_uint2(even, odd);
}

/// What sums of products of e2m1x8_to_e4m3_scaled's codes are multiplied by to undo its 2^-6.
constexpr float fp4_unscale = 64.0f;

/// The 8 x codes of a thread's K piece (element i in byte i of .x for i < 4, of .y for i >= 4)
/// in e2m1x8_to_e4m3_scaled's order: elements 0, 2, 4, 6, then 1, 3, 5, 7, so that the mma's k
/// slots pair each weight with its own x.
__host__ __device__ __forceinline__ uint2 fp4_x_order(uint2 v) {
  return make_uint2(prmt(v.x, v.y, 0x6420u), prmt(v.x, v.y, 0x7531u));
}

/// UE8M0 code -> 2^(code-127) (codes 1..254; 0 gives 2^-127, the subnormal 0x00400000; weights
/// never hold 255): cuda::detail::ue8m0_to_f32 without its NaN check, a shift and a max (the
/// max in PTX: left to itself the compiler makes it a compare and a select, one more issue).
__device__ __forceinline__ float ue8m0_value(uint32_t code) {
  uint32_t bits;
  asm("max.u32 %0, %1, %2;" : "=r"(bits) : "r"(code << 23), "r"(0x00400000u));
  return __uint_as_float(bits);
}

/// cp.async of 16 bytes to shared-memory address s (zero-filled when !valid).
__device__ __forceinline__ void cp_async16(uint32_t s, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
/// The same to a generic pointer into shared memory.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  cp_async16(uint32_t(__cvta_generic_to_shared(smem)), gmem, valid);
}
/// cp.async of 4 bytes (zero-filled when !valid).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  const uint32_t s = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

}  // namespace cedar::cuda::fast::detail
