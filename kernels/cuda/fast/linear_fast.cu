// The fast kernel set's linear layers and experts (fast_ops.hpp): the contracts of
// cuda::linear_fp8/fp4/bf16, grouped_output and moe_ffn, on tensor cores.
//
// Decode (few rows): the gemv tile of gemm.cu (FP8/W4A8, activations quantized to e4m3 codes),
// the experts grouped on the device (no host round trip), and a bandwidth-bound bf16 GEMV. The
// experts up to tuning::expert_gemv_max_rows tokens stream each busy expert's FP4 weight through
// gemm_tiles.cu's narrow tiles (once per 8, 16 or 32 of its slots, by token count).
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
#include <cstring>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/mma.cuh"
#include "kernels/cuda/internal.cuh"

namespace cedar::cuda::fast {
namespace detail {
namespace {

using cuda::detail::blocks_for;
using cuda::detail::scratch;
using cuda::detail::stream;

constexpr int max_experts = 1024;

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + cuda::detail::exp_f(-x)); }

/// fp32 -> bf16 bits, round to nearest even (exact for values that are bf16 already).
__device__ __forceinline__ uint16_t to_bf16(float x) { return cuda::detail::f32_to_bf16(x); }

// ---- dequantization into bf16 ------------------------------------------------------------------

/// One thread per 8 codes of an FP8 weight [n, k] (k % 8 == 0) -> bf16 [n, k].
__global__ void dequant_fp8_kernel(const uint8_t* data, const uint8_t* scale, int n, int k, uint16_t* out) {
  cuda::detail::dependent_start();
  __shared__ float lut[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) lut[i] = cuda::detail::e4m3_to_f32(uint8_t(i));
  __syncthreads();
  const long long piece = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (piece >= (long long)n * k / 8) return;
  const long long e0 = piece * 8;
  const int row = int(e0 / k), col = int(e0 % k);
  const float s = cuda::detail::ue8m0_to_f32(scale[size_t(row / 32) * ((k + 31) / 32) + col / 32]);
  const uint2 v = reinterpret_cast<const uint2*>(data)[piece];
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = i < 2 ? v.x : v.y;
    const int sh = (i % 2) * 16;
    const float a = lut[(word >> sh) & 0xFF] * s, b = lut[(word >> (sh + 8)) & 0xFF] * s;
    o[i] = uint32_t(to_bf16(a)) | (uint32_t(to_bf16(b)) << 16);
  }
  reinterpret_cast<uint4*>(out)[piece] = make_uint4(o[0], o[1], o[2], o[3]);
}

/// One thread per 32 values (16 bytes, one UE8M0 scale) of a packed E2M1 weight [n, k] -> bf16
/// [n, k] (64 bytes out).
__global__ void dequant_fp4_kernel(const uint8_t* data, const uint8_t* scale, int n, int k, uint16_t* out) {
  cuda::detail::dependent_start();
  __shared__ float lut[16];
  if (threadIdx.x < 16) lut[threadIdx.x] = cuda::detail::e2m1_to_f32(uint8_t(threadIdx.x));
  __syncthreads();
  const long long piece = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (piece >= (long long)n * k / 32) return;
  const float s = cuda::detail::ue8m0_to_f32(scale[piece]);  // scales are [n, k / 32]: one a piece
  const uint4 w = reinterpret_cast<const uint4*>(data)[piece];
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  uint4* dst = reinterpret_cast<uint4*>(out) + piece * 4;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t byte = (words[q] >> (8 * i)) & 0xFF;  // low nibble = even column
      o[i] = uint32_t(to_bf16(lut[byte & 0xF] * s)) | (uint32_t(to_bf16(lut[byte >> 4] * s)) << 16);
    }
    dst[q] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

/// The power-of-two scale of fmt::quantize_fp8 for a group's largest |x| (as fp8_group_scale).
__device__ __forceinline__ float group_scale(float amax) { return cuda::detail::fp8_group_scale(amax); }

/// Four threads per group of 32 (8 values each): row r of out [m, k] is fmt::fake_quant_fp8 of
/// x row rows[r] (or r) as bf16 (exact). Rows at or past *count (when given) or with rows[r] < 0
/// are zeros. v / s is computed as v * (1 / s): s is a power of two, so both are the same
/// correctly rounded value.
__global__ void fake_quant_bf16_kernel(const float* x, int ldx, const int32_t* rows, const int* count, int m, int k,
                                       uint16_t* out) {
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
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
  if (!in) return;
  const float s = group_scale(amax), inv = 1.0f / s;
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float q0 = cuda::detail::round_to_e4m3(cuda::detail::clampf(v[2 * i] * inv, -448.0f, 448.0f)) * s;
    const float q1 = cuda::detail::round_to_e4m3(cuda::detail::clampf(v[2 * i + 1] * inv, -448.0f, 448.0f)) * s;
    o[i] = uint32_t(to_bf16(q0)) | (uint32_t(to_bf16(q1)) << 16);
  }
  reinterpret_cast<uint4*>(out + size_t(r) * k)[c8] = make_uint4(o[0], o[1], o[2], o[3]);
}

