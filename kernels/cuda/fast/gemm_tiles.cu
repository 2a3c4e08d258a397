// The pipelined tiles of the FP8 / W4A8 GEMMs (fast_ops.hpp, tile_kind): a cp.async-pipelined
// tiled kernel (narrow 64x8, 32x16 and 64x32: weight streams for a few slots; skinny 32x64; wide
// 128x128 for prefill) and the same with K split over the warps of a block (split4, split8: 16x8
// for decode weights of few rows and long K). They keep gemm.cu's summation order, so every tile
// gives a row the same bits.
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fast/gemm.cuh"

namespace cedar::cuda::fast::detail {
namespace {

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
using narrow_one_wave_shape = tile_shape<2, 1, 2, 1, 256, 4>;  // the same 64 x 8 on 2 warps of 32 rows
using narrow16_shape = tile_shape<1, 2, 2, 1, 256, 4>;  // 32 x 16
using narrow32_shape = tile_shape<1, 4, 4, 1, 256, 3>;  // 64 x 32 (3 stages: 60 KB of shared memory)
using split4_shape = tile_shape<1, 1, 1, 1, 512, 4, 4>;   // 16 x 8, K over 4 warps
using split8_shape = tile_shape<1, 1, 1, 1, 1024, 3, 8>;  // 16 x 8, K over 8 warps
using skinny_shape = tile_shape<1, 4, 2, 2, 256, 4>;  // 32 x 64
using wide_shape = tile_shape<4, 4, 2, 4, 128, 4>;    // 128 x 128

/// Shared-memory layout of one stage. Rows are padded so that the 8-byte fragment loads of a
/// half-warp (4 rows x 4 threads) hit 32 distinct banks. PAIRS (FP4 only): x as fp4_x_pairs
/// writes it, f16 pairs, unpadded, an odd row's 64-byte K blocks swapped in pairs (pair_piece:
/// a quarter warp's 16-byte loads of two rows miss each other's banks), and one factor a
/// summation chunk in place of the scales.
template <class S, bool FP4, bool PAIRS = false>
struct stage_layout {
  static_assert(FP4 || !PAIRS, "x pairs are the W4A8 tiles' operand");
  static constexpr int w_stride = FP4 ? S::BK / 2 + 16 : S::BK + 32;
  static constexpr int x_stride = PAIRS ? 2 * S::BK : S::BK + 32;
  static constexpr int xs_stage = PAIRS ? S::KB / chunk_blocks : S::KB;  ///< x scales (factors) a row
  static constexpr int ws_rows = FP4 ? S::BW : (S::BW + 31) / 32;
  static constexpr int w_bytes = S::BW * w_stride;
  static constexpr int x_bytes = S::BT * x_stride;
  static constexpr int xs_bytes = (S::BT * xs_stage * 4 + 15) / 16 * 16;
  static constexpr int ws_bytes = (ws_rows * S::KB + 15) / 16 * 16;
  static constexpr int bytes = w_bytes + x_bytes + xs_bytes + ws_bytes;
};

/// Where 16-byte piece `piece` of an x row's pairs sits in its stage row: an odd row's K blocks
/// (4 pieces each) swapped in pairs.
__device__ __forceinline__ int pair_piece(int row, int piece) { return piece ^ (row & 1) << 2; }

/// The cp.async copies of one pipeline stage (weight rows, x codes and scales of the block's
/// slots, weight scales), each thread's source rows resolved once per block (the slot -> x row
/// lookups and the row arithmetic are not repeated per stage; with k % BK == 0, which the tiled
/// kernel's launch requires, every K piece is in range; the split kernel's last stage loads only
/// its chunks). load(k0, smem) issues a stage. SWIGLU (FP4): rows [0, BW/2) of the block come
/// from gv.w at n0 + r, rows [BW/2, BW) from gv.w2 at n0 + r - BW/2 (group_view's w3).
template <class S, bool FP4, bool PAIRS = false, bool SWIGLU = false>
struct stage_loader {
  static_assert(FP4 || !SWIGLU, "SwiGLU in the tile is the routed experts' w1 and w3");
  using L = stage_layout<S, FP4, PAIRS>;
  static constexpr int w_row_bytes = FP4 ? S::BK / 2 : S::BK, w_pieces = w_row_bytes / 16;
  static constexpr int x_bytes_per = PAIRS ? 2 : 1;  ///< x bytes a K position
  /// x pieces of 16 bytes (a K block: 2, or 4 as pairs); scales 4 a piece (16 bytes), or factors
  /// one a piece (4 bytes): either way a piece covers 4 K blocks
  static constexpr int x_pieces = S::BK * x_bytes_per / 16, xs_pieces = S::KB / 4, ws_pieces = S::KB / 4;
  static constexpr int xs_unit = PAIRS ? 1 : 4;
  static constexpr int w_jobs = S::BW * w_pieces, x_jobs = S::BT * x_pieces, xs_jobs = S::BT * xs_pieces,
                       ws_jobs = L::ws_rows * ws_pieces;
  static constexpr int iters(int jobs) { return (jobs + S::threads - 1) / S::threads; }
  static constexpr int w_n = iters(w_jobs), x_n = iters(x_jobs), xs_n = iters(xs_jobs), ws_n = iters(ws_jobs);

