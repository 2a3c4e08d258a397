// Shared parts of the FP8 / W4A8 GEMMs (gemm.cu, gemm_tiles.cu): the summation chunk, where a
// call's operands are, and the weight fragments. See gemm.cu for the one summation order every
// tile keeps.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/mma.cuh"

namespace cedar::cuda::fast::detail {

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
  // FP4: x's pairs and chunk factors (fp4_x_pairs), or null; the narrow tiles read them in
  // place of xq / xs, the other tiles ignore them
  const uint8_t* xh = nullptr;
  const float* xf = nullptr;
  // SwiGLU in the tile (grouped_fp4_swiglu; a pair, gridDim.z = the groups): a block takes
  // half-block rows [x BW/2, x BW/2 + BW/2) of groups' weight (w1: g) and the same of groups2's
  // (w3: u), and writes no y: h = swiglu_f(g, u, limit) times route_w[slot_src[row]] (when
  // given) as FP8 codes hq [slots, n] and scales hs [slots, n / 32], swiglu_codes_kernel's bits
  uint8_t* hq = nullptr;
  float* hs = nullptr;
  const int32_t* slot_src = nullptr;
  const float* route_w = nullptr;
  float limit = 0;
};

/// The group of blockIdx.z: weight pointers, first slot, slot count and output.
struct group_view {
  const uint8_t* w;
  const uint8_t* ws;
  int first, count;
  float* y;
  const uint8_t* w2 = nullptr;  ///< SwiGLU in the tile: the second weight (w3) and its scales
  const uint8_t* ws2 = nullptr;
};

template <bool SWIGLU = false>
__device__ __forceinline__ group_view group_of(const gemm_problem& p) {
  if constexpr (SWIGLU) {  // the group's w1 and w3 in every block (one slot table)
    const expert_group &g = p.groups[blockIdx.z], &g3 = p.groups2[blockIdx.z];
    return {g.w, g.scale, g.first_slot, g.num_slots, nullptr, g3.w, g3.scale};
  }
  if (!p.groups) return {p.w, p.ws, 0, p.m, p.y};
  const bool second = p.groups2 != nullptr && int(blockIdx.z) >= p.split;
  const expert_group& g = second ? p.groups2[blockIdx.z - p.split] : p.groups[blockIdx.z];
  return {g.w, g.scale, g.first_slot, g.num_slots, second ? p.y2 : p.y};
}

__device__ __forceinline__ int x_row(const gemm_problem& p, int slot) { return p.rows ? p.rows[slot] : slot; }

/// One grouped problem, or up to N dense ones of one x (xq, xs, m, k), in one launch: member i
/// takes block columns [end[i - 1], end[i]) (the split and stream tiles).
template <int N>
struct problem_set {
  gemm_problem p[N];
  int end[N];  ///< block columns, cumulative
  int count;
};

/// The set of ps[0 .. count) with ceil(n / rows_per_block) block columns each; cols: their sum.
template <int N>
problem_set<N> make_set(const gemm_problem* ps, int count, int rows_per_block, int& cols) {
  problem_set<N> set{};
  set.count = count;
  cols = 0;
  for (int i = 0; i < count; ++i) {
    set.p[i] = ps[i];
    cols += (ps[i].n + rows_per_block - 1) / rows_per_block;
    set.end[i] = cols;
  }
  return set;
}

/// p (member 0's on entry) takes the weight, scales, output and n of blockIdx.x's member of
/// `set`; returns the block column within it. Selects over constant indices, so the launch
/// parameters are never indexed at run time (which would copy them to local memory).
template <int N>
__device__ __forceinline__ int set_member(gemm_problem& p, const problem_set<N>& set) {
  int bx = int(blockIdx.x);
  if constexpr (N > 1) {
#pragma unroll
    for (int i = 1; i < N; ++i)
      if (i < set.count && int(blockIdx.x) >= set.end[i - 1])
        p.w = set.p[i].w, p.ws = set.p[i].ws, p.y = set.p[i].y, p.n = set.p[i].n,
        bx = int(blockIdx.x) - set.end[i - 1];
  }
  return bx;
}

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
/// `stride` bytes per row. FP4: e2m1x8_to_e4m3_scaled's codes (times 2^-6, in its order), so x
/// goes in through x_fragment and each chunk's sums come back through add_chunk.
template <bool FP4, bool Global>
__device__ __forceinline__ void load_a(const uint8_t* w, size_t stride, int r, int kb, int tig,
                                       uint32_t a[4]) {
  if constexpr (FP4) {
    const uint32_t p0 = load_w<Global>(reinterpret_cast<const uint32_t*>(w + r * stride + kb * 16 + tig * 4));
    const uint32_t p1 = load_w<Global>(reinterpret_cast<const uint32_t*>(w + (r + 8) * stride + kb * 16 + tig * 4));
    const uint2 v0 = e2m1x8_to_e4m3_scaled(p0), v1 = e2m1x8_to_e4m3_scaled(p1);
    a[0] = v0.x, a[1] = v1.x, a[2] = v0.y, a[3] = v1.y;
  } else {
    const uint2 v0 = load_w<Global>(reinterpret_cast<const uint2*>(w + r * stride + kb * 32 + tig * 8));
    const uint2 v1 = load_w<Global>(reinterpret_cast<const uint2*>(w + (r + 8) * stride + kb * 32 + tig * 8));
    a[0] = v0.x, a[1] = v1.x, a[2] = v0.y, a[3] = v1.y;
  }
}

/// The x fragment of a thread's K piece v (8 codes) in load_a's order for this weight kind.
template <bool FP4>
__device__ __forceinline__ uint2 x_fragment(uint2 v) {
  if constexpr (FP4) return fp4_x_order(v);
  else return v;
}

/// total + part, a summation chunk into a tile's total. FP4 parts come from load_a's scaled
/// codes: times fp4_unscale, a power of two, inside the same rounding (the bits of the unscaled
/// sums but where a part is below 2^-120).
template <bool FP4>
__device__ __forceinline__ float add_chunk(float total, float part) {
  if constexpr (FP4) return fmaf(part, fp4_unscale, total);
  else return total + part;
}

/// Dense problems of one x (same xq, m and k) one launch takes at most (gemm_fp8_set).
constexpr int max_set = 4;

/// The pipelined tiles (every tile_kind but gemv; gemm_tiles.cu) for `count` problems of one x
/// (count > 1: dense FP8 on split4 / split8) or one grouped problem over `z` groups (2 x groups
/// for a pair), max_slots slots at most per group. Shapes are checked by the caller.
template <bool FP4>
void launch_pipelined(tile_kind t, const gemm_problem* ps, int count, int z, int max_slots);

/// The narrow tile with SwiGLU in the tile (p.hq set, p.groups2 w3's groups; `z` groups).
void launch_narrow_swiglu(const gemm_problem& p, int z, int max_slots);

/// The stream tile (gemm_stream.cu) for `count` dense FP8 problems of one x or one grouped
/// problem (a pair: groups2) over `z` groups, at most stream_max_slots slots a group.
template <bool FP4>
void launch_stream(const gemm_problem* ps, int count, int z, int max_slots);

}  // namespace cedar::cuda::fast::detail
