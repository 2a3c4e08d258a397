// Tensor-core FP8 / W4A8 linear layers (fast_ops.hpp): activation quantization, a direct
// kernel for decode (m <= 16: warps read the weight straight into mma fragments, one 128-wide
// K chunk each, partials summed by a second pass), and a cp.async-pipelined tiled kernel
// (narrow 64x8, 32x16 and 64x32: weight streams for a few slots; skinny 32x64; wide 128x128 for
// prefill), also with K split over the warps of a block (split4, split8: 16x8 for decode weights
// of few rows and long K). Dense and grouped (MoE) calls share them.
//
// One summation order for every tile, so a row's bits never depend on m: K is cut into chunks of
// 4 blocks of 32; a chunk's partial is 0 + sum of its blocks in ascending order (each block =
// one mma times sx * sw, an exact power of two, fused into the add); the result is 0 + the chunk
// partials in ascending order.
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/mma.cuh"

namespace cedar::cuda::fast {
namespace detail {
namespace {

using cuda::detail::scratch;
using cuda::detail::stream;

constexpr int chunk_k = 128;          ///< K per summation chunk (4 blocks)
constexpr int chunk_blocks = chunk_k / 32;

/// Where a call's operands are: one group for a dense call, num_groups for grouped ones.
struct gemm_problem {
  const uint8_t* w;        // FP8: [n, k] e4m3; FP4: [n, k/2] packed e2m1
  const uint8_t* ws;       // FP8: [n/32, k/32] ue8m0; FP4: [n, k/32] ue8m0
  const uint8_t* xq;       // [x rows, k] e4m3
  const float* xs;         // [x rows, k/32]
  const int32_t* rows;     // [slots] x row of each slot, or null (slot s = row s)
  const expert_group* groups;  // [gridDim.z] or null (one group: all m slots, w/ws above)
  float* y;                // [slots, n]
  int m, n, k;
  // a pair of grouped products of one x (the tiled kernels): blocks z >= split take
  // groups2[z - split] and write y2
  const expert_group* groups2 = nullptr;
  float* y2 = nullptr;
  int split = 0;
};

/// The group of blockIdx.z: weight pointers, first slot, slot count and output.
struct group_view {
  const uint8_t* w;
  const uint8_t* ws;
  int first, count;
  float* y;
};

__device__ __forceinline__ group_view group_of(const gemm_problem& p) {
  if (!p.groups) return {p.w, p.ws, 0, p.m, p.y};
  const bool second = p.groups2 != nullptr && int(blockIdx.z) >= p.split;
  const expert_group& g = second ? p.groups2[blockIdx.z - p.split] : p.groups[blockIdx.z];
  return {g.w, g.scale, g.first_slot, g.num_slots, second ? p.y2 : p.y};
}

__device__ __forceinline__ int x_row(const gemm_problem& p, int slot) { return p.rows ? p.rows[slot] : slot; }

/// Weight scale of row n, block kb.
template <bool FP4>
__device__ __forceinline__ float weight_scale(const uint8_t* ws, int n, int kb, int k) {
  return ue8m0_value(FP4 ? ws[size_t(n) * (k / 32) + kb] : ws[size_t(n / 32) * (k / 32) + kb]);
}

/// A load through the read-only path (global weights) or a plain one (shared memory).
template <bool Global, class T>
__device__ __forceinline__ T load_w(const T* p) {
  if constexpr (Global) return __ldg(p);
  else return *p;
}

/// A fragment of rows r and r + 8 at block kb from a row-major weight (global or shared),
/// `stride` bytes per row.
template <bool FP4, bool Global>
__device__ __forceinline__ void load_a(const uint8_t* w, size_t stride, int r, int kb, int tig,
                                       uint32_t a[4]) {
  if constexpr (FP4) {
    const uint32_t p0 = load_w<Global>(reinterpret_cast<const uint32_t*>(w + r * stride + kb * 16 + tig * 4));
    const uint32_t p1 = load_w<Global>(reinterpret_cast<const uint32_t*>(w + (r + 8) * stride + kb * 16 + tig * 4));
    const uint2 v0 = e2m1x8_to_e4m3(p0), v1 = e2m1x8_to_e4m3(p1);
    a[0] = v0.x, a[1] = v1.x, a[2] = v0.y, a[3] = v1.y;
  } else {
    const uint2 v0 = load_w<Global>(reinterpret_cast<const uint2*>(w + r * stride + kb * 32 + tig * 8));
    const uint2 v1 = load_w<Global>(reinterpret_cast<const uint2*>(w + (r + 8) * stride + kb * 32 + tig * 8));
    a[0] = v0.x, a[1] = v1.x, a[2] = v0.y, a[3] = v1.y;
  }
}

// ---- activation quantization -----------------------------------------------------------------

/// One warp per group of 32, one lane per value: codes and the power-of-two scale, as
/// fmt::quantize_fp8 (the group max is exact in any order).
__global__ void quantize_kernel(const float* x, long long groups, uint8_t* codes, float* scales) {
  cuda::detail::grid_dependency_wait();
  cuda::detail::launch_dependents();  // the GEMM after it can start loading its weight
  const long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (g >= groups) return;  // g is uniform across the warp
  const float v = x[g * 32 + lane];
  float amax = fabsf(v);
  for (int off = 16; off >= 1; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  const float s = cuda::detail::fp8_group_scale(amax);
  codes[g * 32 + lane] = cuda::detail::f32_to_e4m3(cuda::detail::clampf(v / s, -448.0f, 448.0f));
  if (lane == 0) scales[g] = s;
}

// ---- direct kernel (decode) ------------------------------------------------------------------

constexpr int direct_warps = 8;
/// 128-wide K chunks per warp: 4 KB of FP8 or FP4 weight in flight per warp.
template <bool FP4>
constexpr int direct_chunks = FP4 ? 4 : 2;

/// Up to max_set dense problems of one x (same xq, m and k) in one direct launch: block columns
/// [end[i - 1], end[i]) compute problem i into part[i]; one chunk-sum launch then writes each y.
/// A single call (dense or grouped) is a set of one, N = 1: its kernels take a parameter block
/// of the old size (a set of four measured ~1.5 us slower per single call).
constexpr int max_set = 4;
template <int N>
struct direct_set {
  gemm_problem p[N];
  float* part[N];
  int end[N];  ///< block columns, cumulative
  int count;
};

/// One warp's weight fragments for a K group (direct_chunks 128-wide chunks of its 16 rows):
/// load() issues every load of the group at once (bytes in flight); direct_compute() runs the
/// group's mmas.
template <bool FP4>
struct direct_frags {
  static constexpr int cpw = direct_chunks<FP4>;
  static constexpr int nb = cpw * chunk_blocks;
  uint32_t a[nb][4];
  float sw0[nb], sw1[nb];

  __device__ __forceinline__ void load(const uint8_t* w, const uint8_t* ws, size_t wstride, int k, int r, int grp, int tig) {
    const int k_blocks = k / 32;
#pragma unroll
    for (int i = 0; i < nb; ++i) {
      const int kb = min(grp * nb + i, k_blocks - 1);  // past the end: loaded, never stored
      load_a<FP4, true>(w, wstride, r, kb, tig, a[i]);
      sw0[i] = weight_scale<FP4>(ws, r, kb, k);
      sw1[i] = FP4 ? weight_scale<FP4>(ws, r + 8, kb, k) : sw0[i];
    }
  }
};

/// The x side of a warp: the x rows of the slots a thread loads (b) and outputs (c), -1: none.
template <int NT>
struct direct_slots {
  int b[NT], c[NT][2];
  __device__ __forceinline__ direct_slots(const int32_t* rows, int slot0, int count, int g, int tig) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int s_b = slot0 + j * 8 + g;
      b[j] = s_b < count ? (rows ? rows[s_b] : s_b) : -1;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int s_c = slot0 + j * 8 + tig * 2 + e;
        c[j][e] = s_c < count ? (rows ? rows[s_c] : s_c) : -1;
      }
    }
  }
};

/// The mmas of K group grp from fragments f, each chunk's partial into part [chunks, total
/// slots, n] at rows r0 + g, r0 + g + 8.
template <bool FP4, int NT>
__device__ __forceinline__ void direct_compute(const direct_frags<FP4>& f, const direct_slots<NT>& xs_rows,
                                               const gemm_problem& p, int grp, int slot0, int count, float* part,
                                               size_t total_slots, int n, int r0, int g, int tig) {
  constexpr int cpw = direct_chunks<FP4>;
  const int k_blocks = p.k / 32;
#pragma unroll
  for (int cc = 0; cc < cpw; ++cc) {
    const int chunk = grp * cpw + cc;
    if (chunk * chunk_blocks >= k_blocks) break;
    float acc[NT][4] = {};
#pragma unroll
    for (int i = cc * chunk_blocks; i < (cc + 1) * chunk_blocks; ++i) {
      const int kb = chunk * chunk_blocks + (i - cc * chunk_blocks);
      if (kb >= k_blocks) break;  // the last chunk of a k that is not a multiple of 128
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        uint2 v = make_uint2(0, 0);
        if (xs_rows.b[j] >= 0) v = *reinterpret_cast<const uint2*>(p.xq + size_t(xs_rows.b[j]) * p.k + kb * 32 + tig * 8);
        const uint32_t bj[2] = {v.x, v.y};
        float sx[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) sx[e] = xs_rows.c[j][e] >= 0 ? p.xs[size_t(xs_rows.c[j][e]) * (p.k / 32) + kb] : 0.0f;
        float d[4];
        mma_e4m3(d, f.a[i], bj);
        acc[j][0] = fmaf(d[0], f.sw0[i] * sx[0], acc[j][0]);
        acc[j][1] = fmaf(d[1], f.sw0[i] * sx[1], acc[j][1]);
        acc[j][2] = fmaf(d[2], f.sw1[i] * sx[0], acc[j][2]);
        acc[j][3] = fmaf(d[3], f.sw1[i] * sx[1], acc[j][3]);
      }
    }
    float* pc = part + size_t(chunk) * total_slots * n;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int s = slot0 + j * 8 + tig * 2 + e;
        if (s >= count) continue;
        pc[size_t(s) * n + r0 + g] = acc[j][e];
        pc[size_t(s) * n + r0 + g + 8] = acc[j][2 + e];
      }
  }
}