  // 32-bit offsets from the four bases (a weight, x codes or scales stay far below 4 GB): half
  // the registers of pointers
  static constexpr int half = S::BW / 2;
  static_assert(w_n <= 32 && ws_n <= 32, "a bit a job in w_hi / ws_hi");
  const uint8_t *w_base, *x_base, *ws_base;
  const float* xs_base;
  const uint8_t *w_base2, *ws_base2;  ///< SWIGLU: the second weight
  uint32_t w[w_n], x[x_n], xs[xs_n], ws[ws_n];
  uint32_t w_hi = 0, ws_hi = 0;  ///< SWIGLU: bit i set where job i reads the second weight
  bool x_ok[x_n], xs_ok[xs_n];

  __device__ __forceinline__ stage_loader(const gemm_problem& p, const group_view& gv, int n0, int slot0)
      : w_base(gv.w),
        x_base(PAIRS ? p.xh : p.xq),
        ws_base(gv.ws),
        xs_base(PAIRS ? p.xf : p.xs),
        w_base2(gv.w2),
        ws_base2(gv.ws2) {
    const int tid = threadIdx.x;
    const uint32_t w_gstride = FP4 ? p.k / 2 : p.k;
#pragma unroll
    for (int i = 0; i < w_n; ++i) {
      const int c = tid + i * S::threads, r = c / w_pieces, piece = c % w_pieces;
      int row = n0 + r;
      if (SWIGLU && r >= half) row -= half, w_hi |= 1u << i;
      w[i] = uint32_t(row) * w_gstride + piece * 16;
    }
#pragma unroll
    for (int i = 0; i < x_n; ++i) {
      const int c = tid + i * S::threads, r = c / x_pieces, piece = c % x_pieces, s = slot0 + r;
      x_ok[i] = c < x_jobs && s < gv.count;
      x[i] = x_ok[i] ? uint32_t(x_row(p, gv.first + s)) * uint32_t(p.k * x_bytes_per) + piece * 16 : 0u;
    }
#pragma unroll
    for (int i = 0; i < xs_n; ++i) {
      const int c = tid + i * S::threads, r = c / xs_pieces, piece = c % xs_pieces, s = slot0 + r;
      xs_ok[i] = c < xs_jobs && s < gv.count;
      xs[i] = xs_ok[i] ? uint32_t(x_row(p, gv.first + s)) * uint32_t(p.k / 32 / (4 / xs_unit)) + piece * xs_unit : 0u;
    }
#pragma unroll
    for (int i = 0; i < ws_n; ++i) {
      const int c = tid + i * S::threads, r = c / ws_pieces, piece = c % ws_pieces;
      int row = FP4 ? n0 + r : n0 / 32 + r;
      if (SWIGLU && r >= half) row -= half, ws_hi |= 1u << i;
      ws[i] = uint32_t(row) * uint32_t(p.k / 32) + piece * 4;
    }
  }

