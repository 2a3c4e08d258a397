// The fused mHC boundary of the fast kernel set (layer_ops.hpp; the router, Engram and greedy
// sampling: route_ops.cu).
//
// hc_boundary: launch 1 cuts each row's d positions into slices of 256; a block applies the
// previous sublayer's HCPost to its slice of the hc copies, writes them back, writes the slice
// of the collapsed next input (with the pre the collapse takes, known before the boundary), and
// leaves its share of the HCMix dots, of the residual's sum of squares and of the collapsed
// input's sum of squares in a partials buffer (warp folds, then the warps' sums in order).
// Launch 2 spreads a row over blocks: each adds the collapsed sums of squares in slice order
// (every block the same sum) and normalizes its span of the input, while one more block per row
// adds the mix partials and finishes pre/post/comb (Sinkhorn by one warp, a lane per row of
// comb). A single row (a batch-1 decode step) takes boundary_fused instead: one launch whose
// blocks each compute a few of the sums and whose last block to arrive finishes the row (or,
// where the next linear's codes are wanted, launch 2 finishes it). A row's bits depend neither
// on m nor on the launch count.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/layer_ops.hpp"
#include "kernels/cuda/internal.cuh"

namespace cedar::cuda::fast {
namespace detail {
namespace {

using cuda::detail::exp_f;
using cuda::detail::round_bf16;
using cuda::detail::scratch;

constexpr int slice = 256;  ///< positions per block in launch 1 (= threads)

__device__ __forceinline__ float sigmoid_fast(float x) { return 1.0f / (1.0f + exp_f(-x)); }

/// One step of the transposing warp fold: values [0, 2S) of a lane become S sums, each its value
/// plus the partner's (lane ^ S), the lower half kept where bit S of the lane is clear.
template <int S>
__device__ __forceinline__ void fold_half(float (&val)[32], int lane) {
  const bool upper = (lane & S) != 0;
#pragma unroll
  for (int j = 0; j < S; ++j) {
    const float lo = val[j], hi = val[j + S];
    const float send = upper ? lo : hi, keep = upper ? hi : lo;
    val[j] = keep + __shfl_xor_sync(0xffffffffu, send, S);
  }
}

/// The per-position operations both boundary kernels (post_mix_partials, boundary_fused) run,
/// kept in one place so that their bits stay the same. c, p: comb [hc, hc] and post [hc] of
/// the row (global memory or registers).
/// HCPost of one position (hc_post's bits): v[k] <- round_bf16(p[k] fi + sum_j c[j, k] v[j]).
template <int HC>
__device__ __forceinline__ void hc_post_position(const float* c, const float* p, float fi, float (&v)[HC]) {
  float out[HC];
#pragma unroll
  for (int k = 0; k < HC; ++k) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < HC; ++j) s = __fadd_rn(s, __fmul_rn(c[j * HC + k], v[j]));
    out[k] = round_bf16(__fadd_rn(__fmul_rn(p[k], fi), s));
  }
#pragma unroll
  for (int k = 0; k < HC; ++k) v[k] = out[k];
}

/// The collapsed input at one position (hc_collapse's operations); pre: the row's [hc].
template <int HC>
__device__ __forceinline__ float collapse_position(const float* pre, const float (&v)[HC]) {
  float c = 0.0f;
#pragma unroll
  for (int j = 0; j < HC; ++j) c += pre[j] * v[j];
  return c;
}

/// A position's term of partial sum o: HCMix dot o (o < n_mix, its weights w), then the
/// residual's sum of squares (o = n_mix) and the collapsed input's square sq (o = n_mix + 1).
/// Fused multiply-adds: one instruction a term (the build rounds a * b + c twice otherwise).
template <int HC>
__device__ __forceinline__ float mix_term(int o, const float (&v)[HC], const float (&w)[HC], float sq) {
  constexpr int n_mix = HC * HC + 2 * HC;
  float acc = 0.0f;
  if (o < n_mix) {
#pragma unroll
    for (int j = 0; j < HC; ++j) acc = __fmaf_rn(v[j], w[j], acc);
  } else if (o == n_mix) {
#pragma unroll
    for (int j = 0; j < HC; ++j) acc = __fmaf_rn(v[j], v[j], acc);
  } else if (o == n_mix + 1) {
    acc = sq;
  }
  return acc;
}

/// Group GRP of a lane's R * n_part sums in post_mix_partials (sums g = o R + q, 32 a group):
/// computes them, folds them over the warp transposing (below) and stores lane l's, sum
/// 32 GRP + l, in sums [R][n_part]; then the next group. A template per group, so that every
/// index into the 32 values is a constant (registers, not local memory).
template <int HC, int R, int GRP>
struct mix_group {
  static constexpr int n_mix = HC * HC + 2 * HC, n_part = n_mix + 2;
  static_assert(32 % R == 0, "a 32-sum group holds whole dots (all R rows of an o)");
  static constexpr int per_group = 32 / R, groups = (n_part + per_group - 1) / per_group;

