// CUDA RMSNorm, RoPE/YaRN and mHC (HCMix with Sinkhorn in fp32, collapse, post): the CPU's
// operations in the CPU's order (kernels/cpu/rmsnorm.cpp, rope.cpp, mhc.cpp).
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/internal.cuh"

namespace cedar::cuda {
namespace detail {
namespace {

/// One warp per row; the sum of squares in dot_order. In place allowed.
__global__ void rmsnorm_kernel(const float* x, int m, int d, const float* w, float eps, float* y) {
  cuda::detail::dependent_start();
  const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= m) return;
  const float* xr = x + size_t(r) * d;
  float* yr = y + size_t(r) * d;
  const float mean_sq = warp_dot(xr, xr, d) / float(d);
  const float inv_rms = 1.0f / sqrtf(mean_sq + eps);
  scale_by_weight<8>(xr, yr, d, threadIdx.x & 31, 32, inv_rms, w);
}

constexpr int rope_heads = 8;  ///< heads per block

/// grid (rows, ceil(num_heads / rope_heads)): block (r, g) rotates heads [rope_heads g, +rope_heads)
/// of row r (a decode row's 64 query heads are 8 blocks, not one); cos and sin of each pair in
/// double, rounded once (as the CPU), computed per block into shared memory.
__global__ void rope_kernel(float* x, int num_heads, int head_dim, int rope_dim,
                            const int32_t* positions, rope_table t, bool inverse) {
  cuda::detail::dependent_start();
  __shared__ float cos_s[max_rope_half], sin_s[max_rope_half];
  const int r = blockIdx.x;
  const int half = rope_dim / 2;
  const double pos = double(positions[r]);
  const int h0 = blockIdx.y * rope_heads, heads = min(rope_heads, num_heads - h0);
  for (int i = threadIdx.x; i < half; i += blockDim.x) rope_cos_sin(pos, t.freqs[i], inverse, cos_s[i], sin_s[i]);
  __syncthreads();
  // U pairs a thread at a time, loaded before any is stored (one latency per U pairs)
  constexpr int U = 4;
  const int jobs = heads * half;
  for (int j0 = threadIdx.x; j0 < jobs; j0 += blockDim.x * U) {
    float a[U], b[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int job = j0 + u * int(blockDim.x);
      if (job >= jobs) continue;
      const int h = h0 + job / half, i = job % half;
      const float* v = x + (size_t(r) * num_heads + h) * head_dim + (head_dim - rope_dim);
      a[u] = v[2 * i], b[u] = v[2 * i + 1];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int job = j0 + u * int(blockDim.x);
      if (job >= jobs) continue;
      const int h = h0 + job / half, i = job % half;
      const float c = cos_s[i], s = sin_s[i];
      float* v = x + (size_t(r) * num_heads + h) * head_dim + (head_dim - rope_dim);
      rope_rotate(a[u], b[u], c, s, v + 2 * i);
    }
  }
}

/// Per row (one warp): scale the mix logits by the row's inverse RMS, then pre, post and the
/// Sinkhorn-normalized comb, serially on lane 0 in the CPU's order.
__global__ void hc_finish_kernel(const float* X, int m, int hc, int d, float* mix,
                                 const float* scale, const float* base, int iters, float hc_eps,
                                 float norm_eps, float* pre, float* post, float* comb) {
  cuda::detail::dependent_start();
  const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= m) return;
  const int n_mix = hc * hc + 2 * hc, n_in = hc * d;
  const float* v = X + size_t(r) * n_in;
  const float inv_rms = 1.0f / sqrtf(warp_dot(v, v, n_in) / float(n_in) + norm_eps);
  if ((threadIdx.x & 31) != 0) return;
  float* mr = mix + size_t(r) * n_mix;
  for (int i = 0; i < n_mix; ++i) mr[i] *= inv_rms;
  for (int j = 0; j < hc; ++j) {
    pre[r * hc + j] = sigmoid_f(mr[j] * scale[0] + base[j]) + hc_eps;
    post[r * hc + j] = 2.0f * sigmoid_f(mr[hc + j] * scale[1] + base[hc + j]);
  }
  float* c = comb + size_t(r) * hc * hc;
  for (int i = 0; i < hc * hc; ++i) c[i] = mr[2 * hc + i] * scale[2] + base[2 * hc + i];
  // Sinkhorn: softmax over k + eps, column normalization, then (iters - 1) rounds of rows, columns.
  for (int j = 0; j < hc; ++j) {
    float* row = c + j * hc;
    float mx = row[0];
    for (int k = 1; k < hc; ++k) if (mx < row[k]) mx = row[k];  // std::max_element: first max
    float sum = 0.0f;
    for (int k = 0; k < hc; ++k) sum += row[k] = exp_f(row[k] - mx);
    for (int k = 0; k < hc; ++k) row[k] = row[k] / sum + hc_eps;
  }
  const auto columns = [&] {
    for (int k = 0; k < hc; ++k) {
      float sum = 0.0f;
      for (int j = 0; j < hc; ++j) sum += c[j * hc + k];
      for (int j = 0; j < hc; ++j) c[j * hc + k] /= sum + hc_eps;
    }
  };
  columns();
  for (int it = 1; it < iters; ++it) {
    for (int j = 0; j < hc; ++j) {
      float sum = 0.0f;
      for (int k = 0; k < hc; ++k) sum += c[j * hc + k];
      for (int k = 0; k < hc; ++k) c[j * hc + k] /= sum + hc_eps;
    }
    columns();
  }
}

__global__ void hc_collapse_kernel(const float* X, const float* pre, int m, int hc, int d, float* out) {
  cuda::detail::dependent_start();
  const long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= (long long)m * d) return;
  const int r = int(e / d), i = int(e % d);
  const float* xr = X + size_t(r) * hc * d;
  float s = 0.0f;
  for (int j = 0; j < hc; ++j) s += pre[r * hc + j] * xr[size_t(j) * d + i];
  out[e] = s;
}

