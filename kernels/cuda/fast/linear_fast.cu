// The fast kernel set's linear layers (fast_ops.hpp): the contracts of cuda::linear_fp8/fp4/bf16
// and grouped_output on tensor cores, and the bf16 building blocks the experts' prefill path
// uses too (experts_fast.cu).
//
// Decode (few rows): the gemv tile of gemm.cu (FP8/W4A8, activations quantized to e4m3 codes)
// and a bandwidth-bound bf16 GEMV.
// Prefill (many rows): weights dequantized into a bf16 scratch and a cuBLAS bf16 GEMM with fp32
// accumulation and output. That computes the CPU op's products exactly: an e4m3 code (4
// significant bits, ulp >= 2^-9) or an E2M1 value (2 bits) times a UE8M0 scale >= 2^-124 is a
// bf16 value (bf16 has fp32's exponent range; subnormals down to 2^-133), and so is a fake-quantized
// activation (scale >= 2^-22, fmt::quantize_fp8's floor); the product of two bf16 values is exact
// in fp32. Only the order of the fp32 sums differs. bf16 weights take fp32 activations on the
// CPU (not rounded to bf16): x is split exactly into three bf16 parts (8 + 8 + 8 significant
// bits cover fp32's 24) and the three products are summed into y; wo_a, whose output feeds
// no top-k choice, takes two parts (within 2^-18 of sum|x w|, a quarter of the 2^-16 bound).
#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/fast/experts_wg.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/mma.cuh"
#include "kernels/cuda/internal.cuh"