  __device__ __forceinline__ static void run(const float (&v)[R][HC], const float (&sq)[R], bool live, const float* fn,
                                             int d, int i, int lane, float (*sums)[n_part]) {
    if constexpr (GRP < groups) {
      float val[32];
#pragma unroll
      for (int u = 0; u < per_group; ++u) {
        constexpr int o0 = GRP * per_group;
        const int o = o0 + u;  // dot o: the mix weights, then the two sums of squares
        float w[HC];
#pragma unroll
        for (int j = 0; j < HC; ++j) w[j] = live && o < n_mix ? fn[size_t(o) * HC * d + size_t(j) * d + i] : 0.0f;
#pragma unroll
        for (int q = 0; q < R; ++q) val[u * R + q] = mix_term<HC>(o, v[q], w, sq[q]);
      }
      // at offset s a lane keeps half of its values (the upper half when its bit s is set) and
      // adds its partner's copy of them: 31 shuffles for 32 sums, and lane l ends with sum l
      fold_half<16>(val, lane);
      fold_half<8>(val, lane);
      fold_half<4>(val, lane);
      fold_half<2>(val, lane);
      fold_half<1>(val, lane);
      const int g = GRP * 32 + lane, o = g / R, q = g % R;
      if (o < n_part) sums[q][o] = val[0];
      mix_group<HC, R, GRP + 1>::run(v, sq, live, fn, d, i, lane, sums);
    }
  }
};

/// The residual slice of rows [r0, r0 + R) at position i into v, HCPost of f applied first
/// (and written back to X) when f != null.
template <int HC, int R>
__device__ __forceinline__ void load_post(float* X, int m, int d, const float* f, const float* post, const float* comb,
                                          int r0, int i, float (&v)[R][HC]) {
  const bool live = i < d;
#pragma unroll
  for (int q = 0; q < R; ++q) {
    const int r = r0 + q;
    const bool here = live && r < m;
    float* xr = X + size_t(r) * HC * d;
#pragma unroll
    for (int j = 0; j < HC; ++j) v[q][j] = here ? xr[size_t(j) * d + i] : 0.0f;
    if (f != nullptr && here) {
      hc_post_position<HC>(comb + size_t(r) * HC * HC, post + r * HC, f[size_t(r) * d + i], v[q]);
#pragma unroll
      for (int k = 0; k < HC; ++k) xr[size_t(k) * d + i] = v[q][k];
    }
  }
}

/// The collapsed input of the next sublayer at position i, written to x_out; its squares in sq.
template <int HC, int R>
__device__ __forceinline__ void collapse_slice(int m, int d, const float* collapse_pre, float* x_out, int r0, int i,
                                               const float (&v)[R][HC], float (&sq)[R]) {
#pragma unroll
  for (int q = 0; q < R; ++q) {
    const int r = r0 + q;
    float c = 0.0f;
    if (i < d && r < m) {
      c = collapse_position<HC>(collapse_pre + r * HC, v[q]);
      x_out[size_t(r) * d + i] = c;
    }
    sq[q] = c * c;
  }
}

/// grid (slices, ceil(m / R)): block (x, y) takes positions [256 x, 256 x + 256) of rows
/// [R y, R y + R), so each HCMix weight it reads serves R rows. A row's sums do not depend on R.
template <int HC, int R>
__global__ void __launch_bounds__(slice)
    post_mix_partials(float* X, int m, int d, const float* f, const float* post, const float* comb, const float* fn,
                      const float* collapse_pre, float* x_out, float* partials /*[m, slices, n_mix + 2]*/) {
  cuda::detail::dependent_start();
  constexpr int n_part = HC * HC + 2 * HC + 2;
  const int r0 = blockIdx.y * R, i = blockIdx.x * slice + threadIdx.x;
  float v[R][HC], sq[R];
  load_post<HC, R>(X, m, d, f, post, comb, r0, i, v);
  collapse_slice<HC, R>(m, d, collapse_pre, x_out, r0, i, v, sq);
  // each warp folds its 32 positions of every dot (and of the sums of squares); the block then
  // adds the warps' sums in warp order: one barrier instead of one per dot. The R * n_part
  // sums of a lane go 32 at a time (o-major: sum g = o R + q) through a transposing fold: at
  // offset s a lane keeps half of its values and adds its partner's, so 32 sums take 31
  // shuffles, not 160, and lane l ends with sum l of the 32. The pairs added are the xor fold's
  // (every lane of that fold holds the same value), so the bits are the fold's.
  __shared__ float warp_sums[slice / 32][R][n_part];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  mix_group<HC, R, 0>::run(v, sq, i < d, fn, d, i, lane, warp_sums[warp]);
  __syncthreads();
  for (int t = threadIdx.x; t < R * n_part; t += blockDim.x) {
    const int q = t / n_part, o = t % n_part;
    if (r0 + q >= m) continue;
    float acc = 0.0f;
    for (int w = 0; w < slice / 32; ++w) acc += warp_sums[w][q][o];
    partials[(size_t(r0 + q) * gridDim.x + blockIdx.x) * n_part + o] = acc;
  }
}

/// n / d as the IEEE division's fast path computes it (reciprocal estimate, one Newton step, the
/// quotient and one residual correction: correctly rounded while n, d and the quotient are
/// normal numbers), without the check that sends other operands to the slow path. The check's
/// branch made each division a region of its own, so a row's divisions ran one after another;
/// these interleave. For Sinkhorn's operands: positive normal entries and sums.
__device__ __forceinline__ float div_normal(float n, float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  const float e = __fmaf_rn(-d, r, 1.0f);
  r = __fmaf_rn(r, e, r);
  const float q = __fmaf_rn(n, r, 0.0f);
  const float rem = __fmaf_rn(-d, q, n);
  return __fmaf_rn(r, rem, q);
}

/// The xor-butterfly tree over a[0 .. HC) (HC a power of two): ((a0 + a1) + (a2 + a3)) at
/// HC = 4, the value every lane of a shuffle fold over lanes k ^ 1 .. k ^ (HC / 2) ends with.
template <int HC, bool Max>
__device__ __forceinline__ float row_tree(const float (&a)[HC]) {
  float t[HC];
#pragma unroll
  for (int k = 0; k < HC; ++k) t[k] = a[k];
#pragma unroll
  for (int o = 1; o < HC; o <<= 1)
#pragma unroll
    for (int k = 0; k < HC; k += 2 * o) t[k] = Max ? fmaxf(t[k], t[k + o]) : t[k] + t[k + o];
  return t[0];
}

/// pre, post and comb of row r from its mix sums (mix, scale and base in shared memory), by
/// warp 0 of a block: lane j < HC holds row j of comb, so a row's max and sums are the lane's
/// own trees and its divisions independent of each other; a column's sum folds over lanes
/// j ^ 1 .. j ^ (HC / 2) (the same tree, every column at once). Sinkhorn is a serial chain of
/// 2 x iters normalizations: this keeps one shuffle fold and one division latency in each.
template <int HC>
__device__ void finish_mix(const float* mix, int d, int r, const float* scale, const float* base, int iters,
                           float hc_eps, float norm_eps, float* pre, float* post, float* comb) {
  static_assert(HC <= 32 && (HC & (HC - 1)) == 0, "a row per lane");
  constexpr int n_mix = HC * HC + 2 * HC;
  const int j = threadIdx.x & 31;
  const bool live = j < HC;
  const float inv_rms = 1.0f / sqrtf(mix[n_mix] / float(HC * d) + norm_eps);
  if (live) {
    pre[r * HC + j] = sigmoid_fast(mix[j] * inv_rms * scale[0] + base[j]) + hc_eps;
    post[r * HC + j] = 2.0f * sigmoid_fast(mix[HC + j] * inv_rms * scale[1] + base[HC + j]);
  }
  // every lane of the warp runs every step (full-mask shuffles; a column's fold stays within
  // lanes 0 .. HC - 1). Lanes past HC hold ones, never zeros: a division of zero takes the
  // division's slow path, and the live lanes would wait for it at every step.
  float c[HC];
#pragma unroll
  for (int k = 0; k < HC; ++k) {
    const int q = 2 * HC + j * HC + k;
    c[k] = live ? mix[q] * inv_rms * scale[2] + base[q] : 1.0f;
  }
  const float mx = row_tree<HC, true>(c);
#pragma unroll
  for (int k = 0; k < HC; ++k) c[k] = exp_f(c[k] - mx);
  const float e_sum = row_tree<HC, false>(c);
#pragma unroll
  for (int k = 0; k < HC; ++k) c[k] = div_normal(c[k], e_sum) + hc_eps;
  for (int it = 0; it < iters; ++it) {
    if (it > 0) {
      const float row = row_tree<HC, false>(c);
#pragma unroll
      for (int k = 0; k < HC; ++k) c[k] = div_normal(c[k], row + hc_eps);
    }
    float col[HC];
#pragma unroll
    for (int k = 0; k < HC; ++k) col[k] = c[k];
#pragma unroll
    for (int o = 1; o < HC; o <<= 1)
#pragma unroll
      for (int k = 0; k < HC; ++k) col[k] += __shfl_xor_sync(0xffffffffu, col[k], o);
#pragma unroll
    for (int k = 0; k < HC; ++k) c[k] = div_normal(c[k], col[k] + hc_eps);
  }
  if (live)
#pragma unroll
    for (int k = 0; k < HC; ++k) comb[size_t(r) * HC * HC + j * HC + k] = c[k];
}

/// The sum over slices (in slice order) of partial o of row r; a thread's loads are all issued
/// before the first add (one load latency, not one per slice). The loads skip L1: the fused
/// boundary reads partials other blocks of its grid wrote.
template <int NP>
__device__ __forceinline__ float sum_slices(const float* partials, int r, int slices, int o) {
  const float* pr = partials + size_t(r) * slices * NP + o;
  constexpr int max_slices = 32;
  float s = 0.0f;
  if (slices <= max_slices) {
    float v[max_slices];
#pragma unroll
    for (int b = 0; b < max_slices; ++b) v[b] = b < slices ? __ldcg(pr + size_t(b) * NP) : 0.0f;
#pragma unroll
    for (int b = 0; b < max_slices; ++b)
      if (b < slices) s += v[b];
  } else {
    for (int b = 0; b < slices; ++b) s += __ldcg(pr + size_t(b) * NP);
  }
  return s;
}

/// Positions of x_out a block of launch 2 normalizes (slice threads, finish_u each).
constexpr int finish_u = 4;
constexpr int finish_span = slice * finish_u;

/// grid (m, blocks): block y' = y0 + y < spans scales positions [finish_span y', +finish_span) of
/// row x by its RMS and the norm weight; block y' == spans finishes pre, post and comb of row x
/// (blocks spans + 1 from y0 0: all of it; the finish alone: y0 spans, one block).
template <int HC>
__global__ void __launch_bounds__(slice)
    mix_finish(int d, int slices, const float* partials, const float* scale, const float* base, int iters, float hc_eps,
               float norm_eps, float* pre, float* post, float* comb, const float* norm_w, float* x_out, uint8_t* codes,
               float* scales, int spans, int y0) {
  cuda::detail::dependent_start();
  constexpr int n_mix = HC * HC + 2 * HC, n_part = n_mix + 2;
  const int r = blockIdx.x, y = int(blockIdx.y) + y0;
  if (y < spans) {
    __shared__ float inv_s;
    if (threadIdx.x < 32) {  // lane 0's sum is the one used: every lane adds in slice order
      const float sq = sum_slices<n_part>(partials, r, slices, n_mix + 1);
      if (threadIdx.x == 0) inv_s = 1.0f / sqrtf(sq / float(d) + norm_eps);
    }
    __syncthreads();
    float* out = x_out + size_t(r) * d;
    const int first = y * finish_span;
    cuda::detail::scale_by_weight<finish_u>(out + first, out + first, min(finish_span, d - first), threadIdx.x,
                                            blockDim.x, inv_s, norm_w + first);
    if (codes == nullptr) return;
    // the next linear's codes: a warp's positions of each of the thread's steps are one group
    // (d % 32 == 0), values this thread just wrote
    for (int k = first + int(threadIdx.x); k < min(first + finish_span, d); k += blockDim.x) {
      const float sc = cuda::detail::fp8_group_code(out[k], codes[size_t(r) * d + k]);
      if (threadIdx.x % 32 == 0) scales[size_t(r) * (d / 32) + k / 32] = sc;
    }
    return;
  }
  __shared__ float mix[n_mix + 1];
  for (int o = threadIdx.x; o <= n_mix; o += blockDim.x) mix[o] = sum_slices<n_part>(partials, r, slices, o);
  __syncthreads();
  if (threadIdx.x < 32) finish_mix<HC>(mix, d, r, scale, base, iters, hc_eps, norm_eps, pre, post, comb);
}

/// Rows up to which the boundary is one launch (boundary_fused), and its arrival counters: one
/// per (row, slice), then one per row.
constexpr int fused_max_rows = hc_one_launch_capacity;
constexpr int fused_max_slices = 64;

/// Partial sums a block of boundary_fused computes.
constexpr int fused_sums = 4;

/// A release (before an arrival) or acquire (after seeing the last one) fence at device scope.
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

/// The boundary of a few rows in one launch, grid (slices, m, ceil(n_part / fused_sums)): block
/// (x, r, z) applies the slice's HCPost and collapse (as post_mix_partials at R = 1) and computes
/// partial sums [fused_sums z, + fused_sums) only (a plain xor fold per sum: the pairs of the
/// transposing fold, so the same bits), so that a decode row's HCMix weights are read by 7x the
/// blocks, each computing its own sums only, after one round of loads. X is written after every block
/// of the slice has read it: the slice's last block to arrive writes it (they all hold the same
/// values). The row's last block to arrive adds the partials, as mix_finish does, and finishes
/// the row: warp 0 pre, post and comb (every block of the row has read post and comb by then),
/// the other warps the normalized input. The same operations in the same order as the two
/// launches, so the same bits. The last blocks set their counters back to zero for the next
/// launch.
/// Finish = false: no row finish; mix_finish, launched after it, adds the partials, finishes
/// the row and writes the normalized input's codes from its spread blocks.
template <int HC, bool Finish = true>
__global__ void __launch_bounds__(slice)
    boundary_fused(float* X, int m, int d, const float* f, float* post, float* comb, const float* fn,
                   const float* collapse_pre, float* x_out, float* partials, const float* scale, const float* base,
                   int iters, float hc_eps, float norm_eps, float* pre, const float* norm_w, unsigned* arrivals,
                   bool early) {
  constexpr int n_mix = HC * HC + 2 * HC, n_part = n_mix + 2;
  if (!early) cuda::detail::grid_dependency_wait();  // (A/B runs: tuning::boundary_weight_early)
  // the weights (no kernel writes them) before the wait: the finish's constants, so the last
  // block's serial chain does not wait on them, and this block's HCMix weights, which then
  // stream while the kernels before it end
  __shared__ float scale_s[3], base_s[n_mix];
  for (int t = threadIdx.x; t < n_mix + 3; t += blockDim.x) {
    if (t < n_mix)
      base_s[t] = base[t];
    else
      scale_s[t - n_mix] = scale[t - n_mix];
  }
  const int r = blockIdx.y, slices = gridDim.x, i = blockIdx.x * slice + threadIdx.x, o0 = blockIdx.z * fused_sums;
  const bool live = i < d;
  float w[fused_sums][HC];
#pragma unroll
  for (int u = 0; u < fused_sums; ++u)
#pragma unroll
    for (int j = 0; j < HC; ++j)
      w[u][j] = live && o0 + u < n_mix ? fn[size_t(o0 + u) * HC * d + size_t(j) * d + i] : 0.0f;
  cuda::detail::dependent_start();
  // every load first (no store before them, so the compiler issues them together): one memory
  // latency, not one per step
  const float* xr = X + size_t(r) * HC * d;
  float v[HC], cpre[HC], cm[HC * HC], pw[HC], fi = 0.0f;
#pragma unroll
  for (int j = 0; j < HC; ++j) v[j] = live ? xr[size_t(j) * d + i] : 0.0f;
#pragma unroll
  for (int j = 0; j < HC; ++j) cpre[j] = collapse_pre[r * HC + j];
  if (f != nullptr) {
    fi = live ? f[size_t(r) * d + i] : 0.0f;
#pragma unroll
    for (int q = 0; q < HC * HC; ++q) cm[q] = comb[size_t(r) * HC * HC + q];
#pragma unroll
    for (int k = 0; k < HC; ++k) pw[k] = post[r * HC + k];
  }
  if (f != nullptr && live) hc_post_position<HC>(cm, pw, fi, v);
  float c = 0.0f;
  if (live) {
    c = collapse_position<HC>(cpre, v);
    if (blockIdx.z == 0) x_out[size_t(r) * d + i] = c;
  }
  const float sq = c * c;
  float acc[fused_sums];  // this block's sums
#pragma unroll
  for (int u = 0; u < fused_sums; ++u) acc[u] = mix_term<HC>(o0 + u, v, w[u], sq);
#pragma unroll
  for (int s = 16; s > 0; s >>= 1)
#pragma unroll
    for (int u = 0; u < fused_sums; ++u) acc[u] += __shfl_xor_sync(0xffffffffu, acc[u], s);
  __shared__ float warp_sums[slice / 32][fused_sums];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  if (lane == 0)
#pragma unroll
    for (int u = 0; u < fused_sums; ++u) warp_sums[warp][u] = acc[u];
  __syncthreads();
  if (threadIdx.x < fused_sums && o0 + int(threadIdx.x) < n_part) {
    float a = 0.0f;
    for (int w = 0; w < slice / 32; ++w) a += warp_sums[w][threadIdx.x];
    partials[(size_t(r) * slices + blockIdx.x) * n_part + o0 + threadIdx.x] = a;
  }

  // arrivals: the block's writes, a barrier, then thread 0's release fence and counts
  __shared__ bool last_of_slice, last_of_row;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned* slice_count = arrivals + size_t(r) * fused_max_slices + blockIdx.x;
    unsigned* row_count = arrivals + size_t(fused_max_rows) * fused_max_slices + r;
    fence_acq_rel_gpu();
    const unsigned at_slice = atomicAdd(slice_count, 1u), at_row = Finish ? atomicAdd(row_count, 1u) : 0u;  // both in flight
    last_of_slice = at_slice == gridDim.z - 1;
    last_of_row = Finish && at_row == slices * gridDim.z - 1;
    if (last_of_slice) *slice_count = 0u;
    if (last_of_row) {
      *row_count = 0u;
      fence_acq_rel_gpu();  // acquire: the other blocks' partials and x_out, for the finish below
    }
  }
  __syncthreads();
  if (last_of_slice && f != nullptr && live) {
#pragma unroll
    for (int k = 0; k < HC; ++k) X[size_t(r) * HC * d + size_t(k) * d + i] = v[k];
  }
  if constexpr (Finish) {
    if (!last_of_row) return;
    __shared__ float mix[n_mix + 1];
    __shared__ float inv_s;
    for (int o = threadIdx.x; o <= n_mix; o += blockDim.x) mix[o] = sum_slices<n_part>(partials, r, slices, o);
    if (threadIdx.x == blockDim.x - 1)
      inv_s = 1.0f / sqrtf(sum_slices<n_part>(partials, r, slices, n_mix + 1) / float(d) + norm_eps);
    __syncthreads();
    if (threadIdx.x < 32) {
      finish_mix<HC>(mix, d, r, scale_s, base_s, iters, hc_eps, norm_eps, pre, post, comb);
      return;
    }
    // the other warps normalize the row, U positions' loads a thread before its stores
    constexpr int U = 16;
    float* out = x_out + size_t(r) * d;
    const int first = threadIdx.x - 32, stride = blockDim.x - 32;
    for (int k0 = first; k0 < d; k0 += stride * U) {
      float xv[U], wv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int k = k0 + u * stride;
        xv[u] = k < d ? __ldcg(out + k) : 0.0f;
        wv[u] = k < d ? norm_w[k] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (k0 + u * stride < d) out[k0 + u * stride] = (xv[u] * inv_s) * wv[u];
    }
  }
}