/// grid (sum of n_i / 128, K groups, groups * token tiles): warp w computes rows 128 bx + 16 w
/// of its member for 8 * NT slots of its group over K group by (direct_chunks chunks), each
/// chunk's partial into part [chunks, total slots, n]. The weight goes straight into mma
/// fragments. (Several K groups a warp, the next group's loads issued before the current
/// group's mmas, on a grid of one wave, measured slower: wq_b 22.1 -> 24.6 us.)
template <bool FP4, int NT, int N>
__global__ void __launch_bounds__(direct_warps * 32) direct_kernel(const __grid_constant__ direct_set<N> set, int token_tiles) {
  // the members differ in weight, n and partials only (one x: xq, xs, rows, groups, m, k); a
  // set of one compiles without the member selection (its registers)
  const gemm_problem& p = set.p[0];
  const uint8_t* w = p.w;
  const uint8_t* ws = p.ws;
  float* part = set.part[0];
  int n = p.n, bx = int(blockIdx.x);
  if constexpr (N > 1) {
    // selects over constant indices: the parameters are never indexed at run time (which
    // would copy them to local memory)
#pragma unroll
    for (int i = 1; i < N; ++i)
      if (i < set.count && int(blockIdx.x) >= set.end[i - 1])
        w = set.p[i].w, ws = set.p[i].ws, part = set.part[i], n = set.p[i].n, bx = int(blockIdx.x) - set.end[i - 1];
  }
  const int lane = threadIdx.x % 32, g = lane / 4, tig = lane % 4;
  const int r0 = bx * direct_warps * 16 + (threadIdx.x / 32) * 16;
  if (r0 >= n) return;  // n % 16 == 0: a warp's 16 rows are all in or all out
  // launched as a dependent: a dense call loads its weight while the kernel before it (the
  // activation's quantization) finishes; a grouped one first needs the groups it wrote
  if (p.groups) cuda::detail::grid_dependency_wait();
  const int tile = blockIdx.z % token_tiles;
  const size_t total_slots = size_t(p.m);
  const int32_t* rows = p.rows;
  int count = p.m;
  if (p.groups) {
    const expert_group& eg = p.groups[blockIdx.z / token_tiles];
    w = eg.w, ws = eg.scale, count = eg.num_slots;
    rows = p.rows + eg.first_slot;
    part += size_t(eg.first_slot) * n;
  }
  const int slot0 = tile * 8 * NT;
  if (slot0 >= count) return;
  const size_t wstride = FP4 ? p.k / 2 : p.k;
  // every weight fragment of the warp's K group is loaded before the first mma (bytes in
  // flight); x, shared by the block's warps, is read from L1 as the mmas go
  direct_frags<FP4> f;
  f.load(w, ws, wstride, p.k, r0 + g, blockIdx.y, tig);
  cuda::detail::launch_dependents();
  cuda::detail::grid_dependency_wait();
  const direct_slots<NT> xr(rows, slot0, count, g, tig);
  direct_compute<FP4, NT>(f, xr, p, blockIdx.y, slot0, count, part, total_slots, n, r0, g, tig);
}