/// x [m, k] (row stride ldx) -> out [Parts, m, k] bf16: each part the residual of the ones
/// before, rounded (exact in fp32). Three parts give x exactly; two leave |x - hi - lo| <=
/// 2^-18 |x|.
template <int Parts>
__global__ void split_kernel(const float* x, int ldx, int m, int k, uint16_t* out) {
  cuda::detail::dependent_start();
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const long long n = (long long)m * k;
  if (i >= n) return;
  float r = x[size_t(i / k) * ldx + i % k];
#pragma unroll
  for (int p = 0; p < Parts; ++p) {
    const uint16_t h = to_bf16(r);
    out[p * n + i] = h;
    r -= cuda::detail::bf16_to_f32(h);
  }
}

// ---- bf16 GEMV (decode) ------------------------------------------------------------------------

constexpr int gemv_warps = 8;

/// Column mode, grid (ceil(m / R), ceil(n / 8), groups): warp w computes column 8 by + w for
/// rows R bx .. (+R), group bz: y[r, c] = sum_k x[r, k] w[c, k], fp32 products (as the CPU's)
/// summed by lane (k in 8-wide pieces, lane l takes pieces l, l + 32, ...) then by the shuffle
/// fold. Split mode (Split, for weights of few columns, which would leave most SMs idle), grid
/// (ceil(m / R), n, groups): block by computes column by, its warp w the w-th eighth of the
/// pieces as above, and the warps' sums are added in warp order. The mode is chosen by n and
/// groups only, so a row's bits do not depend on R or m. Needs k % 8 == 0 and 16-byte aligned
/// rows.
template <int R, bool Split>
__global__ void __launch_bounds__(gemv_warps * 32)
    gemv_bf16_kernel(const float* x, int ldx, long long x_group, int m, const uint16_t* w, long long w_group,
                     int n, int k, float* y, int ldy, long long y_group) {
  cuda::detail::dependent_start();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col = Split ? int(blockIdx.y) : int(blockIdx.y) * gemv_warps + warp;
  if (!Split && col >= n) return;
  x += blockIdx.z * x_group, w += blockIdx.z * w_group, y += blockIdx.z * y_group;
  const int r0 = blockIdx.x * R;
  const uint4* wr = reinterpret_cast<const uint4*>(w + size_t(col) * k);
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  const int pieces = k / 8;
  const int share = Split ? (pieces + gemv_warps - 1) / gemv_warps : pieces;
  const int p0 = Split ? warp * share : 0, p1 = min(pieces, p0 + share);
#pragma unroll 4
  for (int c = p0 + lane; c < p1; c += 32) {
    const uint4 v = __ldg(wr + c);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    float wf[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      wf[2 * i] = __uint_as_float(words[i] << 16);
      wf[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r0 + r >= m) break;
      const float4* xr = reinterpret_cast<const float4*>(x + size_t(r0 + r) * ldx) + 2 * c;
      const float4 a = xr[0], b = xr[1];
      float s = acc[r];
      s = s + wf[0] * a.x, s = s + wf[1] * a.y, s = s + wf[2] * a.z, s = s + wf[3] * a.w;
      s = s + wf[4] * b.x, s = s + wf[5] * b.y, s = s + wf[6] * b.z, s = s + wf[7] * b.w;
      acc[r] = s;
    }
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

/// Split mode for weights whose column blocks would not cover the SMs (layer_ops' router gate
/// of 64 experts, the indexer's head weights: 8 and 4 blocks a row).
bool gemv_split(int n, int groups) {
  return (long long)((n + gemv_warps - 1) / gemv_warps) * groups < cuda::detail::num_sms();
}

template <int R>
void launch_gemv_r(const float* x, int ldx, long long xg, int m, const uint16_t* w, long long wg, int n, int k,
                   float* y, int ldy, long long yg, int groups) {
  const bool split = gemv_split(n, groups);
  const dim3 grid((m + R - 1) / R, split ? n : (n + gemv_warps - 1) / gemv_warps, groups);
  CEDAR_CUDA_REQUIRE(grid.y <= 65535, "gemv_bf16: at most 524280 columns");
  if (split)
    cuda::detail::launch_dependent(gemv_bf16_kernel<R, true>, grid, dim3(gemv_warps * 32), 0, x, ldx, xg, m, w, wg, n,
                                   k, y, ldy, yg);
  else
    cuda::detail::launch_dependent(gemv_bf16_kernel<R, false>, grid, dim3(gemv_warps * 32), 0, x, ldx, xg, m, w, wg, n,
                                   k, y, ldy, yg);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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

// ---- experts -------------------------------------------------------------------------------

__device__ __forceinline__ bool expert_valid(int e, int num_experts, const cpu::expert_weights* table) {
  return e >= 0 && e < num_experts && table[e].w1.data != nullptr;
}

/// grid (num_experts), 256 threads. Block e: the slots routed to expert e in ascending slot
/// order fill sorted positions [off_e, off_e + count_e) (off_e = the counts of the experts
/// before e): slot_src[p] = slot, slot_row[p] = slot / topk, slot_pos[slot] = p (-1 for slots
/// of no present expert), and the groups of the three matrices. counts[e] = count_e; *total.
/// The groups are compacted: the experts with slots come first (in expert order), so a launch
/// over the first min(num_experts, slots) groups covers every slot.
__global__ void group_kernel(const int32_t* sel, int slots, int topk, const cpu::expert_weights* table, int num_experts,
                             int32_t* slot_src, int32_t* slot_row, int32_t* iota, int32_t* slot_pos, expert_group* g1,
                             expert_group* g3, expert_group* g2, int* counts, int* total) {
  cuda::detail::dependent_start();
  __shared__ int count[max_experts];
  __shared__ int warp_n[32];
  __shared__ int base;
  const int e = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = blockDim.x / 32;
  for (int i = tid; i < num_experts; i += blockDim.x) count[i] = 0;
  __syncthreads();
  for (int s = tid; s < slots; s += blockDim.x)
    if (expert_valid(sel[s], num_experts, table)) atomicAdd(&count[sel[s]], 1);
  __syncthreads();
  if (tid == 0) {
    int off = 0, used_before = 0, used = 0;
    for (int i = 0; i < num_experts; ++i) {
      used += count[i] > 0;
      if (i < e) off += count[i], used_before += count[i] > 0;
    }
    base = off;
    counts[e] = count[e];
    if (e == num_experts - 1) *total = off + count[e];
    const cpu::expert_weights& w = table[e];
    const int at = count[e] > 0 ? used_before : used + (e - used_before);  // the empty ones after
    g1[at] = {w.w1.data, w.w1.scale, off, count[e]};
    g3[at] = {w.w3.data, w.w3.scale, off, count[e]};
    g2[at] = {w.w2.data, w.w2.scale, off, count[e]};
  }
  __syncthreads();
  const bool present = expert_valid(e, num_experts, table);
  for (int c0 = 0; c0 < slots && present; c0 += blockDim.x) {
    const int s = c0 + tid;
    const bool mine = s < slots && sel[s] == e;
    const unsigned ballot = __ballot_sync(0xFFFFFFFFu, mine);
    if (lane == 0) warp_n[warp] = __popc(ballot);
    __syncthreads();
    int before = base;
    for (int i = 0; i < warp; ++i) before += warp_n[i];
    if (mine) {
      const int p = before + __popc(ballot & ((1u << lane) - 1));
      slot_src[p] = s, slot_row[p] = s / topk, iota[p] = p, slot_pos[s] = p;
    }
    __syncthreads();
    if (tid == 0)
      for (int i = 0; i < warps; ++i) base += warp_n[i];
    __syncthreads();
  }
  if (e == 0)
    for (int s = tid; s < slots; s += blockDim.x)
      if (!expert_valid(sel[s], num_experts, table)) slot_pos[s] = -1;
}

/// h = silu(min(g, limit)) * clamp(u, -limit, limit), times weights[slot_src[s]] when given,
/// over g [cap, inter] (slots at or past *total: 0).
__global__ void swiglu_kernel(float* g, const float* u, int cap, int inter, const int32_t* slot_src, const float* weights,
                              const int* total, float limit) {
  cuda::detail::dependent_start();
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= (long long)cap * inter) return;
  const int s = int(i / inter);
  if (total && s >= *total) {
    g[i] = 0.0f;
    return;
  }
  const float h = silu_f(cuda::detail::std_min(g[i], limit)) * cuda::detail::clampf(u[i], -limit, limit);
  g[i] = weights ? weights[slot_src ? slot_src[s] : s] * h : h;
}

/// The same on gu [cap, 2 inter] (g then u), written as the fake-quantized bf16 h [cap, inter]
/// (one warp per group of 32).
__global__ void swiglu_bf16_kernel(const float* gu, int cap, int inter, const int32_t* slot_src, const float* weights,
                                   const int* total, float limit, uint16_t* out) {
  cuda::detail::dependent_start();
  const long long gi = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32, gpr = inter / 32;
  if (gi >= (long long)cap * gpr) return;
  const int s = int(gi / gpr), j = int(gi % gpr);
  float h = 0.0f;
  if (s < *total) {
    const float* row = gu + size_t(s) * 2 * inter;
    const float g = row[j * 32 + lane], u = row[inter + j * 32 + lane];
    h = silu_f(cuda::detail::std_min(g, limit)) * cuda::detail::clampf(u, -limit, limit);
    if (weights) h = weights[slot_src[s]] * h;
  }
  float amax = fabsf(h);
  for (int off = 16; off >= 1; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  const float sc = cuda::detail::fp8_group_scale(amax);
  const float q = cuda::detail::round_to_e4m3(cuda::detail::clampf(h / sc, -448.0f, 448.0f)) * sc;
  out[size_t(s) * inter + j * 32 + lane] = to_bf16(q);
}

/// out[r, c] = (0 + down[pos(r, 0), c] + ... in top-k order) + shared[r, c] (0 when null).
__global__ void combine_kernel(const float* down, const int32_t* slot_pos, const float* shared, int m, int topk, int d,
                               float* out) {
  cuda::detail::dependent_start();
  const long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= (long long)m * d) return;
  const int r = int(e / d), c = int(e % d);
  float o = 0.0f;
  for (int i = 0; i < topk; ++i) {
    const int p = slot_pos[size_t(r) * topk + i];
    o += p >= 0 ? down[size_t(p) * d + c] : 0.0f;
  }
  out[e] = o + (shared ? shared[e] : 0.0f);
}

}  // namespace

// ---- building blocks -----------------------------------------------------------------------------

void dequant_bf16(const fp8_weight& w, uint16_t* out) {
  CEDAR_CUDA_REQUIRE(w.in % 8 == 0, "dequant_bf16: in % 8 == 0");
  const long long pieces = (long long)w.out * w.in / 8;
  if (pieces == 0) return;
  cuda::detail::launch_dependent(dequant_fp8_kernel, dim3(blocks_for(pieces, 256)), dim3(256), 0, w.data, w.scale,
                                 w.out, w.in, out);
}

void dequant_bf16(const fp4_weight& w, uint16_t* out, void* on_stream) {
  CEDAR_CUDA_REQUIRE(w.in % 32 == 0, "dequant_bf16: in % 32 == 0");
  const long long pieces = (long long)w.out * w.in / 32;
  if (pieces == 0) return;
  if (on_stream == nullptr) {
    cuda::detail::launch_dependent(dequant_fp4_kernel, dim3(blocks_for(pieces, 256)), dim3(256), 0, w.data, w.scale,
                                   w.out, w.in, out);
    return;
  }
  dequant_fp4_kernel<<<blocks_for(pieces, 256), 256, 0, static_cast<cudaStream_t>(on_stream)>>>(w.data, w.scale, w.out,
                                                                                               w.in, out);
  CEDAR_CUDA_CHECK(cudaGetLastError());
}

void fake_quant_bf16(const float* x, int ldx, const int32_t* rows, const int* count, int m, int k, uint16_t* out) {
  CEDAR_CUDA_REQUIRE(k % 32 == 0 && ldx % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
                     "fake_quant_bf16: k % 32 == 0, 16-byte aligned rows");
  const long long threads = (long long)m * k / 8;
  if (threads == 0) return;
  cuda::detail::launch_dependent(fake_quant_bf16_kernel, dim3(blocks_for(threads, 256)), dim3(256), 0, x, ldx, rows,
                                 count, m, k, out);
}

void split_bf16(const float* x, int ldx, int m, int k, int parts, uint16_t* out) {
  CEDAR_CUDA_REQUIRE(parts == 2 || parts == 3, "split_bf16: two or three parts");
  const long long n = (long long)m * k;
  if (n == 0) return;
  cuda::detail::launch_dependent(parts == 2 ? split_kernel<2> : split_kernel<3>, dim3(blocks_for(n, 256)), dim3(256),
                                 0, x, ldx, m, k, out);
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
  if (m == 1) launch_gemv_r<1>(x, ldx, x_group, m, w, w_group, n, k, y, ldy, y_group, groups);
  else if (m == 2) launch_gemv_r<2>(x, ldx, x_group, m, w, w_group, n, k, y, ldy, y_group, groups);
  else if (m <= 4) launch_gemv_r<4>(x, ldx, x_group, m, w, w_group, n, k, y, ldy, y_group, groups);
  else launch_gemv_r<8>(x, ldx, x_group, m, w, w_group, n, k, y, ldy, y_group, groups);
  return true;
}

}  // namespace detail