constexpr int max_hc = 16;

__global__ void hc_post_kernel(const float* f, const float* X, const float* post, const float* comb,
                               int m, int hc, int d, float* X_out) {
  cuda::detail::dependent_start();
  const long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= (long long)m * d) return;
  const int r = int(e / d), i = int(e % d);
  const float* xr = X + size_t(r) * hc * d;
  float* yr = X_out + size_t(r) * hc * d;
  const float* c = comb + size_t(r) * hc * hc;
  float in[max_hc];
  for (int j = 0; j < hc; ++j) in[j] = xr[size_t(j) * d + i];
  for (int k = 0; k < hc; ++k) {
    float s = 0.0f;
    for (int j = 0; j < hc; ++j) s += c[j * hc + k] * in[j];
    yr[size_t(k) * d + i] = round_bf16(post[r * hc + k] * f[size_t(r) * d + i] + s);
  }
}

}  // namespace

/// The host frequencies, exactly cpu::rope_frequencies.
void rope_frequencies(const cpu::rope_params& p, double* freqs) {
  const int half = p.rope_dim / 2;
  for (int i = 0; i < half; ++i) freqs[i] = std::pow(p.theta, -2.0 * i / p.rope_dim);
  if (!p.yarn) return;
  const double pi = 3.14159265358979323846;
  const auto correction_dim = [&](double rotations) {
    return p.rope_dim * std::log(double(p.original_max_pos) / (rotations * 2.0 * pi)) /
           (2.0 * std::log(p.theta));
  };
  const double low = std::max(std::floor(correction_dim(p.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(p.beta_slow)), double(p.rope_dim - 1));
  if (high == low) high += 0.001;
  for (int i = 0; i < half; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    freqs[i] = freqs[i] / p.yarn_factor * ramp + freqs[i] * (1.0 - ramp);
  }
}

}  // namespace detail

using namespace detail;

void rmsnorm(const float* x, int m, int d, const float* w, float eps, float* y) {
  if (m <= 0) return;
  cuda::detail::launch_dependent(rmsnorm_kernel, dim3(blocks_for(m, 8)), dim3(256), 0, x, m, d, w, eps, y);
}

void rope(float* x, int m, int num_heads, int head_dim, const int32_t* positions,
          const cpu::rope_params& p, bool inverse) {
  CEDAR_CUDA_REQUIRE(p.rope_dim / 2 <= max_rope_half && p.rope_dim <= head_dim, "rope: rope_dim");
  if (m <= 0) return;
  rope_table t{};
  detail::rope_frequencies(p, t.freqs);
  const dim3 grid(unsigned(m), unsigned((num_heads + rope_heads - 1) / rope_heads));
  CEDAR_CUDA_REQUIRE(grid.y <= 65535, "rope: at most 524280 heads");
  cuda::detail::launch_dependent(rope_kernel, grid, dim3(256), 0, x, num_heads, head_dim, p.rope_dim, positions, t,
                                 inverse);
}

void hc_mix(const float* X, int m, int hc, int d, const float* fn, const float* scale,
            const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, float* pre,
            float* post, float* comb) {
  if (m <= 0) return;
  const int n_mix = hc * hc + 2 * hc;
  scratch<float> mix(size_t(m) * n_mix);
  gemm_f32(X, hc * d, m, fn, n_mix, hc * d, mix.get(), n_mix);
  cuda::detail::launch_dependent(hc_finish_kernel, dim3(blocks_for(m, 8)), dim3(256), 0, X, m, hc, d, mix.get(), scale,
                                 base, sinkhorn_iters, hc_eps, norm_eps, pre, post, comb);
}

void hc_collapse(const float* X, const float* pre, int m, int hc, int d, float* out) {
  if (m <= 0) return;
  cuda::detail::launch_dependent(hc_collapse_kernel, dim3(blocks_for((long long)m * d, 256)), dim3(256), 0, X, pre, m,
                                 hc, d, out);
}

void hc_post(const float* f, const float* X, const float* post, const float* comb, int m, int hc,
             int d, float* X_out) {
  CEDAR_CUDA_REQUIRE(hc <= max_hc, "hc_post: hc <= 16");
  if (m <= 0) return;
  cuda::detail::launch_dependent(hc_post_kernel, dim3(blocks_for((long long)m * d, 256)), dim3(256), 0, f, X, post,
                                 comb, m, hc, d, X_out);
}

}  // namespace cedar::cuda