/// The chunk sums' view of a set: member i's partials, output and cumulative element count.
template <int N>
struct sum_set {
  const float* part[N];
  float* y[N];
  long long end[N];
  int count;
};

/// y_i[s, n] = 0 + part_i[0, s, n] + part_i[1, s, n] + ... (ascending chunks), for the
/// members' elements one after another.
template <int N>
__global__ void chunk_sum_kernel(const __grid_constant__ sum_set<N> set, int chunks) {
  cuda::detail::grid_dependency_wait();
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= set.end[set.count - 1]) return;
  const float* part = set.part[0];
  float* y = set.y[0];
  long long j = i, count = set.end[0];
#pragma unroll
  for (int m = 1; m < N; ++m)
    if (m < set.count && i >= set.end[m - 1])
      part = set.part[m], y = set.y[m], j = i - set.end[m - 1], count = set.end[m] - set.end[m - 1];
  float s = 0.0f;
  for (int c = 0; c < chunks; ++c) s = s + part[c * count + j];
  y[j] = s;
}

// ---- tiled kernel (skinny and wide) ------------------------------------------------------

/// Warp tile MT x 16 rows by NT x 8 slots, WW x WT warps, BK of K per pipeline stage.
/// WK > 1 (split_kernel): WK warps on each warp tile, one summation chunk each per stage
/// (BK = 128 WK).
template <int MT_, int NT_, int WW_, int WT_, int BK_, int STAGES_, int WK_ = 1>
struct tile_shape {
  static constexpr int MT = MT_, NT = NT_, WW = WW_, WT = WT_, BK = BK_, STAGES = STAGES_, WK = WK_;
  static constexpr int BW = MT * 16 * WW;  ///< weight rows per block
  static constexpr int BT = NT * 8 * WT;   ///< slots per block
  static constexpr int threads = WW * WT * WK * 32;
  static constexpr int KB = BK / 32;       ///< K blocks per stage
};
using narrow_shape = tile_shape<1, 1, 4, 1, 256, 4>;    // 64 x 8: a weight stream for few slots
using narrow16_shape = tile_shape<1, 2, 2, 1, 256, 4>;  // 32 x 16
using narrow32_shape = tile_shape<1, 4, 4, 1, 256, 3>;  // 64 x 32 (3 stages: 60 KB of shared memory)
using split4_shape = tile_shape<1, 1, 1, 1, 512, 4, 4>;   // 16 x 8, K over 4 warps
using split8_shape = tile_shape<1, 1, 1, 1, 1024, 3, 8>;  // 16 x 8, K over 8 warps
using skinny_shape = tile_shape<1, 4, 2, 2, 256, 4>;  // 32 x 64
using wide_shape = tile_shape<4, 4, 2, 4, 128, 4>;    // 128 x 128

/// Shared-memory layout of one stage. Rows are padded so that the 8-byte fragment loads of a
/// half-warp (4 rows x 4 threads) hit 32 distinct banks.
template <class S, bool FP4>
struct stage_layout {
  static constexpr int w_stride = FP4 ? S::BK / 2 + 16 : S::BK + 32;
  static constexpr int x_stride = S::BK + 32;
  static constexpr int ws_rows = FP4 ? S::BW : (S::BW + 31) / 32;
  static constexpr int w_bytes = S::BW * w_stride;
  static constexpr int x_bytes = S::BT * x_stride;
  static constexpr int xs_bytes = S::BT * S::KB * 4;
  static constexpr int ws_bytes = (ws_rows * S::KB + 15) / 16 * 16;
  static constexpr int bytes = w_bytes + x_bytes + xs_bytes + ws_bytes;
};