namespace cedar::cuda::fast {
namespace detail {
namespace {

using cuda::detail::aligned16;
using cuda::detail::blocks_for;
using cuda::detail::scratch;
using cuda::detail::stream;

/// fp32 -> bf16 bits, round to nearest even (exact for values that are bf16 already).
__device__ __forceinline__ uint16_t to_bf16(float x) { return cuda::detail::f32_to_bf16(x); }

// ---- dequantization into bf16 ------------------------------------------------------------------

/// An FP8 weight [n, k] (k % 8 == 0, n k < 2^31) -> bf16 [n, k], by pieces of 8 codes: thread t
/// takes pieces t + i * stride (i < 4, stride = the grid's threads), every load issued before
/// the first conversion (e4m3 -> f16 -> fp32 in hardware: exact), 16 bytes stored a piece.
__global__ void dequant_fp8_kernel(const uint8_t* data, const uint8_t* scale, int n, int k, uint16_t* out) {
  cuda::detail::dependent_start();
  constexpr int per_thread = 4;
  const int pieces = n * (k / 8), per_row = k / 8, scale_cols = (k + 31) / 32;
  const int stride = int(gridDim.x * blockDim.x), q0 = int(blockIdx.x * blockDim.x + threadIdx.x);
  uint2 v[per_thread];
  uint8_t sc[per_thread];
#pragma unroll
  for (int i = 0; i < per_thread; ++i) {
    const int q = q0 + i * stride;
    const int row = q / per_row, col = (q % per_row) * 8;
    v[i] = q < pieces ? __ldg(reinterpret_cast<const uint2*>(data) + q) : make_uint2(0, 0);
    sc[i] = q < pieces ? __ldg(scale + size_t(row / 32) * scale_cols + col / 32) : uint8_t(0);
  }
#pragma unroll
  for (int i = 0; i < per_thread; ++i) {
    const int q = q0 + i * stride;
    if (q >= pieces) break;
    const float s = cuda::detail::ue8m0_to_f32(sc[i]);
    uint32_t o[4];
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const uint32_t word = h < 2 ? v[i].x : v[i].y;
      const float2 f = cuda::detail::e4m3x2_to_f32(word >> (16 * (h % 2)));
      o[h] = uint32_t(to_bf16(f.x * s)) | (uint32_t(to_bf16(f.y * s)) << 16);
    }
    reinterpret_cast<uint4*>(out)[q] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

/// A packed E2M1 weight [n, k] -> bf16 [n, k], by 4-byte words (8 values; four words share a
/// UE8M0 scale: scales are [n, k / 32], the words' order): thread t takes words t + i * stride
/// (i < 4, stride = the grid's threads), all four loads issued before the first conversion, and
/// stores 16 bytes a word, so a warp's loads and stores are each one contiguous span.
__global__ void dequant_fp4_kernel(const uint8_t* data, const uint8_t* scale, long long words, uint16_t* out) {
  cuda::detail::dependent_start();
  __shared__ float lut[16];
  if (threadIdx.x < 16) lut[threadIdx.x] = cuda::detail::e2m1_to_f32(uint8_t(threadIdx.x));
  __syncthreads();
  constexpr int per_thread = 4;
  const long long stride = (long long)gridDim.x * blockDim.x, w0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  uint32_t v[per_thread];
  uint8_t sc[per_thread];
#pragma unroll
  for (int i = 0; i < per_thread; ++i) {
    const long long w = w0 + i * stride;
    v[i] = w < words ? __ldg(reinterpret_cast<const uint32_t*>(data) + w) : 0u;
    sc[i] = w < words ? __ldg(scale + (w >> 2)) : uint8_t(0);
  }
#pragma unroll
  for (int i = 0; i < per_thread; ++i) {
    const long long w = w0 + i * stride;
    if (w >= words) break;
    const float s = cuda::detail::ue8m0_to_f32(sc[i]);
    uint32_t o[4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = (v[i] >> (8 * b)) & 0xFF;  // low nibble = even column
      o[b] = uint32_t(to_bf16(lut[byte & 0xF] * s)) | (uint32_t(to_bf16(lut[byte >> 4] * s)) << 16);
    }
    reinterpret_cast<uint4*>(out)[w] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

/// Four threads per group of 32 (8 values each): row r of out [m, k] is fmt::fake_quant_fp8 of
/// x row rows[r] (or r) as bf16 (exact), its columns in wg_column's order with wg_order. Rows at
/// or past *count (when given) or with rows[r] < 0 are zeros. v / s is computed as v * (1 / s): s
/// is a power of two, so both are the same correctly rounded value.
__global__ void fake_quant_bf16_kernel(const float* x, int ldx, const int32_t* rows, const int* count, int m, int k,
                                       bool wg_order, uint16_t* out) {
  cuda::detail::dependent_start();
  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // 8 values each
  const int per_row = k / 8;
  const bool in = t < (long long)m * per_row;
  const int r = in ? int(t / per_row) : 0, c8 = in ? int(t % per_row) : 0;
  int src = in ? r : -1;
  if (in && count && r >= *count) src = -1;
  else if (in && rows) src = rows[r];
  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (src >= 0) {
    const float4* p = reinterpret_cast<const float4*>(x + size_t(src) * ldx + c8 * 8);
    const float4 a = p[0], b = p[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
  const uint4 q = cuda::detail::fake_quant8_bf16(v);
  if (in) store8(out + size_t(r) * k, c8, q, wg_order);
}

/// x [m, k] (row stride ldx) -> out [Parts, m, k] bf16: each part the residual of the ones
/// before, rounded (exact in fp32). Three parts give x exactly; two leave |x - hi - lo| <=
/// 2^-18 |x|. Grid (m, ceil(k / 4 / blockDim.x)): four values a thread, with Vec (k % 4 == 0,
/// ldx % 4 == 0, x 16-byte aligned) one 16-byte load and one 8-byte store a part.
template <int Parts, bool Vec>
__global__ void split_kernel(const float* x, int ldx, int m, int k, uint16_t* out) {
  cuda::detail::dependent_start();
  const int r = int(blockIdx.x), c0 = 4 * int(blockIdx.y * blockDim.x + threadIdx.x);
  if (c0 >= k) return;
  const float* xr = x + size_t(r) * ldx;
  float rest[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if constexpr (Vec) {
    const float4 v = *reinterpret_cast<const float4*>(xr + c0);
    rest[0] = v.x, rest[1] = v.y, rest[2] = v.z, rest[3] = v.w;
  } else {
    for (int i = 0; i < 4 && c0 + i < k; ++i) rest[i] = xr[c0 + i];
  }
  const size_t n = size_t(m) * k;
#pragma unroll
  for (int p = 0; p < Parts; ++p) {
    uint16_t h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      h[i] = to_bf16(rest[i]);
      rest[i] -= cuda::detail::bf16_to_f32(h[i]);
    }
    uint16_t* o = out + p * n + size_t(r) * k + c0;
    if constexpr (Vec) {
      *reinterpret_cast<uint2*>(o) =
          make_uint2(uint32_t(h[0]) | uint32_t(h[1]) << 16, uint32_t(h[2]) | uint32_t(h[3]) << 16);
    } else {
      for (int i = 0; i < 4 && c0 + i < k; ++i) o[i] = h[i];
    }
  }
}

// ---- bf16 GEMV (decode) ------------------------------------------------------------------------

constexpr int gemv_warps = 8;

/// The weight's 8-value pieces as fp32: a bf16 weight (16 bytes a piece), or an FP8 one (8 bytes
/// of e4m3 codes and the 32x32 tile's UE8M0 scale; wo_a as the checkpoint stores it) whose
/// products are the bf16 form's: a code times its scale is the bf16 value exactly (scale codes
/// >= 3, which the model checks before it keeps the FP8 form), so both give the same bits.
struct bf16_rows {
  static constexpr int unroll = 4;  ///< pieces a lane keeps in flight
  const uint16_t* w;
  long long group;  ///< elements between groups
  struct row {
    const uint4* p;
    using raw = uint4;  ///< a piece as loaded (load), turned into values by expand
    __device__ __forceinline__ raw load(int c) const { return __ldg(p + c); }
    __device__ __forceinline__ static void expand(const raw& v, float (&wf)[8]) {
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        wf[2 * i] = __uint_as_float(words[i] << 16);
        wf[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
      }
    }
    __device__ __forceinline__ void piece(int c, float (&wf)[8]) const { expand(load(c), wf); }
  };
  __device__ __forceinline__ row at(int z, int col, int k) const {
    return {reinterpret_cast<const uint4*>(w + z * group + size_t(col) * k)};
  }
};

struct fp8_rows {
  static constexpr int unroll = 8;  ///< half the bytes a piece: twice the pieces in flight
  const uint8_t* w;
  const uint8_t* scale;       ///< [ceil(rows / 32), k / 32]
  long long group, s_group;  ///< codes and scale bytes between groups (group rows % 32 == 0)
  struct row {
    const uint2* p;
    const uint8_t* s;
    struct raw {
      uint2 v;
      uint8_t s;
    };
    __device__ __forceinline__ raw load(int c) const { return {__ldg(p + c), __ldg(s + c / 4)}; }
    __device__ __forceinline__ void piece(int c, float (&wf)[8]) const { expand(load(c), wf); }
    __device__ __forceinline__ static void expand(const raw& r, float (&wf)[8]) {
      const uint2 v = r.v;
      const float sc = cuda::detail::ue8m0_to_f32(r.s);
      const uint32_t words[2] = {v.x, v.y};
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float2 f = cuda::detail::e4m3x2_to_f32(words[i] >> (16 * h));
          wf[4 * i + 2 * h] = f.x * sc;
          wf[4 * i + 2 * h + 1] = f.y * sc;
        }
    }
  };
  __device__ __forceinline__ row at(int z, int col, int k) const {
    return {reinterpret_cast<const uint2*>(w + z * group + size_t(col) * k),
            scale + z * s_group + size_t(col / 32) * (k / 32)};
  }
};

/// s plus a piece's 8 products, in order, each a fused multiply-add (one rounding a term: half
/// the instructions of a product and a sum, which at 8 rows bound the GEMV; the CPU op rounds
/// twice, within the 2^-16 bound either way).
__device__ __forceinline__ float piece_dot(float s, const float (&wf)[8], const float4& a, const float4& b) {
  s = __fmaf_rn(wf[0], a.x, s), s = __fmaf_rn(wf[1], a.y, s), s = __fmaf_rn(wf[2], a.z, s);
  s = __fmaf_rn(wf[3], a.w, s), s = __fmaf_rn(wf[4], b.x, s), s = __fmaf_rn(wf[5], b.y, s);
  s = __fmaf_rn(wf[6], b.z, s), s = __fmaf_rn(wf[7], b.w, s);
  return s;
}

/// Column mode, grid (ceil(m / R), ceil(n / 8), groups): warp w computes column 8 by + w for
/// rows R bx .. (+R), group bz: y[r, c] = sum_k x[r, k] w[c, k], fused multiply-adds
/// (piece_dot) by lane (k in 8-wide pieces, lane l takes pieces l, l + 32, ...) then by the shuffle
/// fold. Split mode (Split, for weights of few columns, which would leave most SMs idle), grid
/// (ceil(m / R), n, groups): block by computes column by, its warp w the w-th eighth of the
/// pieces as above, and the warps' sums are added in warp order. The mode is chosen by n and
/// groups only, so a row's bits do not depend on R or m. Needs k % 8 == 0 and 16-byte aligned
/// rows.
template <int R, bool Split, class W>
__global__ void __launch_bounds__(gemv_warps * 32)
    gemv_bf16_kernel(const float* x, int ldx, long long x_group, int m, W w, int n, int k, float* y, int ldy,
                     long long y_group, bool early) {
  if (!early) cuda::detail::grid_dependency_wait();  // (A/B runs: tuning::gemv_weight_early)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col = Split ? int(blockIdx.y) : int(blockIdx.y) * gemv_warps + warp;
  if (!Split && col >= n) return;
  x += blockIdx.z * x_group, y += blockIdx.z * y_group;
  const int r0 = blockIdx.x * R;
  const typename W::row wr = w.at(int(blockIdx.z), col, k);
  const int pieces = k / 8;
  const int share = Split ? (pieces + gemv_warps - 1) / gemv_warps : pieces;
  const int p0 = Split ? warp * share : 0, p1 = min(pieces, p0 + share);
  // a lane's first W::unroll weight pieces before the wait (no kernel writes the weight): as a
  // dependent launch the block may start while the kernels before it run, and its weight then
  // streams beside them
  constexpr int U = W::unroll;
  typename W::row::raw first[U];
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (p0 + lane + 32 * u < p1) first[u] = wr.load(p0 + lane + 32 * u);
  cuda::detail::dependent_start();
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  const auto add_piece = [&](int c, const float (&wf)[8]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r0 + r >= m) break;
      const float4* xr = reinterpret_cast<const float4*>(x + size_t(r0 + r) * ldx) + 2 * c;
      const float4 a = xr[0], b = xr[1];
      acc[r] = piece_dot(acc[r], wf, a, b);
    }
  };
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (p0 + lane + 32 * u >= p1) break;
    float wf[8];
    W::row::expand(first[u], wf);
    add_piece(p0 + lane + 32 * u, wf);
  }
#pragma unroll W::unroll
  for (int c = p0 + lane + 32 * U; c < p1; c += 32) {
    float wf[8];
    wr.piece(c, wf);
    add_piece(c, wf);
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    for (int off = 16; off >= 1; off /= 2) acc[r] = acc[r] + __shfl_xor_sync(0xFFFFFFFFu, acc[r], off);
  if constexpr (Split) {
    __shared__ float sums[gemv_warps][R];
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r) sums[warp][r] = acc[r];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      acc[r] = 0.0f;
      for (int v = 0; v < gemv_warps; ++v) acc[r] = acc[r] + sums[v][r];
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (lane == 0 && r0 + r < m) y[size_t(r0 + r) * ldy + col] = acc[r];
}

/// Column mode at one row, C columns a warp (tuning::gemv_one_row_cols): a lane loads each x
/// piece once for its C columns and keeps U pieces of every column in flight, the next U loading
/// while it sums the current ones; fewer, longer warps than gemv_bf16_kernel's one column each.
/// The sums and their order are gemv_bf16_kernel's (lane l: pieces l, l + 32, ... in order, then
/// the xor fold), so the bits are the same. grid (1, ceil(n / (gemv_warps C)), groups); warp w
/// takes columns C (gemv_warps by + w) + q, q < C. codes (needs gemv_warps C = 32, n % 32 == 0
/// and y_group % 32 == 0): a block's 32 outputs, one FP8 group, also as codes and a scale, the
/// bits of quantize_kernel (codes at y's offsets, scales a 32).
template <int C, int U, class W>
__global__ void __launch_bounds__(gemv_warps * 32)
    gemv_cols_kernel(const float* x, long long x_group, W w, int n, int k, float* y, long long y_group, bool early,
                     uint8_t* codes, float* scales) {
  if (!early) cuda::detail::grid_dependency_wait();  // (A/B runs: tuning::gemv_weight_early)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col0 = (int(blockIdx.y) * gemv_warps + warp) * C;
  if (col0 >= n) return;
  x += blockIdx.z * x_group, y += blockIdx.z * y_group;
  typename W::row wr[C];
#pragma unroll
  for (int q = 0; q < C; ++q) wr[q] = w.at(int(blockIdx.z), min(col0 + q, n - 1), k);  // past n: read, not kept
  const int pieces = k / 8;
  typename W::row::raw cur[U][C], next[U][C];
  const auto fetch = [&](typename W::row::raw(&into)[U][C], int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int q = 0; q < C; ++q)
        if (c0 + 32 * u < pieces) into[u][q] = wr[q].load(c0 + 32 * u);
  };
  // the first pieces before the wait (no kernel writes the weight): they stream while the
  // kernels before this one end
  fetch(cur, lane);
  cuda::detail::dependent_start();
  float acc[C];
#pragma unroll
  for (int q = 0; q < C; ++q) acc[q] = 0.0f;
  for (int c0 = lane; c0 < pieces; c0 += 32 * U) {
    fetch(next, c0 + 32 * U);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + 32 * u;
      if (c >= pieces) break;
      const float4* xr = reinterpret_cast<const float4*>(x) + 2 * c;
      const float4 a = xr[0], b = xr[1];
#pragma unroll
      for (int q = 0; q < C; ++q) {
        float wf[8];
        W::row::expand(cur[u][q], wf);
        acc[q] = piece_dot(acc[q], wf, a, b);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int q = 0; q < C; ++q) cur[u][q] = next[u][q];
  }
#pragma unroll
  for (int q = 0; q < C; ++q)
    for (int off = 16; off >= 1; off /= 2) acc[q] = acc[q] + __shfl_xor_sync(0xFFFFFFFFu, acc[q], off);
  if constexpr (gemv_warps * C == 32) {
    if (codes != nullptr) {
      __shared__ float group[32];  // (every warp of the block is here: n % 32 == 0)
      if (lane == 0)
#pragma unroll
        for (int q = 0; q < C; ++q) y[col0 + q] = acc[q], group[warp * C + q] = acc[q];
      __syncthreads();
      if (warp != 0) return;
      const long long at = blockIdx.z * y_group + (long long)blockIdx.y * 32;  // the group's first output
      const float s = cuda::detail::fp8_group_code(group[lane], codes[at + lane]);
      if (lane == 0) scales[at / 32] = s;
      return;
    }
  }
  if (lane != 0) return;
#pragma unroll
  for (int q = 0; q < C; ++q)
    if (col0 + q < n) y[col0 + q] = acc[q];
}

/// Column mode at several rows. gemv_bf16_kernel's warps each read all of x's rows for their one
/// column, which at 8 rows no longer stays in the L1 (wo_a: 8 x 4096 fp32 = 128 KB a warp, 1 GB
/// a decode step from L2; the head 20 GB). Here a block stages x's rows in shared memory, a K
/// chunk at a time (double-buffered, each row's pieces as two planes of 4 values so that a
/// quarter warp's 16-byte loads are contiguous), and each warp computes C columns from every x
/// load. The sums and their order are the column mode's (lane l: pieces l, l + 32, ... in order;
/// then the xor fold), so a row's bits are those of gemv_bf16_kernel at any R and m.
/// grid (ceil(m / R), ceil(n / (gemv_warps C)), groups); warp w takes columns C (gemv_warps by +
/// w) + q, q < C.
constexpr int staged_pieces = 2;                               ///< pieces a lane takes from a chunk
constexpr int staged_chunk = 32 * staged_pieces * 8;           ///< K values a chunk
template <int R>
constexpr int staged_smem = 2 * R * staged_chunk * int(sizeof(float));

template <int R, int C, class W>
__global__ void __launch_bounds__(gemv_warps * 32, R <= 8 ? 2 : 1)  // two blocks an SM to 8 rows
    gemv_staged_kernel(const float* x, int ldx, long long x_group, int m, W w, int n, int k, float* y, int ldy,
                       long long y_group) {
  extern __shared__ __align__(16) float xs[];  // [2][R][2 planes][staged_chunk / 2]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col0 = (int(blockIdx.y) * gemv_warps + warp) * C;
  x += blockIdx.z * x_group, y += blockIdx.z * y_group;
  const int r0 = blockIdx.x * R, rows = min(R, m - r0);
  typename W::row wr[C];
#pragma unroll
  for (int q = 0; q < C; ++q) wr[q] = w.at(int(blockIdx.z), min(col0 + q, n - 1), k);  // past n: read, not kept
  const int pieces = k / 8, chunks = (pieces + 32 * staged_pieces - 1) / (32 * staged_pieces);
  // chunk ch into buffer b: 16-byte units u = (row, piece, plane), a thread's units strided
  const auto stage = [&](int ch, int b) {
    float* dst = xs + b * R * staged_chunk;
    const int p0 = ch * 32 * staged_pieces;
    for (int u = threadIdx.x; u < R * 64 * staged_pieces; u += blockDim.x) {
      const int r = u / (64 * staged_pieces), rest = u % (64 * staged_pieces), pc = rest / 2, plane = rest % 2;
      if (p0 + pc >= pieces) continue;
      const bool live = r < rows;  // rows past m: zeros
      cp_async16(dst + (r * 2 + plane) * (staged_chunk / 2) + pc * 4,
                 live ? x + size_t(r0 + r) * ldx + size_t(p0 + pc) * 8 + plane * 4 : x, live);
    }
  };
  float acc[R][C];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int q = 0; q < C; ++q) acc[r][q] = 0.0f;
  // the first chunk's weight pieces before the wait (no kernel writes the weight)
  typename W::row::raw raw[staged_pieces][C];
  const auto fetch = [&](int ch) {
#pragma unroll
    for (int j = 0; j < staged_pieces; ++j) {
      const int c = ch * 32 * staged_pieces + j * 32 + lane;
#pragma unroll
      for (int q = 0; q < C; ++q)
        if (c < pieces) raw[j][q] = wr[q].load(c);
    }
  };
  fetch(0);
  cuda::detail::dependent_start();
  stage(0, 0);
  cp_async_commit();
  for (int ch = 0; ch < chunks; ++ch) {
    if (ch + 1 < chunks) stage(ch + 1, (ch + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const float* buf = xs + (ch & 1) * R * staged_chunk;
#pragma unroll
    for (int j = 0; j < staged_pieces; ++j) {
      const int c = ch * 32 * staged_pieces + j * 32 + lane;
      if (c >= pieces) break;
      float wf[C][8];
#pragma unroll
      for (int q = 0; q < C; ++q) W::row::expand(raw[j][q], wf[q]);
      // piece_dot's terms in its order for each (row, column), the rows and columns interleaved
      // term by term (a warp issues in program order: R C independent adds between dependent
      // ones); rows past m are zeros, computed and not stored
      const int pc = j * 32 + lane;
#pragma unroll
      for (int plane = 0; plane < 2; ++plane) {
        float4 xv[R];
#pragma unroll
        for (int r = 0; r < R; ++r)
          xv[r] = *reinterpret_cast<const float4*>(buf + (r * 2 + plane) * (staged_chunk / 2) + pc * 4);
#pragma unroll
        for (int e = 0; e < 4; ++e)
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const float xe = e == 0 ? xv[r].x : e == 1 ? xv[r].y : e == 2 ? xv[r].z : xv[r].w;
#pragma unroll
            for (int q = 0; q < C; ++q) acc[r][q] = __fmaf_rn(wf[q][plane * 4 + e], xe, acc[r][q]);
          }
      }
    }
    if (ch + 1 < chunks) fetch(ch + 1);  // the next chunk's weight loads in flight over the barrier
    __syncthreads();  // the buffer is staged again two chunks on
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int q = 0; q < C; ++q)
      for (int off = 16; off >= 1; off /= 2) acc[r][q] = acc[r][q] + __shfl_xor_sync(0xFFFFFFFFu, acc[r][q], off);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int q = 0; q < C; ++q)
      if (r < rows && col0 + q < n) y[size_t(r0 + r) * ldy + col0 + q] = acc[r][q];
}

/// Split mode for weights whose column blocks would not cover the SMs (layer_ops' router gate
/// of 64 experts, the indexer's head weights: 8 and 4 blocks a row).
bool gemv_split(int n, int groups) {
  return (long long)((n + gemv_warps - 1) / gemv_warps) * groups < cuda::detail::num_sms();
}

template <int R, class W>
void launch_gemv_r(const float* x, int ldx, long long xg, int m, const W& w, int n, int k, float* y, int ldy,
                   long long yg, int groups) {
  const bool split = gemv_split(n, groups);
  const dim3 grid((m + R - 1) / R, split ? n : (n + gemv_warps - 1) / gemv_warps, groups);
  CEDAR_CUDA_REQUIRE(grid.y <= 65535, "gemv_bf16: at most 524280 columns");
  if (split)
    cuda::detail::launch_dependent(gemv_bf16_kernel<R, true, W>, grid, dim3(gemv_warps * 32), 0, x, ldx, xg, m, w, n,
                                   k, y, ldy, yg, tuning_now().gemv_weight_early);
  else
    cuda::detail::launch_dependent(gemv_bf16_kernel<R, false, W>, grid, dim3(gemv_warps * 32), 0, x, ldx, xg, m, w, n,
                                   k, y, ldy, yg, tuning_now().gemv_weight_early);
}

template <int C, int U, class W>
void launch_gemv_cols(const float* x, long long xg, const W& w, int n, int k, float* y, long long yg, int groups,
                      uint8_t* codes = nullptr, float* scales = nullptr) {
  const dim3 grid(1, (n + gemv_warps * C - 1) / (gemv_warps * C), groups);
  CEDAR_CUDA_REQUIRE(grid.y <= 65535, "gemv_bf16: too many columns");
  cuda::detail::launch_dependent(gemv_cols_kernel<C, U, W>, grid, dim3(gemv_warps * 32), 0, x, xg, w, n, k, y, yg,
                                 tuning_now().gemv_weight_early, codes, scales);
}

template <int R, int C, class W>
void launch_gemv_staged(const float* x, int ldx, long long xg, int m, const W& w, int n, int k, float* y, int ldy,
                        long long yg, int groups) {
  const dim3 grid((m + R - 1) / R, (n + gemv_warps * C - 1) / (gemv_warps * C), groups);
  CEDAR_CUDA_REQUIRE(grid.y <= 65535, "gemv_bf16: too many columns");
  constexpr auto kernel = gemv_staged_kernel<R, C, W>;
  cuda::detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), staged_smem<R>);
  cuda::detail::launch_dependent(kernel, grid, dim3(gemv_warps * 32), staged_smem<R>, x, ldx, xg, m, w, n, k, y, ldy,
                                 yg);
}

template <class W>
void launch_gemv(const float* x, int ldx, long long xg, int m, const W& w, int n, int k, float* y, int ldy,
                 long long yg, int groups) {
  if (m >= tuning_now().gemv_staged_min_rows && !gemv_split(n, groups)) {
    if (m == 2) launch_gemv_staged<2, 4>(x, ldx, xg, m, w, n, k, y, ldy, yg, groups);
    else if (m <= 4) launch_gemv_staged<4, 4>(x, ldx, xg, m, w, n, k, y, ldy, yg, groups);
    else if (m <= 8) launch_gemv_staged<8, 4>(x, ldx, xg, m, w, n, k, y, ldy, yg, groups);
    else launch_gemv_staged<16, 4>(x, ldx, xg, m, w, n, k, y, ldy, yg, groups);
    return;
  }
  if (m == 1 && !gemv_split(n, groups)) {
    const tuning& t = tuning_now();
    if (t.gemv_one_row_cols == 2 && t.gemv_one_row_unroll == 2) return launch_gemv_cols<2, 2>(x, xg, w, n, k, y, yg, groups);
    if (t.gemv_one_row_cols == 2 && t.gemv_one_row_unroll == 4) return launch_gemv_cols<2, 4>(x, xg, w, n, k, y, yg, groups);
    if (t.gemv_one_row_cols == 4 && t.gemv_one_row_unroll == 2) return launch_gemv_cols<4, 2>(x, xg, w, n, k, y, yg, groups);
    if (t.gemv_one_row_cols == 4 && t.gemv_one_row_unroll == 4) return launch_gemv_cols<4, 4>(x, xg, w, n, k, y, yg, groups);
  }
  if (m == 1) launch_gemv_r<1>(x, ldx, xg, m, w, n, k, y, ldy, yg, groups);
  else if (m == 2) launch_gemv_r<2>(x, ldx, xg, m, w, n, k, y, ldy, yg, groups);
  else if (m <= 4) launch_gemv_r<4>(x, ldx, xg, m, w, n, k, y, ldy, yg, groups);
  else launch_gemv_r<8>(x, ldx, xg, m, w, n, k, y, ldy, yg, groups);
}

// ---- cuBLAS --------------------------------------------------------------------------------

cublasHandle_t blas() {
  thread_local cublasHandle_t h = [] {
    cublasHandle_t x = nullptr;
    if (cublasCreate(&x) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasCreate failed\n");
      std::abort();
    }
    cublasSetMathMode(x, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    return x;
  }();  // one per thread for the process's life
  cublasSetStream(h, stream());
  return h;
}

void blas_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s failed: cuBLAS status %d\n", what, int(st));
    std::abort();
  }
}

}  // namespace

