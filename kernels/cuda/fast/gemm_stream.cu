// The stream tile (tile_kind::stream) of the FP8 / W4A8 GEMMs: a weight stream for up to 8 slots
// (decode) built to issue fewer instructions a byte than the tiles of gemm_tiles.cu, which spend
// most of theirs on what does not scale with the slots (a scale multiply per K block and weight
// row, seven of eight unused slots at one token).
//
// A warp owns 8 weight rows over all of K and reads each lane's 16 bytes a chunk straight from
// HBM into registers (four chunks in flight, a ring of five). The mma (m16n8k16, f16 in, fp32
// accumulate) takes the weight as B (8 rows) and a "block-diagonal" A: row r of A holds one
// slot's x only in the k positions of the lane that carries K block r % 4 (FP4; r % 2, FP8),
// zeros elsewhere, so that one mma chain gives every (slot, K block, weight row) its own dot
// product, scaled once per chunk instead of once per mma:
//  - FP4: a lane's 16 bytes are one whole K block (32 E2M1 codes), lane t of a quad carrying
//    block 4c + t of chunk c (128 of K); A rows g (and g + 8): slot g / 4 (+ 2), block g % 4;
//  - FP8: a lane's 16 bytes are half a block, lanes 2b and 2b + 1 carrying block 2c + b of chunk
//    c (64 of K); A rows g (and g + 8): slot g / 2 (+ 4), block g % 2.
// Codes become f16 exactly: E2M1 by shifts and masks (times 2^-14, undone in the x scale), e4m3
// by cvt, x in shared memory through the same cvt pairs (FP8) or in the E2M1 pairs' order (FP4),
// as register images of the mma's A operand (zeros included), so a lane loads its A with no
// moves. Summation order (fixed, the same for every m up to 8: batch-invariant): a block's dot is
// two chains of mmas (even and odd words, fp32) added; each lane adds its blocks' dots times
// sw * sx in ascending chunks; the lanes of a row then add their totals ((b0 + b1) + (b2 + b3)
// for FP4, b0 + b1 for FP8). Not the other tiles' bits: the same products summed in another
// order, within the same bound of the CPU op.
//
// Measured (docs/BENCHMARKS.md): a third fewer instructions than the narrow tile on the routed
// experts at one token but no faster there (both ~1.9 TB/s, both slower in step with the SM
// clock); faster on a weight of many short rows (wq_b), where the model uses it
// (tuning::stream_min_out).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fast/gemm.cuh"

