// Tensor-core FP8 / W4A8 linear layers (fast_ops.hpp): activation quantization, a direct
// kernel for decode (m <= 16: warps read the weight straight into mma fragments, one 128-wide
// K chunk each, partials summed by a second pass), the dispatch over every tile, and the entry
// points. The pipelined tiles (narrow, split, skinny, wide) are in gemm_tiles.cu; dense and
// grouped (MoE) calls share them.
//
// One summation order for every tile, so a row's bits never depend on m: K is cut into chunks of
// 4 blocks of 32; a chunk's partial is 0 + sum of its blocks in ascending order (each block =
// one mma times sx * sw, an exact power of two, fused into the add); the result is 0 + the chunk
// partials in ascending order. FP4 weights enter the mma as their e4m3 codes times 2^-6 (a shift
// and a mask, mma.cuh), x in the same permuted K order, and each chunk partial is multiplied
// back by 2^6 as it is added (gemm.cuh: load_a, x_fragment, add_chunk).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fast/gemm.cuh"

namespace cedar::cuda::fast {
namespace detail {
namespace {

using cuda::detail::scratch;
using cuda::detail::stream;

// ---- activation quantization -----------------------------------------------------------------

/// One warp per group of 32, one lane per value: codes and the power-of-two scale, as
/// fmt::quantize_fp8 (the group max is exact in any order).
__global__ void quantize_kernel(const float* x, long long groups, uint8_t* codes, float* scales) {
  cuda::detail::dependent_start();  // the GEMM after it can start loading its weight
  const long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (g >= groups) return;  // g is uniform across the warp
  const float s = cuda::detail::fp8_group_code(x[g * 32 + lane], codes[g * 32 + lane]);
  if (lane == 0) scales[g] = s;
}

/// a * b on two f16 pairs, rounded to nearest (f16 subnormals kept).
__device__ __forceinline__ uint32_t mul_f16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

/// fp4_x_pairs (fast_ops.hpp), one thread a piece of 8 codes (a thread's K piece of a block): in
/// fp4_x_order, widened as mma_e4m3 widens them (its first product's two pairs, then its
/// second's), times 2^d, d = e_b - e_c + 7 <= 7 (so at most 448 * 2^7: no f16 overflow); the
/// chunk's first piece writes its factor 2^(e_c - 1) = fp4_unscale * 2^(e_c - 7). A chunk's
/// products and sums then carry 2^(7 - e_c) against the codes' path, which the factor takes back.
__global__ void x_pairs_kernel(const uint8_t* xq, const float* xs, long long pieces, uint4* pairs, float* factors) {
  cuda::detail::dependent_start();
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= pieces) return;
  const long long kb = i / 4;  // the K block, counted over the rows (k % 32 == 0)
  const uint2 v = fp4_x_order(reinterpret_cast<const uint2*>(xq)[i]);
  const float4 cs = reinterpret_cast<const float4*>(xs)[kb / chunk_blocks];
  const int e_c = int(__float_as_uint(fmaxf(fmaxf(cs.x, cs.y), fmaxf(cs.z, cs.w))) >> 23);
  const int d = int(__float_as_uint(xs[kb]) >> 23) - e_c + 7;
  const uint32_t h = d >= -14 ? uint32_t(d + 15) << 10 : d >= -24 ? 1u << (d + 24) : 0u;  // 2^d, f16
  const uint32_t f = h | h << 16;
  uint4 o;
  cuda::detail::e4m3x4_to_f16x2(v.x, o.x, o.z);
  cuda::detail::e4m3x4_to_f16x2(v.y, o.y, o.w);
  pairs[i] = make_uint4(mul_f16x2(o.x, f), mul_f16x2(o.y, f), mul_f16x2(o.z, f), mul_f16x2(o.w, f));
  if (i % (chunk_k / 8) == 0) factors[kb / chunk_blocks] = e_c > 1 ? __uint_as_float(uint32_t(e_c - 1) << 23) : 0.0f;
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
        v = x_fragment<FP4>(v);
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
        constexpr float unscale = FP4 ? fp4_unscale : 1.0f;  // load_a's FP4 codes; exact
        pc[size_t(s) * n + r0 + g] = acc[j][e] * unscale;
        pc[size_t(s) * n + r0 + g + 8] = acc[j][2 + e] * unscale;
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

/// The `count` problems of one x (count > 1: dense ones, the gemv or split tiles) or one grouped
/// problem (a pair when p.groups2 is set: 2 x num_groups blocks in z, the pipelined tiles).
template <bool FP4>
void run(const gemm_problem* ps, int count, int num_groups, int max_slots, tile_kind t) {
  const bool set_tile =
      t == tile_kind::gemv || t == tile_kind::split4 || t == tile_kind::split8 || t == tile_kind::stream;
  CEDAR_CUDA_REQUIRE(count == 1 || (!FP4 && set_tile && !ps[0].groups),
                     "fast gemm: a set of several weights is dense FP8 on the gemv, split or stream tiles");
  if (t == tile_kind::stream) {  // its own shape checks
    if (max_slots > 0) launch_stream<FP4>(ps, count, ps[0].groups2 ? 2 * num_groups : num_groups, max_slots);
    return;
  }
  for (int i = 0; i < count; ++i) require_shape(ps[i], t);
  if (max_slots <= 0) return;
  if (t != tile_kind::gemv)
    return launch_pipelined<FP4>(t, ps, count, ps[0].groups2 ? 2 * num_groups : num_groups, max_slots);
  if (max_slots <= 8) launch_direct<FP4, 1>(ps, count, num_groups, max_slots);
  else launch_direct<FP4, 2>(ps, count, num_groups, max_slots);
}

/// Random e4m3 codes (no NaN: 0x7F, 0xFF become 0x7E, 0xFE) through mma_e4m3 and the e4m3
/// instruction, one trial a warp; counts outputs whose bits differ after the instruction's own
/// "+ 0" (mma_form_mismatches).
__global__ void mma_form_kernel(uint64_t seed, unsigned* mismatches) {
  const int lane = threadIdx.x % 32;
  uint64_t z = cuda::detail::splitmix64(seed ^ (uint64_t(blockIdx.x * blockDim.x + threadIdx.x) << 32));
  const auto next = [&z] { return uint32_t(z = cuda::detail::splitmix64(z)); };
  const auto codes = [](uint32_t v) {
#pragma unroll
    for (int b = 0; b < 4; ++b)
      if (((v >> (8 * b)) & 0x7F) == 0x7F) v ^= 1u << (8 * b);
    return v;
  };
  // every few trials a sparse operand (mostly +-0 codes), so that zero and -0 sums occur
  const bool sparse = next() % 4 == 0;
  uint32_t a[4], b[2];
  for (auto& v : a) v = codes(next()) & (sparse ? 0x80808080u | (next() & 0x01010101u) : ~0u);
  for (auto& v : b) v = codes(next());
  float mine[4], ref[4];
  mma_e4m3(mine, a, b);
  mma_e4m3_instruction(ref, a, b);
  unsigned bad = 0;
  for (int i = 0; i < 4; ++i) bad += __float_as_uint(mine[i] + 0.0f) != __float_as_uint(ref[i]);
  for (int o = 16; o > 0; o >>= 1) bad += __shfl_xor_sync(0xffffffffu, bad, o);
  if (lane == 0 && bad) atomicAdd(mismatches, bad);
}

/// A grouped call's x pairs and factors (fp4_x_pairs), both or neither.
void take_pairs(gemm_problem& p, const uint16_t* pairs, const float* factors) {
  CEDAR_CUDA_REQUIRE((pairs == nullptr) == (factors == nullptr), "grouped_fp4: x's pairs and factors together");
  p.xh = reinterpret_cast<const uint8_t*>(pairs), p.xf = factors;
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
    case tile_kind::stream: return "stream";
  }
  return "?";
}

long long mma_form_mismatches(int warps, uint64_t seed) {
  cuda::detail::scratch<unsigned> bad(1);
  CEDAR_CUDA_CHECK(cudaMemsetAsync(bad.get(), 0, sizeof(unsigned), cuda::detail::stream()));
  detail::mma_form_kernel<<<(warps + 7) / 8, 256, 0, cuda::detail::stream()>>>(seed, bad.get());
  CEDAR_CUDA_LAUNCHED();
  unsigned host = 0;
  CEDAR_CUDA_CHECK(cudaMemcpyAsync(&host, bad.get(), sizeof host, cudaMemcpyDeviceToHost, cuda::detail::stream()));
  CEDAR_CUDA_CHECK(cudaStreamSynchronize(cuda::detail::stream()));
  return host;
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

void fp4_x_pairs(const uint8_t* xq, const float* xs, int rows, int k, uint16_t* pairs, float* factors) {
  CEDAR_CUDA_REQUIRE(k % detail::chunk_k == 0, "fp4_x_pairs: k % 128 == 0");
  const long long pieces = (long long)rows * (k / 8);
  if (pieces == 0) return;
  cuda::detail::launch_dependent(detail::x_pairs_kernel, dim3(cuda::detail::blocks_for(pieces, 256)), dim3(256), 0,
                                 xq, xs, pieces, reinterpret_cast<uint4*>(pairs), factors);
}

void grouped_fp4(const uint8_t* xq, const float* xs, const int32_t* slot_rows, const expert_group* groups,
                 int num_groups, int total_slots, int max_slots, int n, int k, float* y, tile_kind t,
                 const uint16_t* pairs, const float* factors) {
  CEDAR_CUDA_REQUIRE(slot_rows != nullptr, "grouped_fp4: slot_rows");
  detail::gemm_problem p{nullptr, nullptr, xq, xs, slot_rows, groups, y, total_slots, n, k};
  detail::take_pairs(p, pairs, factors);
  detail::run<true>(&p, 1, num_groups, max_slots, t);
}

void grouped_fp4_swiglu(const uint8_t* xq, const float* xs, const int32_t* slot_rows, const expert_group* groups_1,
                        const expert_group* groups_3, int num_groups, int total_slots, int max_slots, int n, int k,
                        tile_kind t, const int32_t* slot_src, const float* route_weights, float limit, uint8_t* hq,
                        float* hs, const uint16_t* pairs, const float* factors) {
  CEDAR_CUDA_REQUIRE(swiglu_in_tile(t), "grouped_fp4_swiglu: the narrow tile");
  CEDAR_CUDA_REQUIRE(slot_rows != nullptr && hq != nullptr && hs != nullptr &&
                         (route_weights == nullptr || slot_src != nullptr),
                     "grouped_fp4_swiglu: slot_rows, hq, hs (and slot_src with route weights)");
  detail::gemm_problem p{nullptr, nullptr, xq, xs, slot_rows, groups_1, nullptr, total_slots, n, k};
  p.groups2 = groups_3, p.hq = hq, p.hs = hs, p.slot_src = slot_src, p.route_w = route_weights, p.limit = limit;
  detail::take_pairs(p, pairs, factors);
  detail::require_shape(p, t);
  if (max_slots > 0) detail::launch_narrow_swiglu(p, num_groups, max_slots);
}

void grouped_fp4_pair(const uint8_t* xq, const float* xs, const int32_t* slot_rows, const expert_group* groups_a,
                      const expert_group* groups_b, int num_groups, int total_slots, int max_slots, int n, int k,
                      float* y_a, float* y_b, tile_kind t, const uint16_t* pairs, const float* factors) {
  if (t == tile_kind::gemv) {  // the direct kernel's partial buffers hold one grouped product
    grouped_fp4(xq, xs, slot_rows, groups_a, num_groups, total_slots, max_slots, n, k, y_a, t);
    grouped_fp4(xq, xs, slot_rows, groups_b, num_groups, total_slots, max_slots, n, k, y_b, t);
    return;
  }
  CEDAR_CUDA_REQUIRE(slot_rows != nullptr, "grouped_fp4_pair: slot_rows");
  detail::gemm_problem p{nullptr, nullptr, xq, xs, slot_rows, groups_a, y_a, total_slots, n, k};
  p.groups2 = groups_b, p.y2 = y_b, p.split = num_groups;
  detail::take_pairs(p, pairs, factors);
  detail::run<true>(&p, 1, num_groups, max_slots, t);
}

}  // namespace cedar::cuda::fast