/// This thread's arrival counters on the current device (zero between launches).
unsigned* fused_arrivals() {
  struct counters {
    int device = -1;
    unsigned* p = nullptr;
  };
  thread_local counters c;
  int dev = 0;
  CEDAR_CUDA_CHECK(cudaGetDevice(&dev));
  if (c.device != dev) {  // first use on this device (a thread drives one device at a time; kept for the process)
    const size_t bytes = sizeof(unsigned) * fused_max_rows * (fused_max_slices + 1);
    CEDAR_CUDA_CHECK(cudaMalloc(&c.p, bytes));
    CEDAR_CUDA_CHECK(cudaMemset(c.p, 0, bytes));
    c.device = dev;
  }
  return c.p;
}

/// Rows per block of the kernels that read a weight once per R rows (the results do not depend
/// on R): the most rows, up to 8, that still leave `min_blocks` blocks of `columns` columns, so
/// a decode batch is spread over the SMs (64 rows at R = 8 made 160 HCMix blocks on 132 SMs)
/// and prefill reads each weight once per 8 rows.
int rows_per_block(int m, int columns) {
  constexpr int min_blocks = 512;
  for (int r = 8; r > 1; r /= 2)
    if ((long long)((m + r - 1) / r) * columns >= min_blocks) return r;
  return 1;
}