  /// The weight (codes, scales) job i reads.
  __device__ __forceinline__ const uint8_t* w_src(int i) const {
    return SWIGLU && (w_hi >> i & 1u) ? w_base2 : w_base;
  }
  __device__ __forceinline__ const uint8_t* ws_src(int i) const {
    return SWIGLU && (ws_hi >> i & 1u) ? ws_base2 : ws_base;
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
    const uint32_t k0_bytes = FP4 ? k0 / 2 : k0, kb0 = k0 / 32, xs0 = PAIRS ? kb0 / chunk_blocks : kb0;
#pragma unroll
    for (int i = 0; i < w_n; ++i) {
      const int c = tid + i * S::threads;
      if (W && (w_jobs % S::threads == 0 || c < w_jobs) && (!Tail || (FP4 ? c % w_pieces : c % w_pieces / 2) < kb_end))
        cp_async16(sw + (c / w_pieces) * L::w_stride + (c % w_pieces) * 16, w_src(i) + (w[i] + k0_bytes), true);
    }
#pragma unroll
    for (int i = 0; i < x_n; ++i) {
      const int c = tid + i * S::threads;
      if (X && (x_jobs % S::threads == 0 || c < x_jobs) && (!Tail || (c % x_pieces) / (2 * x_bytes_per) < kb_end)) {
        const int row = c / x_pieces, piece = PAIRS ? pair_piece(row, c % x_pieces) : c % x_pieces;
        cp_async16(sx + row * L::x_stride + piece * 16, x_base + (x_ok[i] ? x[i] + k0 * x_bytes_per : 0u), x_ok[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < xs_n; ++i) {
      const int c = tid + i * S::threads;
      if (X && (xs_jobs % S::threads == 0 || c < xs_jobs) && (!Tail || (c % xs_pieces) * 4 < kb_end)) {
        float* dst = sxs + (c / xs_pieces) * L::xs_stage + (c % xs_pieces) * xs_unit;
        const float* src = xs_base + (xs_ok[i] ? xs[i] + xs0 : 0u);
        if constexpr (PAIRS) cp_async4(dst, src, xs_ok[i]);
        else cp_async16(dst, src, xs_ok[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < ws_n; ++i) {
      const int c = tid + i * S::threads;
      if (W && (ws_jobs % S::threads == 0 || c < ws_jobs) && (!Tail || (c % ws_pieces) * 4 < kb_end))
        cp_async4(sws + (c / ws_pieces) * S::KB + (c % ws_pieces) * 4, ws_src(i) + (ws[i] + kb0), true);
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
/// sw * sx (an exact power of two) fused into the add; PAIRS: x's pairs carry sx, times sw.
template <class S, bool FP4, bool PAIRS = false>
__device__ __forceinline__ void stage_block(const uint8_t* st, int kb, int ww, int wt, int g, int tig,
                                            float (&part)[S::MT][S::NT][4]) {
  using L = stage_layout<S, FP4, PAIRS>;
  const uint8_t* sw = st;
  const uint8_t* sxq = st + L::w_bytes;
  const float* sxs = reinterpret_cast<const float*>(sxq + L::x_bytes);
  const uint8_t* sws = sxq + L::x_bytes + L::xs_bytes;
  uint32_t a[S::MT][4];
  float sw0[S::MT], sw1[S::MT];
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
  if constexpr (PAIRS) {
    uint4 h[S::NT];
#pragma unroll
    for (int j = 0; j < S::NT; ++j)
      h[j] = *reinterpret_cast<const uint4*>(sxq + (wt * S::NT * 8 + j * 8 + g) * L::x_stride +
                                             pair_piece(g, kb * 4 + tig) * 16);
#pragma unroll
    for (int i = 0; i < S::MT; ++i) {
      uint32_t al[4], ah[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) cuda::detail::e4m3x4_to_f16x2(a[i][q], al[q], ah[q]);
#pragma unroll
      for (int j = 0; j < S::NT; ++j) {  // mma_e4m3's two products on x's pairs
        float d[4];
        const uint32_t bl[2] = {h[j].x, h[j].y}, bh[2] = {h[j].z, h[j].w};
        mma_f16x16<false>(d, al, bl);
        mma_f16x16<true>(d, ah, bh);
        part[i][j][0] = fmaf(d[0], sw0[i], part[i][j][0]);
        part[i][j][1] = fmaf(d[1], sw0[i], part[i][j][1]);
        part[i][j][2] = fmaf(d[2], sw1[i], part[i][j][2]);
        part[i][j][3] = fmaf(d[3], sw1[i], part[i][j][3]);
      }
    }
  } else {
    uint32_t b[S::NT][2];
    float sx[S::NT][2];
#pragma unroll
    for (int j = 0; j < S::NT; ++j) {
      const int t = wt * S::NT * 8 + j * 8;
      const uint2 v = x_fragment<FP4>(*reinterpret_cast<const uint2*>(sxq + (t + g) * L::x_stride + kb * 32 + tig * 8));
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
}

/// f(slot, row, value at row, value at row + 8) for each of a thread's totals of its warp tile
/// (slot and row counted from the block's first).
template <class S, class F>
__device__ __forceinline__ void for_each_total(int ww, int wt, int g, int tig, const float (&total)[S::MT][S::NT][4],
                                               F&& f) {
#pragma unroll
  for (int i = 0; i < S::MT; ++i)
#pragma unroll
    for (int j = 0; j < S::NT; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        f(wt * S::NT * 8 + j * 8 + tig * 2 + c, ww * S::MT * 16 + i * 16 + g, total[i][j][c], total[i][j][2 + c]);
}

/// The block's outputs from a warp tile's totals.
template <class S>
__device__ __forceinline__ void store_tile(const gemm_problem& p, const group_view& gv, int n0, int slot0, int ww,
                                           int wt, int g, int tig, const float (&total)[S::MT][S::NT][4]) {
  for_each_total<S>(ww, wt, g, tig, total, [&](int s, int r, float lo, float hi) {
    if (slot0 + s >= gv.count) return;
    float* yr = gv.y + size_t(gv.first + slot0 + s) * p.n + n0 + r;
    yr[0] = lo;
    yr[8] = hi;
  });
}

/// SwiGLU in the tile: the block's totals of g (rows [0, BW/2), w1) and u (rows [BW/2, BW), w3)
/// of the same BW/2 = 32 outputs through shared memory, then a warp a slot: h = swiglu_f(g, u)
/// times the slot's routing weight, and its FP8 codes and scale, one group of h (the values
/// store_tile would write, through swiglu_codes_kernel's operations: the same bits).
template <class S>
__device__ __forceinline__ void swiglu_tile(const gemm_problem& p, const group_view& gv, int n0, int slot0, int ww,
                                            int wt, int g, int tig, const float (&total)[S::MT][S::NT][4],
                                            uint8_t* smem) {
  static_assert(S::BW == 64, "half a block's rows is one FP8 group of h");
  constexpr int stride = S::BW + 1;  // [BT][BW + 1] floats (the stages are read by then)
  float* tile = reinterpret_cast<float*>(smem);
  __syncthreads();
  for_each_total<S>(ww, wt, g, tig, total, [&](int s, int r, float lo, float hi) {
    tile[s * stride + r] = lo;
    tile[s * stride + r + 8] = hi;
  });
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int s = warp; s < S::BT && slot0 + s < gv.count; s += S::threads / 32) {  // uniform over the warp
    const int row = gv.first + slot0 + s;
    float h = cuda::detail::swiglu_f(tile[s * stride + lane], tile[s * stride + S::BW / 2 + lane], p.limit);
    if (p.route_w) h = p.route_w[p.slot_src[row]] * h;
    uint8_t code;
    const float sc = cuda::detail::fp8_group_code(h, code);
    p.hq[size_t(row) * p.n + n0 + lane] = code;
    if (lane == 0) p.hs[size_t(row) * (p.n / 32) + n0 / 32] = sc;
  }
}

/// grid (n / BW, ceil(max slots / BT), groups). PAIRS: x from p.xh / p.xf (fp4_x_pairs), each
/// chunk's sum times its factor in place of fp4_unscale. SWIGLU: grid (n / (BW / 2), ..., the
/// groups), swiglu_tile in place of store_tile.
template <class S, bool FP4, bool PAIRS = false, bool SWIGLU = false>
__global__ void __launch_bounds__(S::threads) tiled_kernel(gemm_problem p) {
  using L = stage_layout<S, FP4, PAIRS>;
  using loader_t = stage_loader<S, FP4, PAIRS, SWIGLU>;
  extern __shared__ __align__(16) uint8_t smem[];
  if (p.groups) cuda::detail::grid_dependency_wait();  // the group tables come from the kernel before
  const group_view gv = group_of<SWIGLU>(p);
  const int n0 = blockIdx.x * (SWIGLU ? S::BW / 2 : S::BW), slot0 = blockIdx.y * S::BT;
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
      stage_block<S, FP4, PAIRS>(st, kb, ww, wt, g, tig, part);
      if ((kb + 1) % chunk_blocks == 0) {  // a stage starts on a chunk boundary (KB % 4 == 0)
        if constexpr (PAIRS) {
          const float* fs = reinterpret_cast<const float*>(st + L::w_bytes + L::x_bytes) + kb / chunk_blocks;
#pragma unroll
          for (int j = 0; j < S::NT; ++j) {
            const int slot = wt * S::NT * 8 + j * 8 + tig * 2;
            const float f[2] = {fs[slot * L::xs_stage], fs[(slot + 1) * L::xs_stage]};
#pragma unroll
            for (int i = 0; i < S::MT; ++i)
#pragma unroll
              for (int e = 0; e < 4; ++e)
                total[i][j][e] = fmaf(part[i][j][e], f[e % 2], total[i][j][e]), part[i][j][e] = 0.0f;
          }
        } else {
#pragma unroll
          for (int i = 0; i < S::MT; ++i)
#pragma unroll
            for (int j = 0; j < S::NT; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e)
                total[i][j][e] = add_chunk<FP4>(total[i][j][e], part[i][j][e]), part[i][j][e] = 0.0f;
        }
      }
    }
  }
  cp_async_wait<0>();
  if constexpr (SWIGLU) swiglu_tile<S>(p, gv, n0, slot0, ww, wt, g, tig, total, smem);
  else store_tile<S>(p, gv, n0, slot0, ww, wt, g, tig, total);
}

/// The tiled kernel with K split over the warps: WK warps share each warp tile, warp wk taking
/// chunk WK kt + wk of stage kt (k % 128 == 0; the last stage may hold fewer chunks). Warp 0
/// keeps the total: at the top of stage kt + 1 it adds its own chunk of stage kt, then the
/// others' (left in shared memory, two stages of them), in ascending order, so the sums are
/// the tiled kernel's. For weights whose few row tiles leave each warp a long serial K stream.
/// grid (sum of n_i / BW, ceil(max slots / BT), groups): a set's members one after another.
template <class S, bool FP4, int N>
__global__ void __launch_bounds__(S::threads) split_kernel(const __grid_constant__ problem_set<N> set) {
  static_assert(S::WK > 1 && S::KB == S::WK * chunk_blocks, "one chunk per warp per stage");
  using L = stage_layout<S, FP4>;
  constexpr int tiles = S::WW * S::WT, vals = S::MT * S::NT * 4;
  extern __shared__ __align__(16) uint8_t smem[];
  float* exch = reinterpret_cast<float*>(smem + S::STAGES * L::bytes);  // [2][WK - 1][tiles][vals][32]
  using loader_t = stage_loader<S, FP4>;
  gemm_problem p = set.p[0];
  if (p.groups) cuda::detail::grid_dependency_wait();  // the group tables come from the kernel before
  const int bx = set_member(p, set);
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
        for (int e = 0; e < 4; ++e) total[i][j][e] = add_chunk<FP4>(total[i][j][e], own[i][j][e]);
#pragma unroll
    for (int w = 1; w < S::WK; ++w) {
      if (kt * S::WK + w >= chunks) break;
      const float* src = exch + ((size_t((kt & 1) * (S::WK - 1) + w - 1) * tiles + tw) * vals) * 32 + lane;
#pragma unroll
      for (int i = 0; i < S::MT; ++i)
#pragma unroll
        for (int j = 0; j < S::NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            total[i][j][e] = add_chunk<FP4>(total[i][j][e], src[((i * S::NT + j) * 4 + e) * 32]);
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

/// Kernel as a dependent launch with `smem` bytes of dynamic shared memory (its limit raised on
/// each device it runs on).
template <auto Kernel, class Arg>
void launch_with_smem(dim3 grid, int threads, int smem, const Arg& arg) {
  cuda::detail::allow_dynamic_smem(reinterpret_cast<const void*>(Kernel), smem);
  cuda::detail::launch_dependent(Kernel, grid, dim3(threads), smem, arg);
}

/// Blocks of `kernel` (threads, smem bytes of dynamic shared memory) the device holds at once.
template <class Kernel>
int blocks_at_once(Kernel kernel, int threads, int smem) {
  cuda::detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  int per_sm = 0;
  CEDAR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  return per_sm * cuda::detail::num_sms();
}

template <class S, bool FP4, bool PAIRS = false>
constexpr int tiled_smem = S::STAGES * stage_layout<S, FP4, PAIRS>::bytes;

/// PAIRS_OK: the shape also has a pairs form, taken where the call brings x's pairs (p.xh).
template <class S, bool FP4, bool PAIRS_OK = false>
void launch_tiled(const gemm_problem& p, int num_groups, int max_slots) {
  const dim3 grid(p.n / S::BW, (max_slots + S::BT - 1) / S::BT, num_groups);
  if constexpr (FP4 && PAIRS_OK)
    if (p.xh) return launch_with_smem<tiled_kernel<S, true, true>>(grid, S::threads, tiled_smem<S, true, true>, p);
  launch_with_smem<tiled_kernel<S, FP4>>(grid, S::threads, tiled_smem<S, FP4>, p);
}

/// The narrow tile: where its blocks all fit at once (the routed experts of one decode token:
/// 12 groups x 36 blocks), as 2 warps of 32 rows, each converting an x fragment once for two
/// row tiles (`cedar kernel-lab --op moe --tokens 1`, w1|w3 / w2: 38.30 / 19.80 -> 36.19 /
/// 19.10 us); else 4 warps of 16 rows, which keep more warps an SM when blocks wait for a second
/// wave (2 tokens: 59.18 against 62.10 us). Both sum in the one order, so the bits are the same.
template <bool FP4>
void launch_narrow(const gemm_problem& p, int num_groups, int max_slots) {
  using W = narrow_one_wave_shape;
  static_assert(W::BW == narrow_shape::BW && W::BT == narrow_shape::BT, "the same block of outputs");
  static const int at_once = blocks_at_once(tiled_kernel<W, FP4>, W::threads, tiled_smem<W, FP4>);
  static const int at_once_pairs =
      FP4 ? blocks_at_once(tiled_kernel<W, FP4, FP4>, W::threads, tiled_smem<W, FP4, FP4>) : at_once;
  const long long blocks = (long long)(p.n / W::BW) * ((max_slots + W::BT - 1) / W::BT) * num_groups;
  if (blocks <= (p.xh ? at_once_pairs : at_once)) launch_tiled<W, FP4, true>(p, num_groups, max_slots);
  else launch_tiled<narrow_shape, FP4, true>(p, num_groups, max_slots);
}

/// Shared memory of a split kernel: its stages and the partials' exchange.
template <class S, bool FP4>
constexpr int split_smem = S::STAGES * stage_layout<S, FP4>::bytes +
                           2 * (S::WK - 1) * S::WW * S::WT * S::MT * S::NT * 4 * 32 * int(sizeof(float));

template <class S, bool FP4, int N>
void launch_split_n(const gemm_problem* ps, int count, int num_groups, int max_slots) {
  constexpr int smem = split_smem<S, FP4>;
  int cols = 0;
  const problem_set<N> set = make_set<N>(ps, count, S::BW, cols);  // n % BW == 0 (require_shape)
  const dim3 grid(cols, (max_slots + S::BT - 1) / S::BT, num_groups);
  launch_with_smem<split_kernel<S, FP4, N>>(grid, S::threads, smem, set);
}

template <class S, bool FP4>
void launch_split(const gemm_problem* ps, int count, int num_groups, int max_slots) {
  if constexpr (!FP4)  // sets are dense FP8 calls (run() checks)
    if (count > 1) return launch_split_n<S, FP4, max_set>(ps, count, num_groups, max_slots);
  launch_split_n<S, FP4, 1>(ps, 1, num_groups, max_slots);
}

}  // namespace

template <bool FP4>
void launch_pipelined(tile_kind t, const gemm_problem* ps, int count, int z, int max_slots) {
  const gemm_problem& p = ps[0];
  switch (t) {
    case tile_kind::narrow: launch_narrow<FP4>(p, z, max_slots); break;
    case tile_kind::narrow16: launch_tiled<narrow16_shape, FP4, true>(p, z, max_slots); break;
    case tile_kind::narrow32: launch_tiled<narrow32_shape, FP4, true>(p, z, max_slots); break;
    case tile_kind::split4: launch_split<split4_shape, FP4>(ps, count, z, max_slots); break;
    case tile_kind::split8: launch_split<split8_shape, FP4>(ps, count, z, max_slots); break;
    case tile_kind::skinny: launch_tiled<skinny_shape, FP4>(p, z, max_slots); break;
    case tile_kind::wide: launch_tiled<wide_shape, FP4>(p, z, max_slots); break;
    case tile_kind::gemv:
    case tile_kind::stream:
      CEDAR_CUDA_REQUIRE(false, "launch_pipelined: the gemv and stream tiles are not pipelined");
      break;
  }
}

template void launch_pipelined<false>(tile_kind, const gemm_problem*, int, int, int);
template void launch_pipelined<true>(tile_kind, const gemm_problem*, int, int, int);

void launch_narrow_swiglu(const gemm_problem& p, int num_groups, int max_slots) {
  // launch_narrow's choice of form, on the same count of blocks (half the rows a block, one
  // launch for the pair)
  using W = narrow_one_wave_shape;
  static const int at_once = blocks_at_once(tiled_kernel<W, true, false, true>, W::threads, tiled_smem<W, true>);
  static const int at_once_pairs =
      blocks_at_once(tiled_kernel<W, true, true, true>, W::threads, tiled_smem<W, true, true>);
  const auto launch = [&](auto shape) {
    using S = decltype(shape);
    const dim3 grid(p.n / (S::BW / 2), (max_slots + S::BT - 1) / S::BT, num_groups);
    if (p.xh) launch_with_smem<tiled_kernel<S, true, true, true>>(grid, S::threads, tiled_smem<S, true, true>, p);
    else launch_with_smem<tiled_kernel<S, true, false, true>>(grid, S::threads, tiled_smem<S, true>, p);
  };
  const long long blocks = (long long)(p.n / (W::BW / 2)) * ((max_slots + W::BT - 1) / W::BT) * num_groups;
  if (blocks <= (p.xh ? at_once_pairs : at_once)) launch(W{});
  else launch(narrow_shape{});
}

}  // namespace cedar::cuda::fast::detail

namespace cedar::cuda::fast {

int set_blocks_at_once(tile_kind t) {
  const auto split = [](auto shape) {
    using S = decltype(shape);
    return detail::blocks_at_once(detail::split_kernel<S, false, detail::max_set>, S::threads,
                                  detail::split_smem<S, false>);
  };
  CEDAR_CUDA_REQUIRE(t == tile_kind::split4 || t == tile_kind::split8, "set_blocks_at_once: split4 or split8");
  // one kind of device a process (as num_sms)
  static const int four = split(detail::split4_shape{}), eight = split(detail::split8_shape{});
  return t == tile_kind::split4 ? four : eight;
}

}  // namespace cedar::cuda::fast