/// The cp.async copies of one pipeline stage (weight rows, x codes and scales of the block's
/// slots, weight scales), each thread's source rows resolved once per block (the slot -> x row
/// lookups and the row arithmetic are not repeated per stage; with k % BK == 0, which the tiled
/// kernel's launch requires, every K piece is in range; the split kernel's last stage loads only
/// its chunks). load(k0, smem) issues a stage.
template <class S, bool FP4>
struct stage_loader {
  using L = stage_layout<S, FP4>;
  static constexpr int w_row_bytes = FP4 ? S::BK / 2 : S::BK, w_pieces = w_row_bytes / 16;
  static constexpr int x_pieces = S::BK / 16, xs_pieces = S::KB / 4, ws_pieces = S::KB / 4;
  static constexpr int w_jobs = S::BW * w_pieces, x_jobs = S::BT * x_pieces, xs_jobs = S::BT * xs_pieces,
                       ws_jobs = L::ws_rows * ws_pieces;
  static constexpr int iters(int jobs) { return (jobs + S::threads - 1) / S::threads; }
  static constexpr int w_n = iters(w_jobs), x_n = iters(x_jobs), xs_n = iters(xs_jobs), ws_n = iters(ws_jobs);

  // 32-bit offsets from the four bases (a weight, x codes or scales stay far below 4 GB): half
  // the registers of pointers
  const uint8_t *w_base, *x_base, *ws_base;
  const float* xs_base;
  uint32_t w[w_n], x[x_n], xs[xs_n], ws[ws_n];
  bool x_ok[x_n], xs_ok[xs_n];

  __device__ __forceinline__ stage_loader(const gemm_problem& p, const group_view& gv, int n0, int slot0)
      : w_base(gv.w), x_base(p.xq), ws_base(gv.ws), xs_base(p.xs) {
    const int tid = threadIdx.x;
    const uint32_t w_gstride = FP4 ? p.k / 2 : p.k;
#pragma unroll
    for (int i = 0; i < w_n; ++i) {
      const int c = tid + i * S::threads, r = c / w_pieces, piece = c % w_pieces;
      w[i] = uint32_t(n0 + r) * w_gstride + piece * 16;
    }
#pragma unroll
    for (int i = 0; i < x_n; ++i) {
      const int c = tid + i * S::threads, r = c / x_pieces, piece = c % x_pieces, s = slot0 + r;
      x_ok[i] = c < x_jobs && s < gv.count;
      x[i] = x_ok[i] ? uint32_t(x_row(p, gv.first + s)) * uint32_t(p.k) + piece * 16 : 0u;
    }
#pragma unroll
    for (int i = 0; i < xs_n; ++i) {
      const int c = tid + i * S::threads, r = c / xs_pieces, piece = c % xs_pieces, s = slot0 + r;
      xs_ok[i] = c < xs_jobs && s < gv.count;
      xs[i] = xs_ok[i] ? uint32_t(x_row(p, gv.first + s)) * uint32_t(p.k / 32) + piece * 4 : 0u;
    }
#pragma unroll
    for (int i = 0; i < ws_n; ++i) {
      const int c = tid + i * S::threads, r = c / ws_pieces, piece = c % ws_pieces;
      const int row = FP4 ? n0 + r : n0 / 32 + r;
      ws[i] = uint32_t(row) * uint32_t(p.k / 32) + piece * 4;
    }
  }

  /// Stage k0 .. k0 + BK; with Tail, only its first kb_end K blocks (a multiple of 4). Part:
  /// everything, or only the weight (codes, scales), or only x (codes, scales).
  enum part { all, weight, x_only };
  template <bool Tail = false, part Part = all>
  __device__ __forceinline__ void load(int k0, uint8_t* smem, int kb_end = S::KB) const {
    constexpr bool W = Part != x_only, X = Part != weight;
    uint8_t* sw = smem;
    uint8_t* sx = smem + L::w_bytes;
    float* sxs = reinterpret_cast<float*>(sx + L::x_bytes);
    uint8_t* sws = sx + L::x_bytes + L::xs_bytes;
    const int tid = threadIdx.x;
    const uint32_t k0_bytes = FP4 ? k0 / 2 : k0, kb0 = k0 / 32;
#pragma unroll
    for (int i = 0; i < w_n; ++i) {
      const int c = tid + i * S::threads;
      if (W && (w_jobs % S::threads == 0 || c < w_jobs) && (!Tail || (FP4 ? c % w_pieces : c % w_pieces / 2) < kb_end))
        cp_async16(sw + (c / w_pieces) * L::w_stride + (c % w_pieces) * 16, w_base + (w[i] + k0_bytes), true);
    }
#pragma unroll
    for (int i = 0; i < x_n; ++i) {
      const int c = tid + i * S::threads;
      if (X && (x_jobs % S::threads == 0 || c < x_jobs) && (!Tail || (c % x_pieces) / 2 < kb_end))
        cp_async16(sx + (c / x_pieces) * L::x_stride + (c % x_pieces) * 16, x_base + (x_ok[i] ? x[i] + k0 : 0u), x_ok[i]);
    }
#pragma unroll
    for (int i = 0; i < xs_n; ++i) {
      const int c = tid + i * S::threads;
      if (X && (xs_jobs % S::threads == 0 || c < xs_jobs) && (!Tail || (c % xs_pieces) * 4 < kb_end))
        cp_async16(sxs + (c / xs_pieces) * S::KB + (c % xs_pieces) * 4, xs_base + (xs_ok[i] ? xs[i] + kb0 : 0u),
                   xs_ok[i]);
    }
#pragma unroll
    for (int i = 0; i < ws_n; ++i) {
      const int c = tid + i * S::threads;
      if (W && (ws_jobs % S::threads == 0 || c < ws_jobs) && (!Tail || (c % ws_pieces) * 4 < kb_end))
        cp_async4(sws + (c / ws_pieces) * S::KB + (c % ws_pieces) * 4, ws_base + (ws[i] + kb0), true);
    }
  }