namespace cedar::cuda::fast::detail {
namespace {

constexpr int stream_warps = 8;                    ///< a block: 8 warps of 8 weight rows
constexpr int stream_rows = stream_warps * 8;      ///< weight rows a block
constexpr int stream_ahead = 4;                    ///< chunks in flight a lane
template <bool FP4>
constexpr int stream_chunk_k = FP4 ? 128 : 64;     ///< K a chunk (16 bytes a lane)
template <bool FP4>
constexpr int stream_lane_blocks = FP4 ? 4 : 2;    ///< K blocks a chunk (A rows a slot)
/// A staged x row ("image", 16-byte units): a lane's 16 weight bytes of a chunk take LU units
/// of it (two per 8 codes: FP4 8, FP8 4), one unit of padding after each lane's (so that the
/// lanes reading one image in a phase of a 16-byte shared load hit distinct bank groups), the
/// whole padded to 8 units (every image in the same bank phase).
template <bool FP4>
constexpr int stream_lane_units = FP4 ? 8 : 4;
template <bool FP4>
constexpr int stream_chunk_units = 4 * (stream_lane_units<FP4> + 1);
template <bool FP4>
__host__ __device__ constexpr int stream_image_units(int k) {
  return (k / stream_chunk_k<FP4> * stream_chunk_units<FP4> + 7) / 8 * 8;
}
/// The first unit of the 8 x codes `word` (codes 8 word .. 8 word + 7) in an image.
template <bool FP4>
__device__ __forceinline__ int stream_unit(int word) {
  // FP4: chunk word / 16, lane (word / 4) % 4 (its K block), two units a word of the block;
  // FP8: chunk word / 8, lane (word / 2) % 4 (half a block), two units a word
  constexpr int per_chunk = FP4 ? 16 : 8, per_lane = FP4 ? 4 : 2;
  return word / per_chunk * stream_chunk_units<FP4> + word % per_chunk / per_lane * (stream_lane_units<FP4> + 1) +
         2 * (word % per_lane);
}

/// D += A B, m16n8k16, f16 in, fp32 accumulate.
__device__ __forceinline__ void mma_f16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/// 8 e4m3 codes (two words) as four f16 pairs: .x / .y for one mma's b0 / b1 (or a0 / a2),
/// .z / .w for the next.
__device__ __forceinline__ uint4 f16_pairs(uint2 e4m3) {
  const auto pair = [](uint32_t two) {
    const __half2_raw h = cuda::detail::e4m3x2_to_f16x2(two);
    return uint32_t(h.x) | uint32_t(h.y) << 16;
  };
  return make_uint4(pair(e4m3.x), pair(e4m3.x >> 16), pair(e4m3.y), pair(e4m3.y >> 16));
}

/// 8 E2M1 codes (nibble i = element i) as f16 pairs {element i, element i + 4}, i = 0 .. 3, each
/// value times 2^-14 (the magnitude's three bits at f16 bits 9..11, 0.5 the subnormal 2^-15; the
/// sign at bit 15): shifts and masks on the integer pipe, no conversion instruction. Exact.
__device__ __forceinline__ uint4 e2m1x8_to_f16_scaled(uint32_t w) {
  constexpr uint32_t mag = 0x0E000E00u, sign = 0x80008000u;
  return make_uint4(((w << 9) & mag) | ((w << 12) & sign), ((w << 5) & mag) | ((w << 8) & sign),
                    ((w << 1) & mag) | ((w << 4) & sign), ((w >> 3) & mag) | (w & sign));
}

/// What sums of e2m1x8_to_f16_scaled's values are multiplied by to undo its 2^-14.
constexpr float fp4_f16_unscale = 16384.0f;

/// 8 x codes (e4m3, byte i = element i) as f16 pairs in e2m1x8_to_f16_scaled's order.
__device__ __forceinline__ uint4 x_f16_pairs_fp4(uint2 v) {
  uint32_t h[8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
    h[i] = cuda::detail::e4m3x2_to_f16x2(((i < 4 ? v.x : v.y) >> (8 * (i % 4))) & 0xFF).x;
  return make_uint4(h[0] | h[4] << 16, h[1] | h[5] << 16, h[2] | h[6] << 16, h[3] | h[7] << 16);
}

/// grid (sum of ceil(n_i / 64), 1, groups): warp w of block column bx computes rows 64 bx + 8 w
/// for every slot of its group (max_tokens at most). HALVES: A rows g only (1) or g and g + 8
/// (2); PASSES: mma chains over the same weight fragments (more slots). The set: up to max_set
/// dense FP8 problems of one x, or one grouped problem (a pair: groups2); images: the A images
/// in shared memory (those of a slot T0 < max_slots).
template <bool FP4, int HALVES, int PASSES, int N>
__global__ void __launch_bounds__(stream_warps * 32)
    stream_kernel(const __grid_constant__ problem_set<N> set, int images) {
  constexpr int LB = stream_lane_blocks<FP4>, CK = stream_chunk_k<FP4>;
  constexpr int per_half = 8 / LB, per_pass = per_half * HALVES, max_tokens = per_pass * PASSES;
  constexpr int ring = stream_ahead + 1;     // chunk buffers: the one in use and those in flight
  constexpr int LU = stream_lane_units<FP4>, UC = stream_chunk_units<FP4>;
  extern __shared__ __align__(16) uint8_t smem[];
  gemm_problem p = set.p[0];
  const int bx = set_member(p, set);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = bx * stream_rows + warp * 8;
  const int k = p.k, chunks = k / CK, kb_count = k / 32;
  const uint32_t w_stride = FP4 ? k / 2 : k;
  const int image_units = stream_image_units<FP4>(k);

  // the weight's first chunks: a dense call knows its weight before the kernel before it ends.
  // Lane (g, t) reads row r0 + g at byte 64 c + 16 t of chunk c; FP4: the scale bytes of rows
  // r0 + 2t, r0 + 2t + 1 at block g % 4 of the chunk, FP8: the 32-row group's at block g % 2
  // (the blocks of the lane's D rows)
  uint4 wbuf[ring];
  uint32_t s0buf[ring], s1buf[ring];
  const bool row_ok = r0 < p.n;
  const uint8_t *wrow = nullptr, *srow = nullptr;
  const auto aim = [&](const uint8_t* w, const uint8_t* ws) {
    wrow = w + size_t(r0 + g) * w_stride + t * 16;
    srow = ws + (FP4 ? size_t(r0 + 2 * t) : size_t(r0 / 32)) * kb_count + g % LB;
  };
  const auto load = [&](int c, int slot) {  // every load unconditional: no copies kept alive
#pragma unroll
    for (int i = 0; i < ring; ++i)
      if (i == slot) {
        wbuf[i] = __ldg(reinterpret_cast<const uint4*>(wrow + size_t(c) * 64));
        s0buf[i] = __ldg(srow + c * LB);
        if constexpr (FP4) s1buf[i] = __ldg(srow + kb_count + c * LB);
      }
  };
  const auto prefetch = [&] {
    if (!row_ok) return;
#pragma unroll
    for (int u = 0; u < stream_ahead; ++u) load(min(u, chunks - 1), u);
  };
  if (!p.groups) aim(p.w, p.ws), prefetch();
  cuda::detail::grid_dependency_wait();  // x (and a grouped call's tables) come from kernels before
  const group_view gv = group_of(p);
  if (p.groups) {
    if (gv.count == 0) return;  // block-uniform
    aim(gv.w, gv.ws), prefetch();
  }
  const int count = min(gv.count, max_tokens);  // the launch picked a variant of max_tokens >= max_slots
  // the images (those of a slot T0 < count staged), then a zero image 4 units further
  // on (a lane without x reads there in step with the others: another 16-byte bank group than
  // the phase's readers of an image), then the scales of max_tokens + 1 slots (the last: zeros)
  uint4* img = reinterpret_cast<uint4*>(smem);
  uint4* zero_image = img + images * image_units + 4;
  float* sxs = reinterpret_cast<float*>(zero_image + image_units + 4);

  // Image of (T0, T1) for one mma: {x(T0) pair, x(T1) pair, x(T0) pair, x(T1) pair} as the
  // mma's a0..a3, zeros for T1 with HALVES = 1 or a slot past count; two units a word of 8
  // codes (FP4 in e2m1x8_to_f16_scaled's pair order, FP8 in cvt's). Scales times 2^14 for FP4
  // (undoing the weight values' 2^-14; exact).
  const auto slot_word = [&](int s, int word) -> uint4 {  // f16 pairs of 8 codes of slot s
    if (s >= count) return make_uint4(0, 0, 0, 0);
    const uint8_t* src = p.xq + size_t(x_row(p, gv.first + s)) * k + size_t(word) * 8;
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(src));
    if constexpr (FP4) return x_f16_pairs_fp4(v);
    else return f16_pairs(v);
  };
  for (int i = threadIdx.x; i < images * (k / 8); i += blockDim.x) {
    const int im = i / (k / 8), word = i % (k / 8);
    const int q = im / per_half, gi = im % per_half;
    const int s0 = q * per_pass + gi, s1 = HALVES > 1 ? s0 + per_half : max_tokens;
    if (s0 >= count) continue;
    const uint4 x0 = slot_word(s0, word), x1 = slot_word(s1, word);
    uint4* dst = img + size_t(im) * image_units + stream_unit<FP4>(word);
    dst[0] = make_uint4(x0.x, x1.x, x0.y, x1.y);
    dst[1] = make_uint4(x0.z, x1.z, x0.w, x1.w);
  }
  for (int i = threadIdx.x; i < image_units; i += blockDim.x) zero_image[i] = make_uint4(0, 0, 0, 0);
  for (int i = threadIdx.x; i < (max_tokens + 1) * kb_count; i += blockDim.x) {
    const int s = i / kb_count, kb = i % kb_count;
    const float unscale = FP4 ? fp4_f16_unscale : 1.0f;
    sxs[i] = s < count ? p.xs[size_t(x_row(p, gv.first + s)) * kb_count + kb] * unscale : 0.0f;
  }
  __syncthreads();
  cuda::detail::launch_dependents();
  if (!row_ok) return;

  // D row g (+ 8) of pass q: slot q * per_pass + h * per_half + g / LB, K block g % LB of each
  // chunk. The lane reads its A from the image of pass q and g / LB where it carries the row's
  // block (diag; FP4 lane t: block 4c + t, FP8 lanes 2b, 2b + 1: block 2c + b), else the zero
  // image; scales: the slot's (zero past count), for every lane of the row.
  const bool diag = FP4 ? g % 4 == t : g % 2 == t / 2;
  const uint4* a_src[PASSES];
  const float* x_scale[PASSES][HALVES];
#pragma unroll
  for (int q = 0; q < PASSES; ++q) {
    const bool carries = diag && q * per_pass + g / LB < count;
    a_src[q] = carries ? img + size_t(q * per_half + g / LB) * image_units + t * (LU + 1) : zero_image;
#pragma unroll
    for (int h = 0; h < HALVES; ++h) {
      const int tok = q * per_pass + h * per_half + g / LB;
      x_scale[q][h] = sxs + min(tok, max_tokens) * kb_count + g % LB;
    }
  }
  float acc[PASSES][HALVES][2] = {};
  for (int c0 = 0; c0 < chunks; c0 += ring) {
#pragma unroll
    for (int u = 0; u < ring; ++u) {
      const int c = c0 + u;
      if (c >= chunks) break;
      load(min(c + stream_ahead, chunks - 1), (u + stream_ahead) % ring);
      const uint4 wv = wbuf[u];
      // every operand of the chunk first (the weight's words as B pairs, the A units), then two
      // independent mma chains (even and odd words), added once: a warp waits on fewer
      // dependencies in a row
      constexpr int NW = FP4 ? 4 : 2;  // words (8 codes) a lane carries a chunk
      uint4 b[NW];                     // B pairs for two mmas a word: .x / .y, then .z / .w
#pragma unroll
      for (int j = 0; j < NW; ++j) {
        if constexpr (FP4) b[j] = e2m1x8_to_f16_scaled(j == 0 ? wv.x : j == 1 ? wv.y : j == 2 ? wv.z : wv.w);
        else b[j] = f16_pairs(j == 0 ? make_uint2(wv.x, wv.y) : make_uint2(wv.z, wv.w));
      }
      uint4 a[PASSES][2 * NW];
#pragma unroll
      for (int q = 0; q < PASSES; ++q)
#pragma unroll
        for (int i = 0; i < 2 * NW; ++i) a[q][i] = a_src[q][c * UC + i];
      float d[PASSES][4] = {}, d_odd[PASSES][4] = {};
#pragma unroll
      for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int q = 0; q < PASSES; ++q) {
          float* dc = j % 2 ? d_odd[q] : d[q];
          mma_f16(dc, a[q][2 * j].x, a[q][2 * j].y, a[q][2 * j].z, a[q][2 * j].w, b[j].x, b[j].y);
          mma_f16(dc, a[q][2 * j + 1].x, a[q][2 * j + 1].y, a[q][2 * j + 1].z, a[q][2 * j + 1].w, b[j].z, b[j].w);
        }
#pragma unroll
      for (int q = 0; q < PASSES; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) d[q][e] += d_odd[q][e];
      // d[q]: (row g, cols 2t, 2t + 1), (row g + 8, same cols): scaled by sw * sx of the block
      const float sw0 = ue8m0_value(s0buf[u]), sw1 = FP4 ? ue8m0_value(s1buf[u]) : sw0;
#pragma unroll
      for (int q = 0; q < PASSES; ++q)
#pragma unroll
        for (int h = 0; h < HALVES; ++h) {
          const float sx = x_scale[q][h][c * LB];
          acc[q][h][0] = fmaf(d[q][2 * h], sw0 * sx, acc[q][h][0]);
          acc[q][h][1] = fmaf(d[q][2 * h + 1], sw1 * sx, acc[q][h][1]);
        }
    }
  }
  // the lanes of one row and slot (lane bits 2..3: the block) add their totals
#pragma unroll
  for (int q = 0; q < PASSES; ++q)
#pragma unroll
    for (int h = 0; h < HALVES; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = acc[q][h][e];
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        if constexpr (FP4) v += __shfl_xor_sync(0xffffffffu, v, 8);
        acc[q][h][e] = v;
      }
  if (g % LB != 0) return;
#pragma unroll
  for (int q = 0; q < PASSES; ++q)
#pragma unroll
    for (int h = 0; h < HALVES; ++h) {
      const int tok = q * per_pass + h * per_half + g / LB;
      if (tok >= count) continue;
      float* yr = gv.y + size_t(gv.first + tok) * p.n + r0 + 2 * t;
      yr[0] = acc[q][h][0];
      yr[1] = acc[q][h][1];
    }
}

template <bool FP4, int HALVES, int PASSES, int N>
void launch_stream_n(const gemm_problem* ps, int count, int z, int max_slots) {
  constexpr int max_tokens = 8 / stream_lane_blocks<FP4> * HALVES * PASSES;
  const int k = ps[0].k;
  constexpr int per_half = 8 / stream_lane_blocks<FP4>, per_pass = per_half * HALVES;
  int images = 0;  // the images of a slot T0 < max_slots: a prefix
  for (int im = 0; im < PASSES * per_half; ++im) images += im / per_half * per_pass + im % per_half < max_slots;
  const int smem = (images + 1) * stream_image_units<FP4>(k) * 16 + 8 * 16 + (max_tokens + 1) * (k / 32) * 4;
  int cols = 0;
  const problem_set<N> set = make_set<N>(ps, count, stream_rows, cols);
  const auto kernel = stream_kernel<FP4, HALVES, PASSES, N>;
  cuda::detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  cuda::detail::launch_dependent(kernel, dim3(cols, 1, z), dim3(stream_warps * 32), smem, set, images);
}

template <bool FP4, int HALVES, int PASSES>
void launch_stream_shape(const gemm_problem* ps, int count, int z, int max_slots) {
  if constexpr (!FP4)
    if (count > 1) return launch_stream_n<FP4, HALVES, PASSES, max_set>(ps, count, z, max_slots);
  launch_stream_n<FP4, HALVES, PASSES, 1>(ps, 1, z, max_slots);
}

}  // namespace

