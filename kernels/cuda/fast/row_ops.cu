// finish_rows (layer_ops.hpp): the chain a decode row goes through between two linear layers
// (RMSNorm, RoPE, FP8 fake quantization, the ring record, the next linear's activation codes) in
// one launch, a block per row, with each step's own arithmetic: the bits of the separate ops;
// more blocks of the launch can rotate the row's query heads, or run a second chain of the
// same rows (finish_rows_pair).
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fast/layer_ops.hpp"
#include "kernels/cuda/internal.cuh"

namespace cedar::cuda::fast {
namespace {

using cuda::detail::clampf;
using cuda::detail::fp8_group_scale;
using cuda::detail::rope_table;

constexpr int finish_threads = 256;
constexpr int finish_max_dim = 8192;  ///< the row lives in shared memory (32 KB)

/// Heads of row_finish::rotate a block rotates.
constexpr int rotate_heads_per_block = 8;

/// One chain's block yb of row r = blockIdx.x (finish_threads threads, d floats of dynamic shared
/// memory): yb 0 runs row r's chain, yb > 0 rotates heads [8 (yb - 1), +8) of row r of a.rotate
/// (cuda::rope's rope_kernel, the same cos and sin). a.rope is the host's table, not read here:
/// its frequencies come in t, its rope_dim as rope_dim. VPT: positions a thread holds (d <= VPT
/// finish_threads), as few as the row needs: every block of the launch takes the registers, and
/// a prefill launches one per row.
template <int VPT>
__device__ __forceinline__ void finish_block(const float* x, int d, const row_finish& a, int rope_dim,
                                             const rope_table& t, float* y, int yb) {
  extern __shared__ float row[];
  __shared__ float cos_s[cuda::detail::max_rope_half], sin_s[cuda::detail::max_rope_half];
  __shared__ float inv_rms;
  const int r = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = finish_threads / 32;
  const int half = rope_dim / 2;
  // the row chain's values a thread holds, positions tid + k finish_threads: the norm weight
  // (no kernel writes it) loaded before the wait, x right after it and before the RoPE angles,
  // so that the block waits one memory latency for each, not one per position
  const bool chain = yb == 0;
  float xv[VPT], wv[VPT];
  if (chain && a.norm_w)
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int i = tid + k * finish_threads;
      wv[k] = i < d ? a.norm_w[i] : 0.0f;
    }
  cuda::detail::dependent_start();
  const float* xr = x + size_t(r) * d;
  if (chain)
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int i = tid + k * finish_threads;
      xv[k] = i < d ? xr[i] : 0.0f;
    }
  if (a.positions)
    for (int i = tid; i < half; i += finish_threads) {
      cuda::detail::rope_cos_sin(double(a.positions[r]), t.freqs[i], false, cos_s[i], sin_s[i]);
      if (a.rope_cs && yb == 0)
        a.rope_cs[size_t(r) * rope_dim + i] = cos_s[i], a.rope_cs[size_t(r) * rope_dim + half + i] = sin_s[i];
    }
  if (yb > 0) {
    const int h0 = (yb - 1) * rotate_heads_per_block;
    const int heads = min(rotate_heads_per_block, a.rotate_heads - h0), hd = a.rotate_head_dim;
    __syncthreads();
    constexpr int U = 4;  // U pairs a thread, loaded before any is stored
    for (int j0 = tid; j0 < heads * half; j0 += finish_threads * U) {
      float pa[U], pb[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int job = j0 + u * finish_threads;
        if (job >= heads * half) continue;
        const float* v = a.rotate + (size_t(r) * a.rotate_heads + h0 + job / half) * hd + (hd - rope_dim);
        pa[u] = v[2 * (job % half)], pb[u] = v[2 * (job % half) + 1];
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int job = j0 + u * finish_threads;
        if (job >= heads * half) continue;
        const int i = job % half;
        float* v = a.rotate + (size_t(r) * a.rotate_heads + h0 + job / half) * hd + (hd - rope_dim);
        cuda::detail::rope_rotate(pa[u], pb[u], cos_s[i], sin_s[i], v + 2 * i);
      }
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < VPT; ++k)
    if (tid + k * finish_threads < d) row[tid + k * finish_threads] = xv[k];
  __syncthreads();
  if (a.norm_w) {  // cuda::rmsnorm: the sum of squares by one warp in dot_order
    if (warp == 0) {
      const float mean_sq = cuda::detail::warp_dot(row, row, d) / float(d);
      if (lane == 0) inv_rms = 1.0f / sqrtf(mean_sq + a.eps);
    }
    __syncthreads();
    const float inv = inv_rms;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (tid + k * finish_threads < d) row[tid + k * finish_threads] = (xv[k] * inv) * wv[k];
    __syncthreads();
  }
  if (a.positions) {  // cuda::rope of one head of d, the last rope_dim values
    float* v = row + (d - rope_dim);
    for (int i = tid; i < half; i += finish_threads)
      cuda::detail::rope_rotate(v[2 * i], v[2 * i + 1], cos_s[i], sin_s[i], v + 2 * i);
    __syncthreads();
  }
  // groups of 32, a warp each
  float* yr = y + size_t(r) * d;
  for (int g = warp; g < d / 32; g += warps) {
    const int i = g * 32 + lane;
    float v = row[i];
    if (a.fake_fp8) {  // cuda::fake_quant_fp8_rows
      const float s = fp8_group_scale(cuda::detail::group_amax_lanes<32>(v));
      v = cuda::detail::round_to_e4m3(clampf(v / s, -448.0f, 448.0f)) * s;
    }
    if (a.record) {  // cuda::pack_fp8_rows: codes [d], then a UE8M0 scale per 32
      const float s = fp8_group_scale(cuda::detail::group_amax_lanes<32>(v));
      uint8_t* rec = a.record + size_t(r) * (d + d / 32);
      rec[i] = cuda::detail::f32_to_e4m3(clampf(v / s, -448.0f, 448.0f));
      if (lane == 0) rec[d + g] = cuda::detail::pow2_code(s);
    }
    if (a.codes) {  // quantize_rows_fp8
      const float s = cuda::detail::fp8_group_code(v, a.codes[size_t(r) * d + i]);
      if (lane == 0) a.scales[size_t(r) * (d / 32) + g] = s;
    }
    yr[i] = v;
  }
}

/// grid (m, 1 + ceil(a.rotate_heads / 8) + (x1 ? 1 : 0)): the blocks of finish_block for chain
/// (x, d, a) of every row, then, when x1 is set, the last block y runs a second chain (x1, d1,
/// a1) of the same row, which rotates nothing.
template <int VPT>
__global__ void __launch_bounds__(finish_threads)
    finish_kernel(const float* x, int d, row_finish a, int rope_dim, rope_table t, float* y, const float* x1, int d1,
                  row_finish a1, int rope_dim1, rope_table t1, float* y1) {
  if (x1 != nullptr && blockIdx.y == gridDim.y - 1) finish_block<VPT>(x1, d1, a1, rope_dim1, t1, y1, 0);
  else finish_block<VPT>(x, d, a, rope_dim, t, y, int(blockIdx.y));
}

/// A chain's checks, and its RoPE constants (rope_dim 0 and no table without positions).
int prepare_chain(int d, const row_finish& f, rope_table& t) {
  CEDAR_CUDA_REQUIRE(d % 32 == 0 && d <= finish_max_dim, "finish_rows: d a multiple of 32, at most 8192");
  CEDAR_CUDA_REQUIRE((f.codes == nullptr) == (f.scales == nullptr), "finish_rows: codes and scales together");
  CEDAR_CUDA_REQUIRE(f.rope_cs == nullptr || f.positions != nullptr, "finish_rows: rope_cs needs positions");
  CEDAR_CUDA_REQUIRE(f.rotate == nullptr || (f.positions != nullptr && f.rope->rope_dim <= f.rotate_head_dim),
                     "finish_rows: rotate needs positions and rope_dim <= its head_dim");
  t = rope_table{};
  if (!f.positions) return 0;
  CEDAR_CUDA_REQUIRE(f.rope && f.rope->rope_dim % 2 == 0 && f.rope->rope_dim / 2 <= cuda::detail::max_rope_half &&
                         f.rope->rope_dim <= d,
                     "finish_rows: rope_dim");
  cuda::detail::rope_frequencies(*f.rope, t.freqs);
  return f.rope->rope_dim;
}

/// finish_rows, with a second chain of the same rows in the same launch when x1 is set.
void launch_finish(const float* x, int m, int d, const row_finish& f, float* y, const float* x1, int d1,
                   const row_finish& f1, float* y1) {
  rope_table t, t1;
  const int rope_dim = prepare_chain(d, f, t), rope_dim1 = x1 ? prepare_chain(d1, f1, t1) : 0;
  CEDAR_CUDA_REQUIRE(x1 == nullptr || f1.rotate == nullptr, "finish_rows_pair: the second chain rotates nothing");
  if (m <= 0) return;
  const int rotate_blocks = f.rotate ? (f.rotate_heads + rotate_heads_per_block - 1) / rotate_heads_per_block : 0;
  const int width = x1 ? std::max(d, d1) : d;
  const auto launch = [&](auto kernel) {
    cuda::detail::launch_dependent(kernel, dim3(unsigned(m), unsigned(1 + rotate_blocks + (x1 ? 1 : 0))),
                                   dim3(finish_threads), sizeof(float) * width, x, d, f, rope_dim, t, y, x1, d1, f1,
                                   rope_dim1, t1, y1);
  };
  if (width <= 2 * finish_threads) launch(finish_kernel<2>);
  else if (width <= 8 * finish_threads) launch(finish_kernel<8>);
  else launch(finish_kernel<finish_max_dim / finish_threads>);
}

}  // namespace

void finish_rows(const float* x, int m, int d, const row_finish& f, float* y) {
  launch_finish(x, m, d, f, y, nullptr, 0, row_finish{}, nullptr);
}

void finish_rows_pair(int m, const float* x0, int d0, const row_finish& f0, float* y0, const float* x1, int d1,
                      const row_finish& f1, float* y1) {
  CEDAR_CUDA_REQUIRE(x1 != nullptr, "finish_rows_pair: a second chain");
  launch_finish(x0, m, d0, f0, y0, x1, d1, f1, y1);
}

}  // namespace cedar::cuda::fast