  /// The first `stages` stages (issue<Part>(t) loads stage t), one cp.async group per stage and
  /// part: the weight's first, then, after the kernels before this one have finished (launched
  /// as a dependent, the block may start while they run), x's. Groups stay in stage order for
  /// the main loop's cp_async_wait<STAGES - 2>: stage t's weight and x groups are both older
  /// than the last STAGES - 2 groups once the loop reaches t.
  template <class Issue>
  __device__ __forceinline__ static void prologue(int stages, const Issue& issue) {
#pragma unroll
    for (int s = 0; s < S::STAGES - 1; ++s) {
      if (s < stages) issue(s, std::integral_constant<part, weight>{});
      cp_async_commit();
    }
    cuda::detail::grid_dependency_wait();
#pragma unroll
    for (int s = 0; s < S::STAGES - 1; ++s) {
      if (s < stages) issue(s, std::integral_constant<part, x_only>{});
      cp_async_commit();
    }
  }
};

/// One K block kb of a pipeline stage st for warp tile (ww, wt): part += its mmas, each times
/// sw * sx (an exact power of two) fused into the add.
template <class S, bool FP4>
__device__ __forceinline__ void stage_block(const uint8_t* st, int kb, int ww, int wt, int g, int tig,
                                            float (&part)[S::MT][S::NT][4]) {
  using L = stage_layout<S, FP4>;
  const uint8_t* sw = st;
  const uint8_t* sxq = st + L::w_bytes;
  const float* sxs = reinterpret_cast<const float*>(sxq + L::x_bytes);
  const uint8_t* sws = sxq + L::x_bytes + L::xs_bytes;
  uint32_t a[S::MT][4], b[S::NT][2];
  float sw0[S::MT], sw1[S::MT], sx[S::NT][2];
#pragma unroll
  for (int i = 0; i < S::MT; ++i) {
    const int r = ww * S::MT * 16 + i * 16 + g;
    load_a<FP4, false>(sw, L::w_stride, r, kb, tig, a[i]);
    if constexpr (FP4) {
      sw0[i] = ue8m0_value(sws[r * S::KB + kb]);
      sw1[i] = ue8m0_value(sws[(r + 8) * S::KB + kb]);
    } else {
      sw0[i] = sw1[i] = ue8m0_value(sws[(r / 32) * S::KB + kb]);
    }
  }
#pragma unroll
  for (int j = 0; j < S::NT; ++j) {
    const int t = wt * S::NT * 8 + j * 8;
    const uint2 v = *reinterpret_cast<const uint2*>(sxq + (t + g) * L::x_stride + kb * 32 + tig * 8);
    b[j][0] = v.x, b[j][1] = v.y;
    sx[j][0] = sxs[(t + tig * 2) * S::KB + kb];
    sx[j][1] = sxs[(t + tig * 2 + 1) * S::KB + kb];
  }
#pragma unroll
  for (int i = 0; i < S::MT; ++i)
#pragma unroll
    for (int j = 0; j < S::NT; ++j) {
      float d[4];
      mma_e4m3(d, a[i], b[j]);
      part[i][j][0] = fmaf(d[0], sw0[i] * sx[j][0], part[i][j][0]);
      part[i][j][1] = fmaf(d[1], sw0[i] * sx[j][1], part[i][j][1]);
      part[i][j][2] = fmaf(d[2], sw1[i] * sx[j][0], part[i][j][2]);
      part[i][j][3] = fmaf(d[3], sw1[i] * sx[j][1], part[i][j][3]);
    }
}

/// The block's outputs from a warp tile's totals.
template <class S>
__device__ __forceinline__ void store_tile(const gemm_problem& p, const group_view& gv, int n0, int slot0, int ww,
                                           int wt, int g, int tig, const float (&total)[S::MT][S::NT][4]) {
#pragma unroll
  for (int i = 0; i < S::MT; ++i)
#pragma unroll
    for (int j = 0; j < S::NT; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int s = slot0 + wt * S::NT * 8 + j * 8 + tig * 2 + c;
        if (s >= gv.count) continue;
        const int n = n0 + ww * S::MT * 16 + i * 16 + g;
        float* yr = gv.y + size_t(gv.first + s) * p.n;
        yr[n] = total[i][j][c];
        yr[n + 8] = total[i][j][2 + c];
      }
}

/// grid (n / BW, ceil(max slots / BT), groups).
template <class S, bool FP4>
__global__ void __launch_bounds__(S::threads) tiled_kernel(gemm_problem p) {
  using L = stage_layout<S, FP4>;
  using loader_t = stage_loader<S, FP4>;
  extern __shared__ __align__(16) uint8_t smem[];
  if (p.groups) cuda::detail::grid_dependency_wait();  // the group tables come from the kernel before
  const group_view gv = group_of(p);
  const int n0 = blockIdx.x * S::BW, slot0 = blockIdx.y * S::BT;
  if (slot0 >= gv.count) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tig = lane % 4;
  const int ww = warp % S::WW, wt = warp / S::WW;
  const int k_tiles = p.k / S::BK;  // the launch requires k % BK == 0

  static_assert(S::KB % chunk_blocks == 0, "a stage holds whole summation chunks");
  float total[S::MT][S::NT][4] = {}, part[S::MT][S::NT][4] = {};
  const loader_t loader(p, gv, n0, slot0);
  loader_t::prologue(k_tiles, [&](int t, auto which) {
    loader.template load<false, decltype(which)::value>(t * S::BK, smem + t * L::bytes);
  });
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<S::STAGES - 2>();
    __syncthreads();
    const int next = kt + S::STAGES - 1;
    if (next < k_tiles) loader.load(next * S::BK, smem + (next % S::STAGES) * L::bytes);
    cp_async_commit();
    const uint8_t* st = smem + (kt % S::STAGES) * L::bytes;
#pragma unroll
    for (int kb = 0; kb < S::KB; ++kb) {  // k % BK == 0: every K block of the stage is in range
      stage_block<S, FP4>(st, kb, ww, wt, g, tig, part);
      if ((kb + 1) % chunk_blocks == 0) {  // a stage starts on a chunk boundary (KB % 4 == 0)
#pragma unroll
        for (int i = 0; i < S::MT; ++i)
#pragma unroll
          for (int j = 0; j < S::NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) total[i][j][e] = total[i][j][e] + part[i][j][e], part[i][j][e] = 0.0f;
      }
    }
  }
  cp_async_wait<0>();
  store_tile<S>(p, gv, n0, slot0, ww, wt, g, tig, total);
}

