// The stream tile (tile_kind::stream) of the FP8 / W4A8 GEMMs: a weight stream for up to 8 slots
// (decode) built to issue fewer instructions and shared-memory wavefronts a weight byte than the
// tiles of gemm_tiles.cu, which spend most of theirs on what does not scale with the slots (a
// scale multiply per K block and weight row, seven of eight unused slots at one token).
//
// A warp owns 16 weight rows (g and g + 8 of lane (g, t)) over all of K and reads, a step,
// each lane's 32 bytes of both straight from HBM into registers (a row's 128 bytes a warp: whole
// lines, which HBM serves faster than half lines; up to three steps in flight: stream_ahead).
// The mma (m16n8k16, f16 in, fp32 accumulate) takes the weight as A (16 rows) and x as B whose 8
// columns are 2 slots x 4 K blocks: column n holds slot n / 4's x only in the k positions of lane
// n % 4 (the lane carrying that block), zeros elsewhere, so that one mma chain gives every
// (weight row, slot, K block) its own dot product, scaled once per block:
//  - FP4: a lane's 32 bytes of a row are two K blocks (2 x 32 E2M1 codes): in chunk h of step s
//    (its 16 bytes h) lane t carries block 8s + 2t + h, so a chunk holds 4 blocks;
//  - FP8: a lane's 32 bytes are one block, 4s + t, its halves in the step's two chunks.
// More slots: more column passes over the same A registers. Codes become f16 exactly: E2M1 by
// shifts and masks (times 2^-14, undone in the x scale), e4m3 by cvt; x is staged in shared
// memory once a block as f16 pairs in the weights' pair order, one 16-byte unit a lane and word
// (8 codes); a lane whose column does not meet its block reads one zero unit (a broadcast), so a
// load costs the wavefronts of the lanes that carry x. Summation order (fixed, the same for
// every m up to 8: batch-invariant): a block's dot is two chains of mmas (even and odd words,
// fp32; FP8: over both chunks of its step) added; each lane adds its two columns' dots times
// sw * sx in ascending K; at the end a slot's four column sums are added, (c0 + c1) + (c2 + c3)
// over the lane pair. Not the other tiles' bits: the same products summed in another
// order, within the same bound of the CPU op.
//
// Measured (docs/BENCHMARKS.md, "The stream tile rebuilt"): at one slot 11.5 us on wq_b (86 % of
// the copy rate) and 31.3 / 17.1 us on the routed experts' up / down at one token (narrow: 16.3,
// 39.3 / 20.2); slower than narrow at 5 to 8 slots. The model gives it the weights of many short
// rows (tuning::stream_min_out); the experts stay on narrow (a token's bits at every batch).
#include <algorithm>
#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fast/gemm.cuh"