using namespace detail;

tuning& tuning_now() {
  static tuning t;
  return t;
}

// ---- linear layers -----------------------------------------------------------------------------

namespace {

bool gemv_shape(int n, int k) { return n % 16 == 0 && k % 32 == 0; }

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

template <bool FP4, class W>
void quantized_linear(const float* x, int m, const W& w, float* y) {
  CEDAR_CUDA_REQUIRE(w.in % 32 == 0, "fast linear: in is a multiple of 32");
  if (m <= 0) return;
  const tuning& tune = tuning_now();
  const bool gemv = m <= tune.gemv_max_rows && gemv_shape(w.out, w.in);
  bool kept = false;  // a bf16 copy the model keeps: its GEMM beats the tile
  if constexpr (!FP4) kept = w.bf16 != nullptr;
  const bool narrow_fits = w.out % 64 == 0 && w.in % 256 == 0;  // the narrow and narrow32 tiles
  const bool tiled = !gemv && !kept && narrow_fits && m <= tune.fp8_narrow_max_rows &&
                     (long long)w.out * w.in >= tune.fp8_narrow_min_weight;
  const bool split = m <= 8 && split_fits(w.out, w.in, tune) && w.out >= tune.split_min_out;
  const bool stream = !split && narrow_fits && m <= 8 && w.out >= tune.dense_stream_min_out;
  if (gemv || tiled || stream || split) {
    const tile_kind t = split    ? tile_kind::split4
                        : stream ? tile_kind::narrow
                        : gemv   ? tile_kind::gemv
                                 : tile_kind::narrow32;
    scratch<uint8_t> xq(size_t(m) * w.in);
    scratch<float> xs(size_t(m) * (w.in / 32));
    quantize_rows_fp8(x, m, w.in, xq.get(), xs.get());
    if constexpr (FP4) gemm_fp4(xq.get(), xs.get(), m, w, y, t);
    else gemm_fp8(xq.get(), xs.get(), m, w, y, t);
    return;
  }
  prefill_linear(x, m, w, y);
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

void linear_fp8(const float* x, int m, const fp8_weight& w, float* y) { quantized_linear<false>(x, m, w, y); }

void linear_fp4(const float* x, int m, const fp4_weight& w, float* y) { quantized_linear<true>(x, m, w, y); }

void linear_fp8_set(const float* x, int m, int count, const fp8_weight* const* w, float* const* y,
                    const uint8_t* xq, const float* xs) {
  CEDAR_CUDA_REQUIRE(count >= 1 && count <= 4, "linear_fp8_set: 1 to 4 weights");
  if (m <= 0) return;
  bool gemv = m <= tuning_now().gemv_max_rows;
  for (int i = 0; i < count; ++i) {
    CEDAR_CUDA_REQUIRE(w[i]->in == w[0]->in && w[i]->in % 32 == 0, "linear_fp8_set: one x, in a multiple of 32");
    gemv = gemv && gemv_shape(w[i]->out, w[i]->in);
  }
  if (!gemv) {
    for (int i = 0; i < count; ++i) linear_fp8(x, m, *w[i], y[i]);
    return;
  }
  const tuning& tune = tuning_now();
  bool split = m <= 8;
  for (int i = 0; i < count; ++i) split = split && split_fits(w[i]->out, w[i]->in, tune);
  const tile_kind t = split ? tile_kind::split8 : tile_kind::gemv;
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

void grouped_output(const float* o, int m, int groups, const bf16_weight& wo_a, const fp8_weight& wo_b, float* out) {
  CEDAR_CUDA_REQUIRE(groups > 0 && wo_a.out % groups == 0, "wo_a rows split into groups");
  CEDAR_CUDA_REQUIRE(wo_b.in == wo_a.out, "wo_b takes concat(u)");
  if (m <= 0) return;
  const int rank = wo_a.out / groups, group_in = wo_a.in;
  scratch<float> u(size_t(m) * wo_a.out);
  const long long w_group = (long long)rank * group_in;
  // u[r, g rank + j] = o[r, g group_in ...] . wo_a[g rank + j]
  if (!(m <= tuning_now().bf16_gemv_max_rows &&
        gemv_bf16(o, groups * group_in, m, wo_a.data, rank, group_in, u.get(), wo_a.out, groups, group_in, w_group, rank)))
    // two parts: wo_a feeds no choice, and at prefill the third GEMM pass over [m, 8 x 4096]
    // is a third of its time
    split_gemm(o, groups * group_in, m, wo_a.data, rank, group_in, u.get(), wo_a.out, 2, groups, group_in, w_group,
               rank);
  linear_fp8(u.get(), m, wo_b, out);
}

// ---- experts -------------------------------------------------------------------------------

namespace {

/// The shared expert (FP8): the fast linears and the exact SwiGLU (no routing weight). w1 and
/// w3 share one GEMV launch; xq / xs, when given, are y already quantized (the routed experts'
/// codes).
void shared_expert(const float* y, int m, const cpu::shared_expert_weights& e, float limit, float* out,
                   const uint8_t* xq = nullptr, const float* xs = nullptr) {
  const int inter = e.w1.out;
  scratch<float> g(size_t(m) * inter), u(size_t(m) * inter);
  const fp8_weight* w13[2] = {&e.w1, &e.w3};
  float* gu[2] = {g.get(), u.get()};
  linear_fp8_set(y, m, 2, w13, gu, xq, xs);
  cuda::detail::launch_dependent(swiglu_kernel, dim3(blocks_for((long long)m * inter, 256)), dim3(256), 0, g.get(),
                                 u.get(), m, inter, nullptr, nullptr, nullptr, limit);
  linear_fp8(g.get(), m, e.w2, out);
}

/// Rows per pass of the experts at prefill (bounds the [slots, 2 inter] fp32 buffer).
constexpr int moe_chunk_rows = 8192;

/// The device copy of a host table of expert views, kept per (table address, size) and
/// checked byte for byte on each use, so a layer's table is uploaded once, not per call.
const cpu::expert_weights* device_table(const cpu::expert_weights* experts, int num_experts) {
  struct entry {
    std::vector<cpu::expert_weights> host;
    void* dev = nullptr;
  };
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, entry> cache;
  std::lock_guard<std::mutex> lock(mu);
  entry& e = cache[{experts, num_experts}];
  const std::size_t bytes = sizeof(cpu::expert_weights) * num_experts;
  if (e.dev == nullptr || std::memcmp(e.host.data(), experts, bytes) != 0) {
    if (e.dev == nullptr) e.dev = cuda::device_alloc(bytes);
    e.host.assign(experts, experts + num_experts);
    CEDAR_CUDA_CHECK(cudaMemcpyAsync(e.dev, e.host.data(), bytes, cudaMemcpyHostToDevice, stream()));
  }
  return static_cast<const cpu::expert_weights*>(e.dev);
}

}  // namespace

namespace {

/// A second stream of the calling thread's current device, with the events that order it
/// against the current stream: the prefill experts dequantize the next expert's weights on it
/// while the current stream runs this expert's GEMM (HBM-bound beside tensor-bound work).
struct side_lane {
  int device = -1;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, ready[2] = {}, done[2] = {};
};

side_lane& side_lane_now() {
  thread_local side_lane lane;
  int dev = 0;
  CEDAR_CUDA_CHECK(cudaGetDevice(&dev));
  if (lane.device != dev) {  // first use on this device (a thread drives one device at a time)
    lane = side_lane{};
    CEDAR_CUDA_CHECK(cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking));
    CEDAR_CUDA_CHECK(cudaEventCreateWithFlags(&lane.start, cudaEventDisableTiming));
    for (int i = 0; i < 2; ++i) {
      CEDAR_CUDA_CHECK(cudaEventCreateWithFlags(&lane.ready[i], cudaEventDisableTiming));
      CEDAR_CUDA_CHECK(cudaEventCreateWithFlags(&lane.done[i], cudaEventDisableTiming));
    }
    lane.device = dev;
  }
  return lane;
}

/// Runs gemm(e, weights) for each expert with rows, its bf16 weights dequantized by
/// dequant(e, into, side stream) into one of two buffers of `elems` values: expert j's
/// dequantization runs on the side lane while expert j - 1's GEMM runs on the current stream,
/// and waits for expert j - 2's GEMM, the buffer's last reader.
template <class Dequant, class Gemm>
void overlapped_experts(const std::vector<int>& counts, size_t elems, Dequant dequant, Gemm gemm) {
  side_lane& lane = side_lane_now();
  scratch<uint16_t> wb(2 * elems);
  CEDAR_CUDA_CHECK(cudaEventRecord(lane.start, stream()));  // wb is allocated in stream order
  CEDAR_CUDA_CHECK(cudaStreamWaitEvent(lane.stream, lane.start, 0));
  int j = 0;
  for (int e = 0; e < int(counts.size()); ++e) {
    if (counts[e] == 0) continue;
    const int buf = j % 2;
    uint16_t* w = wb.get() + buf * elems;
    if (j >= 2) CEDAR_CUDA_CHECK(cudaStreamWaitEvent(lane.stream, lane.done[buf], 0));
    dequant(e, w, static_cast<void*>(lane.stream));
    CEDAR_CUDA_CHECK(cudaEventRecord(lane.ready[buf], lane.stream));
    CEDAR_CUDA_CHECK(cudaStreamWaitEvent(stream(), lane.ready[buf], 0));
    gemm(e, w);
    CEDAR_CUDA_CHECK(cudaEventRecord(lane.done[buf], stream()));
    ++j;
  }
  // the last GEMM waited for the last dequantization, so wb's stream-ordered free comes after
  // every use of it on either stream
}

}  // namespace

void moe_ffn(const float* y, int m, int d, const int32_t* sel, const float* weights, int topk,
             const cpu::expert_weights* experts, int num_experts, const cpu::shared_expert_weights* shared, float limit,
             float* out) {
  CEDAR_CUDA_REQUIRE(num_experts > 0 && num_experts <= max_experts, "expert count");
  if (m <= 0) return;
  const int inter = cuda::detail::expert_inter(experts, num_experts, d);
  CEDAR_CUDA_REQUIRE(d % 32 == 0 && inter % 32 == 0, "fast moe_ffn: d and inter multiples of 32");
  const cpu::expert_weights* table = device_table(experts, num_experts);
  // The grouped W4A8 kernels, on device-side groups: the narrow weight streams where the shapes
  // allow (2.4x the gemv tile on 64 experts x ~6 slots, `cedar kernel-lab --op moe`; 16 slots a
  // pass past expert_narrow_max_rows tokens, 32 past expert_narrow16_max_rows), else the gemv
  // tile; then the skinny tile (when the thresholds leave it rows). Past those: the bf16 path.
  const tuning& tune = tuning_now();
  const bool tiles_fit = d % 256 == 0 && inter % 256 == 0;
  bool grouped = true;
  tile_kind tile = tile_kind::skinny;
  if (m <= tune.expert_gemv_max_rows && tiles_fit)
    tile = m <= tune.expert_narrow_max_rows     ? tile_kind::narrow
           : m <= tune.expert_narrow16_max_rows ? tile_kind::narrow16
                                                : tile_kind::narrow32;
  else if (m <= tune.expert_gemv_max_rows && gemv_shape(inter, d) && gemv_shape(d, inter))
    tile = tile_kind::gemv;
  else
    grouped = m <= tune.expert_tiled_max_rows && tiles_fit;
  const int chunk = grouped ? m : std::min(m, moe_chunk_rows);
  const int cap = chunk * topk;
  scratch<int32_t> slot_src(cap), slot_row(cap), iota(cap), slot_pos(cap);
  scratch<expert_group> groups(size_t(3) * num_experts);
  expert_group *g1 = groups.get(), *g3 = g1 + num_experts, *g2 = g3 + num_experts;
  scratch<int> counts(num_experts + 1);
  int* total = counts.get() + num_experts;
  scratch<float> down(size_t(cap + 64) * d), shared_out(shared ? size_t(chunk) * d : 0);  // + padding rows
  std::vector<int> host_counts(num_experts);
  // the grouped path's x codes (one pass: chunk == m), which the shared expert reuses
  scratch<uint8_t> xq(grouped ? size_t(m) * d : 0);
  scratch<float> xs(grouped ? size_t(m) * (d / 32) : 0);
  bool quantized = false;
  for (int r0 = 0; r0 < m; r0 += chunk) {
    const int rows = std::min(chunk, m - r0), slots = rows * topk;
    const int32_t* sel_c = sel + size_t(r0) * topk;
    const float* w_c = weights + size_t(r0) * topk;
    const float* y_c = y + size_t(r0) * d;
    if (inter > 0) {
      cuda::detail::launch_dependent(group_kernel, dim3(num_experts), dim3(256), 0, sel_c, slots, topk, table,
                                     num_experts, slot_src.get(), slot_row.get(), iota.get(), slot_pos.get(), g1, g3,
                                     g2, counts.get(), total);
      if (grouped) {
        scratch<uint8_t> hq(size_t(slots) * inter);
        scratch<float> hs(size_t(slots) * (inter / 32));
        scratch<float> g(size_t(slots) * inter), u(size_t(slots) * inter);
        const int busy = std::min(num_experts, slots);  // groups that can have slots (compacted)
        quantize_rows_fp8(y_c, rows, d, xq.get(), xs.get());
        quantized = true;
        grouped_fp4_pair(xq.get(), xs.get(), slot_row.get(), g1, g3, busy, slots, rows, inter, d, g.get(), u.get(),
                         tile);
        cuda::detail::launch_dependent(swiglu_kernel, dim3(blocks_for((long long)slots * inter, 256)), dim3(256), 0,
                                       g.get(), u.get(), slots, inter, slot_src.get(), w_c, total, limit);
        quantize_rows_fp8(g.get(), slots, inter, hq.get(), hs.get());
        grouped_fp4(hq.get(), hs.get(), iota.get(), g2, busy, slots, rows, d, inter, down.get(), tile);
      } else {
        // prefill: the 64 (or so) counts to the host, then per-expert bf16 GEMMs on sorted rows
        CEDAR_CUDA_CHECK(cudaMemcpyAsync(host_counts.data(), counts.get(), sizeof(int) * num_experts,
                                         cudaMemcpyDeviceToHost, stream()));
        CEDAR_CUDA_CHECK(cudaStreamSynchronize(stream()));
        int used = 0;
        for (int c : host_counts) used += c;
        // Each expert's GEMM runs on its row count rounded up to a multiple of 64, so cuBLAS
        // sees a handful of shapes (its heuristic cache answers, instead of a fresh search
        // per expert and layer). The extra rows read the next expert's inputs (or the slack
        // past the last) and write into the next expert's outputs, which that expert's own
        // GEMM, later on the same stream, overwrites; a row's output depends on its row only.
        const auto padded = [](int c) { return (c + 63) / 64 * 64; };
        const size_t rows_alloc = size_t(used) + 64;
        scratch<uint16_t> xb(rows_alloc * d), hb(rows_alloc * inter);
        scratch<float> gu(rows_alloc * 2 * inter);
        std::vector<int> first_row(num_experts, 0);
        for (int e = 1; e < num_experts; ++e) first_row[e] = first_row[e - 1] + host_counts[e - 1];
        fake_quant_bf16(y_c, d, slot_row.get(), total, used, d, xb.get());
        overlapped_experts(
            host_counts, size_t(2) * inter * d,
            [&](int e, uint16_t* w, void* side) {
              dequant_bf16(experts[e].w1, w, side);
              dequant_bf16(experts[e].w3, w + size_t(inter) * d, side);
            },
            [&](int e, const uint16_t* w) {
              const int off = first_row[e];
              gemm_bf16(xb.get() + size_t(off) * d, d, padded(host_counts[e]), w, d, 2 * inter, d,
                        gu.get() + size_t(off) * 2 * inter, 2 * inter, false);
            });
        if (used > 0) {  // none when this shard holds none of the chosen experts
          cuda::detail::launch_dependent(swiglu_bf16_kernel, dim3(blocks_for((long long)used * inter, 256)), dim3(256),
                                         0, gu.get(), used, inter, slot_src.get(), w_c, total, limit, hb.get());
        }
        overlapped_experts(
            host_counts, size_t(inter) * d,
            [&](int e, uint16_t* w, void* side) { dequant_bf16(experts[e].w2, w, side); },
            [&](int e, const uint16_t* w) {
              const int off = first_row[e];
              gemm_bf16(hb.get() + size_t(off) * inter, inter, padded(host_counts[e]), w, inter, d, inter,
                        down.get() + size_t(off) * d, d, false);
            });
      }
    }
    if (shared != nullptr)
      shared_expert(y_c, rows, *shared, limit, shared_out.get(), quantized ? xq.get() : nullptr,
                    quantized ? xs.get() : nullptr);
    if (inter > 0) {
      cuda::detail::launch_dependent(combine_kernel, dim3(blocks_for((long long)rows * d, 256)), dim3(256), 0,
                                     down.get(), slot_pos.get(), shared ? shared_out.get() : nullptr, rows, topk, d,
                                     out + size_t(r0) * d);
    } else if (shared != nullptr) {
      cuda::copy_device(out + size_t(r0) * d, shared_out.get(), sizeof(float) * rows * d);
    } else {
      CEDAR_CUDA_CHECK(cudaMemsetAsync(out + size_t(r0) * d, 0, sizeof(float) * rows * d, stream()));
    }
  }
}

}  // namespace cedar::cuda::fast