/// The tiled kernel with K split over the warps: WK warps share each warp tile, warp wk taking
/// chunk WK kt + wk of stage kt (k % 128 == 0; the last stage may hold fewer chunks). Warp 0
/// keeps the total: at the top of stage kt + 1 it adds its own chunk of stage kt, then the
/// others' (left in shared memory, two stages of them), in ascending order, so the sums are
/// the tiled kernel's. For weights whose few row tiles leave each warp a long serial K stream.
/// grid (sum of n_i / BW, ceil(max slots / BT), groups): a set's members one after another.
template <int N>
struct split_set {
  gemm_problem p[N];  ///< one grouped problem, or up to N dense ones of one x (xq, xs, m, k)
  int end[N];         ///< block columns, cumulative
  int count;
};

template <class S, bool FP4, int N>
__global__ void __launch_bounds__(S::threads) split_kernel(const __grid_constant__ split_set<N> set) {
  static_assert(S::WK > 1 && S::KB == S::WK * chunk_blocks, "one chunk per warp per stage");
  using L = stage_layout<S, FP4>;
  constexpr int tiles = S::WW * S::WT, vals = S::MT * S::NT * 4;
  extern __shared__ __align__(16) uint8_t smem[];
  float* exch = reinterpret_cast<float*>(smem + S::STAGES * L::bytes);  // [2][WK - 1][tiles][vals][32]
  using loader_t = stage_loader<S, FP4>;
  gemm_problem p = set.p[0];
  if (p.groups) cuda::detail::grid_dependency_wait();  // the group tables come from the kernel before
  int bx = int(blockIdx.x);
  if constexpr (N > 1) {
    // selects over constant indices (the parameters are never indexed at run time)
#pragma unroll
    for (int i = 1; i < N; ++i)
      if (i < set.count && int(blockIdx.x) >= set.end[i - 1])
        p.w = set.p[i].w, p.ws = set.p[i].ws, p.y = set.p[i].y, p.n = set.p[i].n, bx = int(blockIdx.x) - set.end[i - 1];
  }
  const group_view gv = group_of(p);
  const int n0 = bx * S::BW, slot0 = blockIdx.y * S::BT;
  if (slot0 >= gv.count) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tig = lane % 4;
  const int tw = warp % tiles, wk = warp / tiles, ww = tw % S::WW, wt = tw / S::WW;
  const int chunks = p.k / chunk_k, k_tiles = (chunks + S::WK - 1) / S::WK;

  float total[S::MT][S::NT][4] = {}, own[S::MT][S::NT][4] = {};
  const auto fold = [&](int kt) {  // warp 0: the chunks of stage kt into total, ascending
#pragma unroll
    for (int i = 0; i < S::MT; ++i)
#pragma unroll
      for (int j = 0; j < S::NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) total[i][j][e] = total[i][j][e] + own[i][j][e];
#pragma unroll
    for (int w = 1; w < S::WK; ++w) {
      if (kt * S::WK + w >= chunks) break;
      const float* src = exch + ((size_t((kt & 1) * (S::WK - 1) + w - 1) * tiles + tw) * vals) * 32 + lane;
#pragma unroll
      for (int i = 0; i < S::MT; ++i)
#pragma unroll
        for (int j = 0; j < S::NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) total[i][j][e] = total[i][j][e] + src[((i * S::NT + j) * 4 + e) * 32];
    }
  };
  const loader_t loader(p, gv, n0, slot0);
  const auto issue = [&](int t, auto which) {
    constexpr auto part = decltype(which)::value;
    const int left = (chunks - t * S::WK) * chunk_blocks;
    if (left >= S::KB) loader.template load<false, part>(t * S::BK, smem + (t % S::STAGES) * L::bytes);
    else loader.template load<true, part>(t * S::BK, smem + (t % S::STAGES) * L::bytes, left);
  };
  loader_t::prologue(k_tiles, issue);
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<S::STAGES - 2>();
    __syncthreads();
    if (wk == 0 && kt > 0) fold(kt - 1);
    const int next = kt + S::STAGES - 1;
    if (next < k_tiles) issue(next, std::integral_constant<typename loader_t::part, loader_t::all>{});
    cp_async_commit();
    if (kt * S::WK + wk >= chunks) continue;
    const uint8_t* st = smem + (kt % S::STAGES) * L::bytes;
    float part[S::MT][S::NT][4] = {};
#pragma unroll
    for (int kb = 0; kb < chunk_blocks; ++kb) stage_block<S, FP4>(st, wk * chunk_blocks + kb, ww, wt, g, tig, part);
    if (wk == 0) {
#pragma unroll
      for (int i = 0; i < S::MT; ++i)
#pragma unroll
        for (int j = 0; j < S::NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) own[i][j][e] = part[i][j][e];
    } else {
      float* dst = exch + ((size_t((kt & 1) * (S::WK - 1) + wk - 1) * tiles + tw) * vals) * 32 + lane;
#pragma unroll
      for (int i = 0; i < S::MT; ++i)
#pragma unroll
        for (int j = 0; j < S::NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) dst[((i * S::NT + j) * 4 + e) * 32] = part[i][j][e];
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  if (wk != 0) return;
  fold(k_tiles - 1);
  store_tile<S>(p, gv, n0, slot0, ww, wt, g, tig, total);
}

// ---- launch ----------------------------------------------------------------------------------

/// One direct launch and one chunk-sum launch for the `count` (<= N) problems of one x (all
/// with the same xq, m and k; a grouped problem alone).
template <bool FP4, int NT, int N>
void launch_direct_n(const gemm_problem* ps, int count, int num_groups, int max_slots) {
  const int token_tiles = (max_slots + 8 * NT - 1) / (8 * NT);
  const int k = ps[0].k, total_slots = ps[0].m;
  const int chunks = (k + chunk_k - 1) / chunk_k;
  size_t part_elems = 0;
  for (int i = 0; i < count; ++i) part_elems += size_t(chunks) * total_slots * ps[i].n;
  scratch<float> part(part_elems);
  direct_set<N> blocks{};
  sum_set<N> sums{};
  blocks.count = sums.count = count;
  size_t off = 0;
  int cols = 0;
  long long elems = 0;
  for (int i = 0; i < count; ++i) {
    blocks.p[i] = ps[i];
    blocks.part[i] = part.get() + off;
    sums.part[i] = blocks.part[i];
    sums.y[i] = ps[i].y;
    off += size_t(chunks) * total_slots * ps[i].n;
    cols += (ps[i].n + direct_warps * 16 - 1) / (direct_warps * 16);
    elems += (long long)total_slots * ps[i].n;
    blocks.end[i] = cols;
    sums.end[i] = elems;
  }
  const int k_groups = (chunks + direct_chunks<FP4> - 1) / direct_chunks<FP4>;
  const dim3 grid(cols, k_groups, num_groups * token_tiles);
  cuda::detail::launch_dependent(direct_kernel<FP4, NT, N>, grid, dim3(direct_warps * 32), 0, blocks, token_tiles);
  cuda::detail::launch_dependent(chunk_sum_kernel<N>, dim3(cuda::detail::blocks_for(elems, 256)), dim3(256), 0, sums,
                                 chunks);
}

template <bool FP4, int NT>
void launch_direct(const gemm_problem* ps, int count, int num_groups, int max_slots) {
  if constexpr (!FP4)  // sets are dense FP8 calls (gemm_fp8_set; run() checks)
    if (count > 1) return launch_direct_n<FP4, NT, max_set>(ps, count, num_groups, max_slots);
  launch_direct_n<FP4, NT, 1>(ps, 1, num_groups, max_slots);
}

template <class S, bool FP4>
void launch_tiled(const gemm_problem& p, int num_groups, int max_slots) {
  constexpr int smem = S::STAGES * stage_layout<S, FP4>::bytes;
  static bool attr_set = false;  // set once per instantiation (first call is on one thread)
  if (!attr_set) {
    CEDAR_CUDA_CHECK(cudaFuncSetAttribute(tiled_kernel<S, FP4>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr_set = true;
  }
  const dim3 grid(p.n / S::BW, (max_slots + S::BT - 1) / S::BT, num_groups);
  cuda::detail::launch_dependent(tiled_kernel<S, FP4>, grid, dim3(S::threads), smem, p);
}

template <class S, bool FP4, int N>
void launch_split_n(const gemm_problem* ps, int count, int num_groups, int max_slots) {
  constexpr int smem = S::STAGES * stage_layout<S, FP4>::bytes +
                       2 * (S::WK - 1) * S::WW * S::WT * S::MT * S::NT * 4 * 32 * int(sizeof(float));
  static bool attr_set = false;  // set once per instantiation (first call is on one thread)
  if (!attr_set) {
    CEDAR_CUDA_CHECK(cudaFuncSetAttribute(split_kernel<S, FP4, N>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr_set = true;
  }
  split_set<N> set{};
  set.count = count;
  int cols = 0;
  for (int i = 0; i < count; ++i) {
    set.p[i] = ps[i];
    cols += ps[i].n / S::BW;
    set.end[i] = cols;
  }
  const dim3 grid(cols, (max_slots + S::BT - 1) / S::BT, num_groups);
  cuda::detail::launch_dependent(split_kernel<S, FP4, N>, grid, dim3(S::threads), smem, set);
}

template <class S, bool FP4>
void launch_split(const gemm_problem* ps, int count, int num_groups, int max_slots) {
  if constexpr (!FP4)  // sets are dense FP8 calls (run() checks)
    if (count > 1) return launch_split_n<S, FP4, max_set>(ps, count, num_groups, max_slots);
  launch_split_n<S, FP4, 1>(ps, 1, num_groups, max_slots);
}

void require_shape(const gemm_problem& p, tile_kind t) {
  if (t == tile_kind::gemv)
    CEDAR_CUDA_REQUIRE(p.k % 32 == 0 && p.n % 16 == 0, "fast gemm (gemv): k % 32 == 0 and n % 16 == 0");
  else if (t == tile_kind::split4 || t == tile_kind::split8)
    CEDAR_CUDA_REQUIRE(p.k % 128 == 0 && p.n % 16 == 0, "fast gemm (split4, split8): k % 128 == 0 and n % 16 == 0");
  else if (t == tile_kind::narrow || t == tile_kind::narrow32)
    CEDAR_CUDA_REQUIRE(p.k % 256 == 0 && p.n % 64 == 0, "fast gemm (narrow, narrow32): k % 256 == 0 and n % 64 == 0");
  else if (t == tile_kind::narrow16)
    CEDAR_CUDA_REQUIRE(p.k % 256 == 0 && p.n % 32 == 0, "fast gemm (narrow16): k % 256 == 0 and n % 32 == 0");
  else
    CEDAR_CUDA_REQUIRE(p.k % 256 == 0 && p.n % 128 == 0, "fast gemm: k % 256 == 0 and n % 128 == 0");
}

/// The `count` problems of one x (count > 1: dense ones, the gemv tile) or one grouped problem
/// (a pair when p.groups2 is set: 2 x num_groups blocks in z, the tiled kernels).
template <bool FP4>
void run(const gemm_problem* ps, int count, int num_groups, int max_slots, tile_kind t) {
  const bool set_tile = t == tile_kind::gemv || t == tile_kind::split4 || t == tile_kind::split8;
  CEDAR_CUDA_REQUIRE(count == 1 || (!FP4 && set_tile && !ps[0].groups),
                     "fast gemm: a set of several weights is dense FP8 on the gemv or split tiles");
  for (int i = 0; i < count; ++i) require_shape(ps[i], t);
  if (max_slots <= 0) return;
  const gemm_problem& p = ps[0];
  const int z = p.groups2 ? 2 * num_groups : num_groups;
  switch (t) {
    case tile_kind::gemv:
      if (max_slots <= 8) launch_direct<FP4, 1>(ps, count, num_groups, max_slots);
      else launch_direct<FP4, 2>(ps, count, num_groups, max_slots);
      break;
    case tile_kind::narrow: launch_tiled<narrow_shape, FP4>(p, z, max_slots); break;
    case tile_kind::split4: launch_split<split4_shape, FP4>(ps, count, z, max_slots); break;
    case tile_kind::split8: launch_split<split8_shape, FP4>(ps, count, z, max_slots); break;
    case tile_kind::narrow16: launch_tiled<narrow16_shape, FP4>(p, z, max_slots); break;
    case tile_kind::narrow32: launch_tiled<narrow32_shape, FP4>(p, z, max_slots); break;
    case tile_kind::skinny: launch_tiled<skinny_shape, FP4>(p, z, max_slots); break;
    case tile_kind::wide: launch_tiled<wide_shape, FP4>(p, z, max_slots); break;
  }
}

}  // namespace
}  // namespace detail

const char* tile_name(tile_kind t) {
  switch (t) {
    case tile_kind::gemv: return "gemv";
    case tile_kind::narrow: return "narrow";
    case tile_kind::split4: return "split4";
    case tile_kind::split8: return "split8";
    case tile_kind::narrow16: return "narrow16";
    case tile_kind::narrow32: return "narrow32";
    case tile_kind::skinny: return "skinny";
    case tile_kind::wide: return "wide";
  }
  return "?";
}

tile_kind pick_tile(int m) { return m <= 8 ? tile_kind::gemv : m <= 64 ? tile_kind::skinny : tile_kind::wide; }

void quantize_rows_fp8(const float* x, int m, int k, uint8_t* codes, float* scales) {
  CEDAR_CUDA_REQUIRE(k % 32 == 0, "quantize_rows_fp8: k % 32 == 0");
  const long long groups = (long long)m * (k / 32);
  if (groups == 0) return;
  cuda::detail::launch_dependent(detail::quantize_kernel, dim3(cuda::detail::blocks_for(groups * 32, 256)), dim3(256), 0,
                                 x, groups, codes, scales);
}

void gemm_fp8(const uint8_t* xq, const float* xs, int m, const fp8_weight& w, float* y, tile_kind t) {
  const detail::gemm_problem p{w.data, w.scale, xq, xs, nullptr, nullptr, y, m, w.out, w.in};
  detail::run<false>(&p, 1, 1, m, t);
}

void gemm_fp8_set(const uint8_t* xq, const float* xs, int m, int count, const fp8_weight* const* w, float* const* y,
                  tile_kind t) {
  CEDAR_CUDA_REQUIRE(count >= 1 && count <= detail::max_set, "gemm_fp8_set: 1 to 4 weights");
  detail::gemm_problem ps[detail::max_set];
  for (int i = 0; i < count; ++i) {
    CEDAR_CUDA_REQUIRE(w[i]->in == w[0]->in, "gemm_fp8_set: the weights take one x (same in)");
    ps[i] = {w[i]->data, w[i]->scale, xq, xs, nullptr, nullptr, y[i], m, w[i]->out, w[i]->in};
  }
  detail::run<false>(ps, count, 1, m, t);
}

void gemm_fp4(const uint8_t* xq, const float* xs, int m, const fp4_weight& w, float* y, tile_kind t) {
  const detail::gemm_problem p{w.data, w.scale, xq, xs, nullptr, nullptr, y, m, w.out, w.in};
  detail::run<true>(&p, 1, 1, m, t);
}

void grouped_fp4(const uint8_t* xq, const float* xs, const int32_t* slot_rows, const expert_group* groups,
                 int num_groups, int total_slots, int max_slots, int n, int k, float* y, tile_kind t) {
  CEDAR_CUDA_REQUIRE(slot_rows != nullptr, "grouped_fp4: slot_rows");
  const detail::gemm_problem p{nullptr, nullptr, xq, xs, slot_rows, groups, y, total_slots, n, k};
  detail::run<true>(&p, 1, num_groups, max_slots, t);
}

void grouped_fp4_pair(const uint8_t* xq, const float* xs, const int32_t* slot_rows, const expert_group* groups_a,
                      const expert_group* groups_b, int num_groups, int total_slots, int max_slots, int n, int k,
                      float* y_a, float* y_b, tile_kind t) {
  if (t == tile_kind::gemv) {  // the direct kernel's partial buffers hold one grouped product
    grouped_fp4(xq, xs, slot_rows, groups_a, num_groups, total_slots, max_slots, n, k, y_a, t);
    grouped_fp4(xq, xs, slot_rows, groups_b, num_groups, total_slots, max_slots, n, k, y_b, t);
    return;
  }
  CEDAR_CUDA_REQUIRE(slot_rows != nullptr, "grouped_fp4_pair: slot_rows");
  detail::gemm_problem p{nullptr, nullptr, xq, xs, slot_rows, groups_a, y_a, total_slots, n, k};
  p.groups2 = groups_b, p.y2 = y_b, p.split = num_groups;
  detail::run<true>(&p, 1, num_groups, max_slots, t);
}

}  // namespace cedar::cuda::fast