namespace cedar::cuda::fast::detail {
namespace {

constexpr int stream_warps = 4;                    ///< a block: 4 warps of 16 weight rows
constexpr int stream_rows = stream_warps * 16;     ///< weight rows a block
constexpr int stream_pass_slots = 2;               ///< slots a column pass (8 columns / 4 blocks)
/// Steps in flight a lane: as many as the registers of a variant allow at 4 blocks an SM (a
/// stream at few slots is bound by the bytes in flight: its grid has few warps an SM)
template <int PASSES>
constexpr int stream_ahead = PASSES == 1 ? 3 : PASSES == 2 ? 2 : 1;
template <bool FP4>
constexpr int stream_chunk_k = FP4 ? 128 : 64;     ///< K a chunk (16 bytes a lane and row)
template <bool FP4>
constexpr int stream_step_k = 2 * stream_chunk_k<FP4>;  ///< K a step (32 bytes a lane and row)
template <bool FP4>
constexpr int stream_words = FP4 ? 4 : 2;          ///< words of 8 codes a lane and row a chunk
/// A staged x row ("image", 16-byte units): chunk c, lane t, word i at unit c UC + t (NW + 1)
/// + i (one unit of padding after each lane's, so that the lanes of a 16-byte load's phase hit
/// distinct bank groups), UC a multiple of 8 (every chunk in the same bank phase).
template <bool FP4>
constexpr int stream_chunk_units = (4 * (stream_words<FP4> + 1) + 7) / 8 * 8;
template <bool FP4>
__host__ __device__ constexpr int stream_image_units(int k) {
  return k / stream_chunk_k<FP4> * stream_chunk_units<FP4>;
}
/// Units before the images: zeros, read at 4 + i (a bank group no carrier of a phase reads).
constexpr int stream_zero_units = 8;
/// The unit of x's word `word` (codes 8 word .. + 7) in an image: step s, lane t (a quarter of
/// the step), chunk h (a half of the lane's), word i of the chunk's.
template <bool FP4>
__device__ __forceinline__ int stream_unit(int word) {
  constexpr int SK = stream_step_k<FP4>, LK = SK / 4, HK = LK / 2, NW = stream_words<FP4>;
  const int s = 8 * word / SK, o = 8 * word % SK;
  return (2 * s + o % LK / HK) * stream_chunk_units<FP4> + o / LK * (NW + 1) + o % HK / 8;
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

/// 8 e4m3 codes (two words) as four f16 pairs: .x / .y for one mma's a0 / a2 (or b0 / b1),
/// .z / .w for the next.
__device__ __forceinline__ uint4 f16_pairs(uint2 e4m3) {
  uint4 r;
  cuda::detail::e4m3x4_to_f16x2(e4m3.x, r.x, r.y);
  cuda::detail::e4m3x4_to_f16x2(e4m3.y, r.z, r.w);
  return r;
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

/// grid (sum of ceil(n_i / 64), 1, groups): warp w of block column bx computes rows 64 bx + 16 w
/// .. + 15 for every slot of its group (max_tokens at most). PASSES: column passes (2 slots a
/// pass) over the same weight registers. The set: up to max_set dense FP8 problems of one x, or
/// one grouped problem (a pair: groups2); images: the slots staged in shared memory (a prefix,
/// max_slots of the launch).
template <bool FP4, int PASSES, int N>
__global__ void __launch_bounds__(stream_warps * 32, PASSES == 4 ? 4 : 1)  // 4 passes: 4 blocks an SM
    stream_kernel(const __grid_constant__ problem_set<N> set, int images) {
  constexpr int SK = stream_step_k<FP4>, NW = stream_words<FP4>, UC = stream_chunk_units<FP4>;
  constexpr int SB = SK / 32;  // K blocks a step
  constexpr int max_tokens = stream_pass_slots * PASSES;
  constexpr int ahead = stream_ahead<PASSES>, ring = ahead + 1;  // buffers: the step in use, those in flight
  extern __shared__ __align__(16) uint8_t smem[];
  gemm_problem p = set.p[0];
  const int bx = set_member(p, set);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = bx * stream_rows + warp * 16;
  const int k = p.k, steps = k / SK, kb_count = k / 32;
  const uint32_t w_stride = FP4 ? k / 2 : k;
  const int image_units = stream_image_units<FP4>(k);

  // the weight's first steps: a dense call knows its weight before the kernel before it ends.
  // Lane (g, t) reads rows r0 + g and r0 + g + 8 at bytes 128 s + 32 t .. + 31 of step s (chunk
  // h: the 16 bytes h), and the scales of its D columns' blocks: FP4 blocks 8s + 4 (t % 2) .. + 3
  // of both rows (32 bits each), FP8 blocks 4s + 2 (t % 2), + 1 of the rows' 32-row group (16)
  uint4 wbuf[ring][2][2];  // [buffer][row g, g + 8][chunk]
  uint32_t sbuf[ring][FP4 ? 2 : 1];
  const bool row_ok = r0 < p.n;
  const uint8_t *wrow = nullptr, *srow = nullptr;
  const auto aim = [&](const uint8_t* w, const uint8_t* ws) {
    wrow = w + size_t(r0 + g) * w_stride + t * 32;
    srow = ws + (FP4 ? size_t(r0 + g) * kb_count + 4 * (t % 2) : size_t(r0 / 32) * kb_count + 2 * (t % 2));
  };
  const auto load = [&](int st, int slot) {  // every load unconditional: no copies kept alive
#pragma unroll
    for (int i = 0; i < ring; ++i)
      if (i == slot) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            wbuf[i][r][h] =
                __ldg(reinterpret_cast<const uint4*>(wrow + size_t(8 * r) * w_stride + size_t(st) * 128 + 16 * h));
        if constexpr (FP4) {
          sbuf[i][0] = __ldg(reinterpret_cast<const uint32_t*>(srow + size_t(st) * SB));
          sbuf[i][1] = __ldg(reinterpret_cast<const uint32_t*>(srow + size_t(8) * kb_count + size_t(st) * SB));
        } else {
          sbuf[i][0] = __ldg(reinterpret_cast<const uint16_t*>(srow + size_t(st) * SB));
        }
      }
  };
  const auto prefetch = [&] {
    if (!row_ok) return;
#pragma unroll
    for (int u = 0; u < ahead; ++u) load(min(u, steps - 1), u);
  };
  if (!p.groups) aim(p.w, p.ws), prefetch();
  cuda::detail::grid_dependency_wait();  // x (and a grouped call's tables) come from kernels before
  const group_view gv = group_of(p);
  if (p.groups) {
    if (gv.count == 0) return;  // block-uniform
    aim(gv.w, gv.ws), prefetch();
  }
  const int count = min(gv.count, max_tokens);  // the launch picked a variant of max_tokens >= max_slots
  // the zero units, the images (slots s < min(count, images)), then the scales of max_tokens + 1
  // slots (the last: zeros; FP4: times 2^14, undoing the weight values' 2^-14, exact)
  uint4* zero = reinterpret_cast<uint4*>(smem);
  uint4* img = zero + stream_zero_units;
  float* sxs = reinterpret_cast<float*>(img + images * image_units);
  const int staged = min(count, images), words = k / 8;
#pragma unroll 4
  for (int i = threadIdx.x; i < staged * words; i += blockDim.x) {
    const int s = i / words, word = i % words;
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p.xq + size_t(x_row(p, gv.first + s)) * k + size_t(word) * 8));
    if constexpr (FP4) img[size_t(s) * image_units + stream_unit<FP4>(word)] = x_f16_pairs_fp4(v);
    else img[size_t(s) * image_units + stream_unit<FP4>(word)] = f16_pairs(v);
  }
  if (threadIdx.x < stream_zero_units) zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
#pragma unroll 4
  for (int i = threadIdx.x; i < (max_tokens + 1) * kb_count; i += blockDim.x) {
    const int s = i / kb_count, kb = i % kb_count;
    const float unscale = FP4 ? fp4_f16_unscale : 1.0f;
    sxs[i] = s < count ? p.xs[size_t(x_row(p, gv.first + s)) * kb_count + kb] * unscale : 0.0f;
  }
  __syncthreads();
  cuda::detail::launch_dependents();
  if (!row_ok) return;