template <bool FP4>
void launch_stream(const gemm_problem* ps, int count, int z, int max_slots) {
  CEDAR_CUDA_REQUIRE(max_slots <= stream_max_slots, "fast gemm (stream): at most 8 slots a group");
  for (int i = 0; i < count; ++i)
    CEDAR_CUDA_REQUIRE(ps[i].k % stream_chunk_k<FP4> == 0 && ps[i].n % 8 == 0,
                       FP4 ? "fast gemm (stream): k % 128 == 0 and n % 8 == 0"
                           : "fast gemm (stream): k % 64 == 0 and n % 8 == 0");
  // slots per mma chain: FP4 2 (rows g) or 4 (g and g + 8); FP8 4 or 8
  if constexpr (FP4) {
    if (max_slots <= 2) launch_stream_shape<true, 1, 1>(ps, count, z, max_slots);
    else if (max_slots <= 4) launch_stream_shape<true, 2, 1>(ps, count, z, max_slots);
    else launch_stream_shape<true, 2, 2>(ps, count, z, max_slots);
  } else {
    if (max_slots <= 4) launch_stream_shape<false, 1, 1>(ps, count, z, max_slots);
    else launch_stream_shape<false, 2, 1>(ps, count, z, max_slots);
  }
}

template void launch_stream<false>(const gemm_problem*, int, int, int);
template void launch_stream<true>(const gemm_problem*, int, int, int);

}  // namespace cedar::cuda::fast::detail
