// The fast kernel set's bf16 GEMV (fast_ops.hpp, detail::gemv_bf16 / gemv_fp8w): decode's bf16
// weights (wo_a, the head, the router gate, indexer and compressor projections) and wo_a's FP8
// form, read once from HBM with fp32 x. One summation order for a column whatever the row count
// or mode (lane l: pieces l, l + 32, ..., each piece's 8 fused multiply-adds in order, then the
// xor fold; the split mode adds its warps' sums in order), so a row's bits never depend on its
// batch: the column mode (one column a warp), the one-row form of several columns a warp, the
// staged mode (x's rows in shared memory, from 2 rows) and the split mode (few columns).
#include <cstdint>
#include <optional>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/mma.cuh"

namespace cedar::cuda::fast::detail {
namespace {

using cuda::detail::aligned16;

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

}  // namespace

bool gemv_bf16(const float* x, int ldx, int m, const uint16_t* w, int n, int k, float* y, int ldy, int groups,
               long long x_group, long long w_group, long long y_group) {
  if (k % 8 != 0 || ldx % 4 != 0 || x_group % 4 != 0 || w_group % 8 != 0 || !aligned16(x) || !aligned16(w))
    return false;
  if (m <= 0 || n <= 0) return true;
  launch_gemv(x, ldx, x_group, m, bf16_rows{w, w_group}, n, k, y, ldy, y_group, groups);
  return true;
}

namespace {
/// The FP8 weight's rows, or nothing where gemv_fp8w's shape and alignment do not hold.
std::optional<fp8_rows> fp8w_rows(const float* x, int ldx, const fp8_weight& w, int n, int k, int groups,
                                  long long x_group) {
  if (k % 32 != 0 || n % 32 != 0 || w.out != n * groups || w.in != k || ldx % 4 != 0 || x_group % 4 != 0 ||
      !aligned16(x) || reinterpret_cast<uintptr_t>(w.data) % 8 != 0)
    return std::nullopt;
  return fp8_rows{w.data, w.scale, (long long)n * k, (long long)(n / 32) * (k / 32)};
}
}  // namespace

bool gemv_fp8w(const float* x, int ldx, int m, const fp8_weight& w, int n, int k, float* y, int ldy, int groups,
               long long x_group, long long y_group) {
  const std::optional<fp8_rows> rows = fp8w_rows(x, ldx, w, n, k, groups, x_group);
  if (!rows) return false;
  if (m <= 0 || n <= 0) return true;
  launch_gemv(x, ldx, x_group, m, *rows, n, k, y, ldy, y_group, groups);
  return true;
}

bool gemv_fp8w_codes(const float* x, int ldx, const fp8_weight& w, int n, int k, float* y, int groups,
                     long long x_group, long long y_group, uint8_t* codes, float* scales) {
  const tuning& t = tuning_now();
  if (!t.gemv_codes || t.gemv_one_row_cols != 4 || t.gemv_one_row_unroll != 2 || gemv_split(n, groups) ||
      y_group % 32 != 0 || y_group < n)
    return false;
  const std::optional<fp8_rows> rows = fp8w_rows(x, ldx, w, n, k, groups, x_group);
  if (!rows) return false;
  launch_gemv_cols<4, 2>(x, x_group, *rows, n, k, y, y_group, groups, codes, scales);
  return true;
}

}  // namespace cedar::cuda::fast::detail