  // B column g of pass q: slot 2q + g / 4, the block lane g % 4 carries; lane (g, t) reads it
  // where t == g % 4, else the zero units. D: lane (g, t) holds rows g, g + 8 of columns 2t,
  // 2t + 1: slot 2q + t / 2, the blocks of lanes 2 (t % 2) and + 1 (FP4 in chunk h: blocks
  // 8s + 4 (t % 2) + h and + 2; FP8: 4s + 2 (t % 2) and + 1).
  const uint4* b_src[PASSES];
  int b_step[PASSES];
  const float* x_scale[PASSES];
#pragma unroll
  for (int q = 0; q < PASSES; ++q) {
    const int slot = q * stream_pass_slots + g / 4;
    const bool carries = g % 4 == t && slot < staged;
    b_src[q] = carries ? img + size_t(slot) * image_units + t * (NW + 1) : zero + 4;
    b_step[q] = carries ? UC : 0;
    const int tok = min(q * stream_pass_slots + t / 2, max_tokens);
    x_scale[q] = sxs + tok * kb_count + SB / 2 * (t % 2);
  }
  float acc[PASSES][4] = {};
  // dot products of chunk h of the step in buffer u into d (even words) and d_odd
  const auto chunk_mmas = [&](int u, int h, float (&d)[PASSES][4], float (&d_odd)[PASSES][4]) {
    uint4 b[PASSES][NW];  // x first: its loads in flight while the weight's words become A pairs
#pragma unroll
    for (int q = 0; q < PASSES; ++q) {
#pragma unroll
      for (int i = 0; i < NW; ++i) b[q][i] = b_src[q][i];
      b_src[q] += b_step[q];
    }
#pragma unroll
    for (int i = 0; i < NW; ++i) {
      const uint4 w0 = wbuf[u][0][h], w1 = wbuf[u][1][h];
      uint4 a0, a1;  // rows g and g + 8: pairs for two mmas (.x / .y, then .z / .w)
      if constexpr (FP4) {
        a0 = e2m1x8_to_f16_scaled(i == 0 ? w0.x : i == 1 ? w0.y : i == 2 ? w0.z : w0.w);
        a1 = e2m1x8_to_f16_scaled(i == 0 ? w1.x : i == 1 ? w1.y : i == 2 ? w1.z : w1.w);
      } else {
        a0 = f16_pairs(i == 0 ? make_uint2(w0.x, w0.y) : make_uint2(w0.z, w0.w));
        a1 = f16_pairs(i == 0 ? make_uint2(w1.x, w1.y) : make_uint2(w1.z, w1.w));
      }
#pragma unroll
      for (int q = 0; q < PASSES; ++q) {
        float* dc = i % 2 ? d_odd[q] : d[q];
        mma_f16(dc, a0.x, a1.x, a0.y, a1.y, b[q][i].x, b[q][i].y);
        mma_f16(dc, a0.z, a1.z, a0.w, a1.w, b[q][i].z, b[q][i].w);
      }
    }
  };
  for (int s0 = 0; s0 < steps; s0 += ring) {
#pragma unroll
    for (int u = 0; u < ring; ++u) {
      const int st = s0 + u;
      if (st >= steps) break;
      load(min(st + ahead, steps - 1), (u + ahead) % ring);
      // d[q][e]: row g (e < 2) or g + 8, column 2t + e % 2; scaled by sw * sx of its block
      if constexpr (FP4) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float d[PASSES][4] = {}, d_odd[PASSES][4] = {};
          chunk_mmas(u, h, d, d_odd);
#pragma unroll
          for (int q = 0; q < PASSES; ++q) {
            const float4 sx4 = *reinterpret_cast<const float4*>(x_scale[q] + st * SB);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int j = 2 * (e % 2) + h;  // the block among the lane's four of the step
              const float sw = ue8m0_value((sbuf[u][e / 2] >> (8 * j)) & 0xFFu);
              const float sx = j == 0 ? sx4.x : j == 1 ? sx4.y : j == 2 ? sx4.z : sx4.w;
              acc[q][e] = fmaf(d[q][e] + d_odd[q][e], sw * sx, acc[q][e]);
            }
          }
        }
      } else {
        float d[PASSES][4] = {}, d_odd[PASSES][4] = {};
        chunk_mmas(u, 0, d, d_odd);
        chunk_mmas(u, 1, d, d_odd);
#pragma unroll
        for (int q = 0; q < PASSES; ++q) {
          const float2 sx2 = *reinterpret_cast<const float2*>(x_scale[q] + st * SB);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float sw = ue8m0_value((sbuf[u][0] >> (8 * (e % 2))) & 0xFFu);
            acc[q][e] = fmaf(d[q][e] + d_odd[q][e], sw * (e % 2 ? sx2.y : sx2.x), acc[q][e]);
          }
        }
      }
    }
  }
  // a slot's blocks: in-lane (the column pair), then the lane pair t, t ^ 1