// ---- building blocks -----------------------------------------------------------------------------

void dequant_bf16(const fp8_weight& w, uint16_t* out) {
  CEDAR_CUDA_REQUIRE(w.in % 8 == 0 && (long long)w.out * w.in < (1ll << 31), "dequant_bf16: in % 8 == 0, < 2^31 codes");
  const long long pieces = (long long)w.out * w.in / 8;
  if (pieces == 0) return;
  cuda::detail::launch_dependent(dequant_fp8_kernel, dim3(blocks_for((pieces + 3) / 4, 256)), dim3(256), 0, w.data,
                                 w.scale, w.out, w.in, out);
}

void dequant_bf16(const fp4_weight& w, uint16_t* out, void* on_stream) {
  CEDAR_CUDA_REQUIRE(w.in % 32 == 0, "dequant_bf16: in % 32 == 0");
  const long long words = (long long)w.out * w.in / 8;
  if (words == 0) return;
  const unsigned blocks = blocks_for((words + 3) / 4, 256);  // four words a thread
  if (on_stream == nullptr) {
    cuda::detail::launch_dependent(dequant_fp4_kernel, dim3(blocks), dim3(256), 0, w.data, w.scale, words, out);
    return;
  }
  dequant_fp4_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(on_stream)>>>(w.data, w.scale, words, out);
  CEDAR_CUDA_CHECK(cudaGetLastError());
}