template <int HC, int R>
void launch_post_mix(float* X, int m, int d, const float* f, const float* post, const float* comb, const float* fn,
                     const float* collapse_pre, float* x_out, int slices, float* partials) {
  cuda::detail::launch_dependent(post_mix_partials<HC, R>, dim3(slices, (m + R - 1) / R), dim3(slice), 0, X, m, d, f,
                                 post, comb, fn, collapse_pre, x_out, partials);
}

template <int HC>
void boundary(float* X, int m, int d, const float* f, float* post, float* comb, const hc_mix_params& p, float* pre_out,
              const float* collapse_pre, const float* norm_w, float* x_out, hc_launches launches, uint8_t* codes,
              float* scales) {
  constexpr int n_mix = HC * HC + 2 * HC, n_part = n_mix + 2;
  CEDAR_CUDA_REQUIRE(codes == nullptr || (d % 32 == 0 && scales != nullptr), "hc_boundary: codes need d % 32 == 0");
  if (side_pending()) side_wait();  // the boundary before's Sinkhorn branch: its post and comb are read here
  const int slices = (d + slice - 1) / slice;
  scratch<float> partials(size_t(m) * slices * n_part);
  const bool one_fits = m <= fused_max_rows && slices <= fused_max_slices;
  CEDAR_CUDA_REQUIRE(launches != hc_launches::one || one_fits,
                     "hc_boundary: one launch takes at most 8 rows of d <= 16384");
  const int spans = (d + finish_span - 1) / finish_span;
  const auto finish = [&](int y0, int blocks) {
    cuda::detail::launch_dependent(mix_finish<HC>, dim3(m, blocks), dim3(slice), 0, d, slices, partials.get(),
                                   p.scale, p.base, p.sinkhorn_iters, p.hc_eps, p.norm_eps, pre_out, post, comb,
                                   norm_w, x_out, codes, scales, spans, y0);
  };
  if (launches == hc_launches::one || (launches == hc_launches::automatic && one_fits && m <= hc_one_launch_max_rows)) {
    const int groups = (n_part + fused_sums - 1) / fused_sums;  // 7 at hc = 4: 140 blocks a decode row (d = 5120)
    const bool apart = codes != nullptr && tuning_now().boundary_finish_apart;  // (else one launch in all)
    cuda::detail::launch_dependent(apart ? boundary_fused<HC, false> : boundary_fused<HC, true>,
                                   dim3(slices, m, groups), dim3(slice), 0, X, m, d, f, post, comb, p.fn, collapse_pre,
                                   x_out, partials.get(), p.scale, p.base, p.sinkhorn_iters, p.hc_eps, p.norm_eps,
                                   pre_out, norm_w, fused_arrivals(), tuning_now().boundary_weight_early);
    CEDAR_CUDA_LAUNCHED();
    if (apart) {
      // in a graph, pre, post and comb (read at the next boundary) from a branch of their own:
      // the step goes on once the input is normalized and coded, Sinkhorn beside it (joined at
      // the next boundary or before the capture ends: side_pending; the branch reads the
      // partials after this call, so only where they are the capture's, not the pool's)
      if (!partials.from_capture() || !tuning_now().boundary_sinkhorn_branch) return finish(0, spans + 1);
      side_begin();
      finish(spans, 1);
      side_end();
      return finish(0, spans);
    }
    // the codes apart: in this launch the row's one finishing block would quantize all of its
    // groups in series, on the step's critical path (measured: a batch-1 step 8.9-9.2 ms
    // against 8.4, docs/BENCHMARKS.md, 2026-12-04)
    if (codes != nullptr) quantize_rows_fp8(x_out, m, d, codes, scales);
    return;
  }
  const auto launch = [&](auto kernel) {
    kernel(X, m, d, f, post, comb, p.fn, collapse_pre, x_out, slices, partials.get());
  };
  switch (rows_per_block(m, slices)) {
    case 8:
      launch(launch_post_mix<HC, 8>);
      break;
    case 4:
      launch(launch_post_mix<HC, 4>);
      break;
    case 2:
      launch(launch_post_mix<HC, 2>);
      break;
    default:
      launch(launch_post_mix<HC, 1>);
      break;
  }
  CEDAR_CUDA_LAUNCHED();
  finish(0, spans + 1);
}

}  // namespace
}  // namespace detail

using namespace detail;

void hc_boundary(float* X, int m, int hc, int d, const float* f, float* post, float* comb, const hc_mix_params& mix,
                 float* pre_out, const float* collapse_pre, const float* norm_w, float* x_out, hc_launches launches,
                 uint8_t* codes, float* scales) {
  if (m <= 0) return;
  switch (hc) {
    case 1:
      return boundary<1>(X, m, d, f, post, comb, mix, pre_out, collapse_pre, norm_w, x_out, launches, codes, scales);
    case 2:
      return boundary<2>(X, m, d, f, post, comb, mix, pre_out, collapse_pre, norm_w, x_out, launches, codes, scales);
    case 4:
      return boundary<4>(X, m, d, f, post, comb, mix, pre_out, collapse_pre, norm_w, x_out, launches, codes, scales);
    case 8:
      return boundary<8>(X, m, d, f, post, comb, mix, pre_out, collapse_pre, norm_w, x_out, launches, codes, scales);
    default:
      CEDAR_CUDA_REQUIRE(false, "hc_boundary: hc must be 1, 2, 4 or 8");
  }
}

}  // namespace cedar::cuda::fast