#pragma unroll
  for (int q = 0; q < PASSES; ++q)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float v = acc[q][2 * r] + acc[q][2 * r + 1];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      acc[q][2 * r] = v;
    }
  if (t % 2 != 0) return;
#pragma unroll
  for (int q = 0; q < PASSES; ++q) {
    const int tok = q * stream_pass_slots + t / 2;
    if (tok >= count) continue;
    float* yr = gv.y + size_t(gv.first + tok) * p.n + r0 + g;
    yr[0] = acc[q][0];
    yr[8] = acc[q][2];
  }
}

/// Column passes for max_slots slots (2 a pass; 4 passes past 4 slots).
constexpr int stream_passes(int max_slots) { return max_slots <= 2 ? 1 : max_slots <= 4 ? 2 : 4; }

/// The stream kernel's dynamic shared memory for PASSES passes, max_slots slots and K = k.
template <bool FP4>
int stream_smem(int passes, int max_slots, int k) {
  const int max_tokens = stream_pass_slots * passes, images = std::min(max_slots, max_tokens);
  return (stream_zero_units + images * stream_image_units<FP4>(k)) * 16 + (max_tokens + 1) * (k / 32) * 4;
}

template <bool FP4, int PASSES, int N>
void launch_stream_n(const gemm_problem* ps, int count, int z, int max_slots) {
  const int k = ps[0].k;
  const int images = std::min(max_slots, stream_pass_slots * PASSES);
  const int smem = stream_smem<FP4>(PASSES, max_slots, k);
  int cols = 0;
  const problem_set<N> set = make_set<N>(ps, count, stream_rows, cols);
  const auto kernel = stream_kernel<FP4, PASSES, N>;
  cuda::detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  cuda::detail::launch_dependent(kernel, dim3(cols, 1, z), dim3(stream_warps * 32), smem, set, images);
}