void fake_quant_bf16(const float* x, int ldx, const int32_t* rows, const int* count, int m, int k, uint16_t* out,
                     bool wg_order) {
  CEDAR_CUDA_REQUIRE(k % 32 == 0 && ldx % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
                     "fake_quant_bf16: k % 32 == 0, 16-byte aligned rows");
  const long long threads = (long long)m * k / 8;
  if (threads == 0) return;
  cuda::detail::launch_dependent(fake_quant_bf16_kernel, dim3(blocks_for(threads, 256)), dim3(256), 0, x, ldx, rows,
                                 count, m, k, wg_order, out);
}

void split_bf16(const float* x, int ldx, int m, int k, int parts, uint16_t* out) {
  CEDAR_CUDA_REQUIRE(parts == 2 || parts == 3, "split_bf16: two or three parts");
  if (m <= 0 || k <= 0) return;
  const bool vec = k % 4 == 0 && ldx % 4 == 0 && aligned16(x) && aligned16(out);
  const auto kernel = parts == 2 ? (vec ? split_kernel<2, true> : split_kernel<2, false>)
                                 : (vec ? split_kernel<3, true> : split_kernel<3, false>);
  const dim3 grid(unsigned(m), blocks_for((k + 3) / 4, 256));
  cuda::detail::launch_dependent(kernel, grid, dim3(256), 0, x, ldx, m, k, out);
}