template <bool FP4, int PASSES>
void launch_stream_shape(const gemm_problem* ps, int count, int z, int max_slots) {
  if constexpr (!FP4)
    if (count > 1) return launch_stream_n<FP4, PASSES, max_set>(ps, count, z, max_slots);
  launch_stream_n<FP4, PASSES, 1>(ps, 1, z, max_slots);
}

}  // namespace

template <bool FP4>
void launch_stream(const gemm_problem* ps, int count, int z, int max_slots) {
  CEDAR_CUDA_REQUIRE(max_slots <= stream_max_slots, "fast gemm (stream): at most 8 slots a group");
  for (int i = 0; i < count; ++i)
    CEDAR_CUDA_REQUIRE(stream_shape(FP4, ps[i].n, ps[i].k), FP4 ? "fast gemm (stream): k % 256 == 0 and n % 16 == 0"
                                                                  : "fast gemm (stream): k % 128 == 0 and n % 16 == 0");
  CEDAR_CUDA_REQUIRE(stream_fits(FP4, max_slots, ps[0].k),
                     "fast gemm (stream): x staged for these slots over all of K needs more shared memory than a "
                     "block has");
  // column passes of 2 slots
  const int passes = stream_passes(max_slots);
  if (passes == 1) launch_stream_shape<FP4, 1>(ps, count, z, max_slots);
  else if (passes == 2) launch_stream_shape<FP4, 2>(ps, count, z, max_slots);
  else launch_stream_shape<FP4, 4>(ps, count, z, max_slots);
}

template void launch_stream<false>(const gemm_problem*, int, int, int);
template void launch_stream<true>(const gemm_problem*, int, int, int);

}  // namespace cedar::cuda::fast::detail

namespace cedar::cuda::fast {

bool stream_fits(bool fp4, int slots, int k) {
  const int passes = detail::stream_passes(std::max(slots, 1));
  const int smem = fp4 ? detail::stream_smem<true>(passes, slots, k) : detail::stream_smem<false>(passes, slots, k);
  // every device of compute capability 8.0 on lets a block opt in to more than this: the model's
  // launches (at most ~45 KB) are decided without asking the device
  constexpr int fits_anywhere = 96 * 1024;
  if (smem <= fits_anywhere) return true;
  // else the device's opt-in limit, asked once per device (0: not yet)
  constexpr int max_devices = 64;
  static std::atomic<int> optin_of[max_devices] = {};
  int dev = 0;
  CEDAR_CUDA_CHECK(cudaGetDevice(&dev));
  int optin = dev < max_devices ? optin_of[dev].load(std::memory_order_relaxed) : 0;
  if (optin == 0) {
    CEDAR_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (dev < max_devices) optin_of[dev].store(optin, std::memory_order_relaxed);
  }
  return smem <= optin;
}

}  // namespace cedar::cuda::fast