void gemm_bf16(const uint16_t* a, int lda, int m, const uint16_t* w, int ldw, int n, int k, float* y, int ldy,
               bool accumulate, int batch, long long a_stride, long long w_stride, long long y_stride) {
  if (m <= 0 || n <= 0) return;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // row-major y [m, n] = a [m, k] w[n, k]^T is column-major y^T [n, m] = w^T (k x n)^T a^T (k x m)
  if (batch == 1)
    blas_check(cublasGemmEx(blas(), CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, ldw, a, CUDA_R_16BF,
                            lda, &beta, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
  else
    blas_check(cublasGemmStridedBatchedEx(blas(), CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, ldw,
                                          w_stride, a, CUDA_R_16BF, lda, a_stride, &beta, y, CUDA_R_32F, ldy, y_stride,
                                          batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx");
}

bool gemv_bf16(const float* x, int ldx, int m, const uint16_t* w, int n, int k, float* y, int ldy, int groups,
               long long x_group, long long w_group, long long y_group) {
  if (k % 8 != 0 || ldx % 4 != 0 || x_group % 4 != 0 || w_group % 8 != 0 || !aligned16(x) || !aligned16(w))
    return false;
  if (m <= 0 || n <= 0) return true;
  launch_gemv(x, ldx, x_group, m, bf16_rows{w, w_group}, n, k, y, ldy, y_group, groups);
  return true;
}

bool gemv_fp8w(const float* x, int ldx, int m, const fp8_weight& w, int n, int k, float* y, int ldy, int groups,
               long long x_group, long long y_group) {
  if (k % 32 != 0 || n % 32 != 0 || w.out != n * groups || w.in != k || ldx % 4 != 0 || x_group % 4 != 0 ||
      !aligned16(x) || reinterpret_cast<uintptr_t>(w.data) % 8 != 0)
    return false;
  if (m <= 0 || n <= 0) return true;
  const fp8_rows rows{w.data, w.scale, (long long)n * k, (long long)(n / 32) * (k / 32)};
  launch_gemv(x, ldx, x_group, m, rows, n, k, y, ldy, y_group, groups);
  return true;
}

bool gemv_fp8w_codes(const float* x, int ldx, const fp8_weight& w, int n, int k, float* y, int groups,
                     long long x_group, long long y_group, uint8_t* codes, float* scales) {
  const tuning& t = tuning_now();
  if (!t.gemv_codes || t.gemv_one_row_cols != 4 || t.gemv_one_row_unroll != 2 || gemv_split(n, groups) ||
      y_group % 32 != 0 || y_group < n || k % 32 != 0 || n % 32 != 0 || w.out != n * groups || w.in != k ||
      ldx % 4 != 0 || x_group % 4 != 0 || !aligned16(x) || reinterpret_cast<uintptr_t>(w.data) % 8 != 0)
    return false;
  const fp8_rows rows{w.data, w.scale, (long long)n * k, (long long)(n / 32) * (k / 32)};
  launch_gemv_cols<4, 2>(x, x_group, rows, n, k, y, y_group, groups, codes, scales);
  return true;
}

}  // namespace detail

using namespace detail;

namespace {

void batch_invariance(tuning& t, bool on) {
  t.stream_max_rows = on ? stream_max_slots : 2;
  t.attention_split_rows = on ? stream_max_slots : 0;
  t.expert_stream_max_rows = on ? 0 : 2;
}

}  // namespace

tuning& tuning_now() {
  static tuning t = [] {
    tuning d;
    // NAME=0: a path off (A/B runs)
    const auto is_off = [](const char* name) {
      const char* env = std::getenv(name);
      return env && std::string(env) == "0";
    };
    // CEDAR_GPU_STREAM_TILE=0: no dense weight on the stream tile (A/B runs of the model)
    if (is_off("CEDAR_GPU_STREAM_TILE")) d.stream_min_out = std::numeric_limits<int>::max();
    // CEDAR_GPU_BATCH_INVARIANT=0: the fastest tile at each row count, though a row's bits then
    // depend on how many rows it is batched with
    if (is_off("CEDAR_GPU_BATCH_INVARIANT")) batch_invariance(d, false);
    // CEDAR_GPU_GEMV_EARLY=0 / CEDAR_GPU_BOUNDARY_EARLY=0: the one-row GEMV / the one-launch mHC
    // boundary load no weight before their dependency wait
    if (is_off("CEDAR_GPU_GEMV_EARLY")) d.gemv_weight_early = false;
    if (is_off("CEDAR_GPU_BOUNDARY_EARLY")) d.boundary_weight_early = false;
    // CEDAR_GPU_GEMV_CODES=0: wo_a's one-row GEMV leaves wo_b's codes to their own launch
    if (is_off("CEDAR_GPU_GEMV_CODES")) d.gemv_codes = false;
    // CEDAR_GPU_GEMV_COLS=C[xU]: the one-row GEMV's columns a warp (1: one, gemv_bf16_kernel;
    // 2 or 4: gemv_cols_kernel) and pieces of each column in flight (2 or 4)
    if (const char* env = std::getenv("CEDAR_GPU_GEMV_COLS"); env && *env) {
      int c = 0, u = d.gemv_one_row_unroll;
      const int got = std::sscanf(env, "%dx%d", &c, &u);
      if (got >= 1 && (c == 1 || ((c == 2 || c == 4) && (u == 2 || u == 4)))) d.gemv_one_row_cols = c, d.gemv_one_row_unroll = u;
      else std::fprintf(stderr, "cedar: CEDAR_GPU_GEMV_COLS='%s' is not 1, or 2 or 4 with x2 or x4; ignored\n", env);
    }
    // NAME=N, where set: a path from N rows on (0: never)
    const auto rows_from = [](const char* name, int& min_rows) {
      if (const char* env = std::getenv(name); env && *env) {
        const int v = std::atoi(env);
        min_rows = v <= 0 ? std::numeric_limits<int>::max() : v;
      }
    };
    rows_from("CEDAR_GPU_GEMV_STAGED_FROM", d.gemv_staged_min_rows);    // the bf16 GEMV's staged mode
    rows_from("CEDAR_GPU_EXPERT_PAIRS_FROM", d.expert_pairs_min_rows);  // routed experts on x's pairs
    rows_from("CEDAR_GPU_EXPERT_WG_FROM", d.expert_wg_min_rows);        // routed experts on wgmma
    // CEDAR_GPU_EXPERT_WG_TILE=16|32|64|128|256: the wgmma experts' token tile (A/B runs)
    if (const char* env = std::getenv("CEDAR_GPU_EXPERT_WG_TILE"); env && *env) {
      const int v = std::atoi(env);
      if (is_wg_tile(v)) d.expert_wg_tile = v;
      else std::fprintf(stderr, "cedar: CEDAR_GPU_EXPERT_WG_TILE='%s' is not 16, 32, 64, 128 or 256; ignored\n", env);
    }
    return d;
  }();
  return t;
}

void set_batch_invariant(bool on) { batch_invariance(tuning_now(), on); }

// ---- linear layers -----------------------------------------------------------------------------

namespace {

/// A weight the split tiles stream at up to 8 rows: their shape, and K long enough to split.
bool split_fits(int n, int k, const tuning& tune) { return n % 16 == 0 && k % 128 == 0 && k >= tune.split_min_k; }

template <class W>
void prefill_linear(const float* x, int m, const W& w, float* y) {
  const uint16_t* kept = nullptr;  // a bf16 copy the model keeps (fp8_weight::bf16)
  if constexpr (std::is_same_v<W, fp8_weight>) kept = w.bf16;
  scratch<uint16_t> wb(kept ? 0 : size_t(w.out) * w.in), xb(size_t(m) * w.in);
  if (!kept) dequant_bf16(w, wb.get());
  fake_quant_bf16(x, w.in, nullptr, nullptr, m, w.in, xb.get());
  gemm_bf16(xb.get(), w.in, m, kept ? kept : wb.get(), w.in, w.out, w.in, y, w.out, false);
}

/// The tile quantized_linear streams w with at m rows, or nothing: the bf16 prefill path.
template <bool FP4, class W>
std::optional<tile_kind> quantized_tile(int m, const W& w) {
  const tuning& tune = tuning_now();
  const bool gemv = m <= tune.gemv_max_rows && gemv_shape(w.out, w.in);
  bool kept = false;  // a bf16 copy the model keeps: its GEMM beats the tile
  if constexpr (!FP4) kept = w.bf16 != nullptr;
  const bool narrow_fits = w.out % 64 == 0 && w.in % 256 == 0;  // the narrow and narrow32 tiles
  const bool tiled = !gemv && !kept && narrow_fits && m <= tune.fp8_narrow_max_rows &&
                     (long long)w.out * w.in >= tune.fp8_narrow_min_weight;
  const bool split = m <= 8 && split_fits(w.out, w.in, tune) && w.out >= tune.split_min_out;
  const bool narrow = !split && narrow_fits && m <= 8 && w.out >= tune.dense_stream_min_out;
  bool stream = false;  // the stream tile: FP8, short K, many rows (FP4 dense weights stay on the tiles)
  if constexpr (!FP4)
    stream = m <= std::min(tune.stream_max_rows, stream_max_slots) && w.in <= tune.stream_max_k &&
             w.out >= tune.stream_min_out && stream_shape(false, w.out, w.in);
  if (stream) return tile_kind::stream;
  if (!(gemv || tiled || narrow || split)) return std::nullopt;
  return split ? tile_kind::split4 : narrow ? tile_kind::narrow : gemv ? tile_kind::gemv : tile_kind::narrow32;
}

template <bool FP4, class W>
void quantized_linear(const float* x, int m, const W& w, float* y, const uint8_t* xq = nullptr,
                      const float* xs = nullptr) {
  CEDAR_CUDA_REQUIRE(w.in % 32 == 0, "fast linear: in is a multiple of 32");
  if (m <= 0) return;
  const std::optional<tile_kind> t = quantized_tile<FP4>(m, w);
  if (!t) return prefill_linear(x, m, w, y);
  scratch<uint8_t> q(xq ? 0 : size_t(m) * w.in);
  scratch<float> s(xq ? 0 : size_t(m) * (w.in / 32));
  if (!xq) {
    quantize_rows_fp8(x, m, w.in, q.get(), s.get());
    xq = q.get(), xs = s.get();
  }
  if constexpr (FP4) gemm_fp4(xq, xs, m, w, y, *t);
  else gemm_fp8(xq, xs, m, w, y, *t);
}

/// y [m, n] (row stride ldy) = x [m, k] (row stride ldx) W^T for bf16 W, by the split of x into
/// `parts` bf16 parts, one GEMM pass each (3: the CPU op's products; 2: within 2^-18 of
/// sum|x w|); groups > 1: a batch of groups with the given element strides.
void split_gemm(const float* x, int ldx, int m, const uint16_t* w, int n, int k, float* y, int ldy, int parts,
                int groups, long long x_group, long long w_group, long long y_group) {
  const int kx = groups * k;  // the split covers the groups side by side when they are (x_group == k)
  const bool side_by_side = groups == 1 || x_group == k;
  CEDAR_CUDA_REQUIRE(side_by_side, "split_gemm: groups side by side in x");
  scratch<uint16_t> xb(size_t(parts) * m * kx);
  split_bf16(x, ldx, m, kx, parts, xb.get());
  for (int p = 0; p < parts; ++p)
    gemm_bf16(xb.get() + size_t(p) * m * kx, kx, m, w, k, n, k, y, ldy, p > 0, groups, k, w_group, y_group);
}

}  // namespace

void linear_fp8(const float* x, int m, const fp8_weight& w, float* y, const uint8_t* xq, const float* xs) {
  quantized_linear<false>(x, m, w, y, xq, xs);
}

bool linear_fp8_takes_codes(int m, const fp8_weight& w) {
  return w.in % 32 == 0 && quantized_tile<false>(m, w).has_value();
}

void linear_fp4(const float* x, int m, const fp4_weight& w, float* y) { quantized_linear<true>(x, m, w, y); }

bool linear_fp8_set_takes_codes(int m, int count, const fp8_weight* const* w) {
  bool gemv = m <= tuning_now().gemv_max_rows;
  for (int i = 0; i < count; ++i) gemv = gemv && gemv_shape(w[i]->out, w[i]->in);
  return gemv;
}

void linear_fp8_set(const float* x, int m, int count, const fp8_weight* const* w, float* const* y,
                    const uint8_t* xq, const float* xs) {
  CEDAR_CUDA_REQUIRE(count >= 1 && count <= 4, "linear_fp8_set: 1 to 4 weights");
  if (m <= 0) return;
  for (int i = 0; i < count; ++i)
    CEDAR_CUDA_REQUIRE(w[i]->in == w[0]->in && w[i]->in % 32 == 0, "linear_fp8_set: one x, in a multiple of 32");
  if (!linear_fp8_set_takes_codes(m, count, w)) {
    for (int i = 0; i < count; ++i) linear_fp8(x, m, *w[i], y[i]);
    return;
  }
  const tuning& tune = tuning_now();
  bool split = m <= 8;
  int blocks = 0;  // 16 output rows each
  for (int i = 0; i < count; ++i) {
    split = split && split_fits(w[i]->out, w[i]->in, tune);
    blocks += w[i]->out / 16;
  }
  // split8 (86 KB of shared memory a block) holds 2 blocks an SM: a set of more blocks than that
  // (the shared expert's w1 + w3, 288 on 132 SMs) would run a second wave, so it takes split4
  const tile_kind t = !split                                               ? tile_kind::gemv
                      : blocks <= set_blocks_at_once(tile_kind::split8) ? tile_kind::split8
                                                                         : tile_kind::split4;
  if (xq != nullptr) return gemm_fp8_set(xq, xs, m, count, w, y, t);
  const int k = w[0]->in;
  scratch<uint8_t> q(size_t(m) * k);
  scratch<float> s(size_t(m) * (k / 32));
  quantize_rows_fp8(x, m, k, q.get(), s.get());
  gemm_fp8_set(q.get(), s.get(), m, count, w, y, t);
}

void linear_bf16(const float* x, int m, const bf16_weight& w, float* y) {
  if (m <= 0) return;
  if (m <= tuning_now().bf16_gemv_max_rows && gemv_bf16(x, w.in, m, w.data, w.out, w.in, y, w.out, 1, 0, 0, 0)) return;
  // exact x: the router gate, the indexer's weights and the compressor feed top-k choices,
  // which a last-bit difference in a logit can flip
  split_gemm(x, w.in, m, w.data, w.out, w.in, y, w.out, 3, 1, 0, 0, 0);
}

void grouped_output(const float* o, int m, int groups, const bf16_weight& wo_a, const fp8_weight& wo_b, float* out,
                    const fp8_weight* wo_a8) {
  CEDAR_CUDA_REQUIRE(groups > 0 && wo_a.out % groups == 0, "wo_a rows split into groups");
  CEDAR_CUDA_REQUIRE(wo_b.in == wo_a.out, "wo_b takes concat(u)");
  if (m <= 0) return;
  const int rank = wo_a.out / groups, group_in = wo_a.in;
  scratch<float> u(size_t(m) * wo_a.out);
  const long long w_group = (long long)rank * group_in;
  // u[r, g rank + j] = o[r, g group_in ...] . wo_a[g rank + j]: at few rows the GEMV, from the
  // FP8 form when the model keeps it (half the bytes, the same bits)
  const int ldo = groups * group_in;
  // one row, wo_a's FP8 form: its GEMV also writes the codes wo_b's tile reads
  if (m == 1 && wo_a8 != nullptr && wo_a8->data != nullptr && linear_fp8_takes_codes(1, wo_b)) {
    scratch<uint8_t> uq(wo_a.out);
    scratch<float> us(wo_a.out / 32);
    if (gemv_fp8w_codes(o, ldo, *wo_a8, rank, group_in, u.get(), groups, group_in, rank, uq.get(), us.get()))
      return linear_fp8(u.get(), 1, wo_b, out, uq.get(), us.get());
  }
  const bool few = m <= tuning_now().bf16_gemv_max_rows;
  const bool by_gemv =
      few && ((wo_a8 != nullptr && wo_a8->data != nullptr &&
               gemv_fp8w(o, ldo, m, *wo_a8, rank, group_in, u.get(), wo_a.out, groups, group_in, rank)) ||
              gemv_bf16(o, ldo, m, wo_a.data, rank, group_in, u.get(), wo_a.out, groups, group_in, w_group, rank));
  // else two parts: wo_a feeds no choice, and at prefill the third GEMM pass over [m, 8 x 4096]
  // is a third of its time
  if (!by_gemv) split_gemm(o, ldo, m, wo_a.data, rank, group_in, u.get(), wo_a.out, 2, groups, group_in, w_group, rank);
  linear_fp8(u.get(), m, wo_b, out);
}

}  // namespace cedar::cuda::fast
