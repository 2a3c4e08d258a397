// CUDA KV compressors (kernels/cpu/compressor.cpp): ratio 2 merges each pair (2j, 2j+1) by the
// per-channel pair softmax, with the even token of a pair cut by the chunk end parked in
// `tail`; ratio 1 normalizes each projection. The latent count is known on the host.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/internal.cuh"

namespace cedar::cuda {
namespace detail {
namespace {

/// latent i is the pair ending at t = t0 + 2i (t0 = first odd position's offset).
__global__ void merge_pairs_kernel(const float* a, const float* g, const float* tail, int d,
                                   int t0, int num_latents, float* latents) {
  cuda::detail::dependent_start();
  const long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= (long long)num_latents * d) return;
  const int i = int(e / d), c = int(e % d);
  const int t = t0 + 2 * i;
  const float* a_t = a + size_t(t) * d;
  const float* g_t = g + size_t(t) * d;
  const float* a_prev = t > 0 ? a_t - d : tail;
  const float* g_prev = t > 0 ? g_t - d : tail + d;
  latents[e] = sigmoid_f(g_prev[c] - g_t[c]) * a_prev[c] + sigmoid_f(g_t[c] - g_prev[c]) * a_t[c];
}

__global__ void save_tail_kernel(const float* a_last, const float* g_last, int d, float* tail) {
  cuda::detail::dependent_start();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= d) return;
  tail[c] = a_last[c];
  tail[d + c] = g_last[c];
}

/// The pair of row rows[i] (odd position) and its item's parked even token tails[i]: the same
/// sum as merge_pairs_kernel's at t = 0.
__global__ void merge_rows_kernel(const float* a, const float* g, int d, const int32_t* rows,
                                  float* const* tails, int num, float* latents) {
  cuda::detail::dependent_start();
  const long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= (long long)num * d) return;
  const int i = int(e / d), c = int(e % d);
  const float* a_t = a + size_t(rows[i]) * d;
  const float* g_t = g + size_t(rows[i]) * d;
  const float* a_prev = tails[i];
  const float* g_prev = tails[i] + d;
  latents[e] = sigmoid_f(g_prev[c] - g_t[c]) * a_prev[c] + sigmoid_f(g_t[c] - g_prev[c]) * a_t[c];
}

__global__ void save_rows_kernel(const float* a, const float* g, int d, const int32_t* rows, float* const* tails,
                                 int num) {
  cuda::detail::dependent_start();
  const long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= (long long)num * d) return;
  const int i = int(e / d), c = int(e % d);
  tails[i][c] = a[size_t(rows[i]) * d + c];
  tails[i][d + c] = g[size_t(rows[i]) * d + c];
}

}  // namespace
}  // namespace detail

using namespace detail;

void compress_ratio2_rows(const float* x, int m, const bf16_weight& wkv, const bf16_weight& wgate, const float* norm,
                          float eps, const int32_t* merge_rows, float* const* merge_tails, int num_merge,
                          const int32_t* save_rows, float* const* save_tails, int num_save, float* latents,
                          bf16_linear_fn linear) {
  CEDAR_CUDA_REQUIRE(wkv.out == wgate.out && wkv.in == wgate.in, "wkv and wgate shapes agree");
  if (m <= 0) return;
  const int d = wkv.out;
  scratch<float> a(size_t(m) * d), g(size_t(m) * d);
  linear(x, m, wkv, a.get());
  linear(x, m, wgate, g.get());
  if (num_merge > 0) {
    cuda::detail::launch_dependent(merge_rows_kernel, dim3(blocks_for((long long)num_merge * d, 256)), dim3(256), 0,
                                   a.get(), g.get(), d, merge_rows, merge_tails, num_merge, latents);
  }
  if (num_save > 0) {
    cuda::detail::launch_dependent(save_rows_kernel, dim3(blocks_for((long long)num_save * d, 256)), dim3(256), 0,
                                   a.get(), g.get(), d, save_rows, save_tails, num_save);
  }
  rmsnorm(latents, num_merge, d, norm, eps, latents);
}

int compress_ratio2(const float* x, int m, int64_t first_pos, const bf16_weight& wkv,
                    const bf16_weight& wgate, const float* norm, float eps, float* tail,
                    float* latents, bf16_linear_fn linear) {
  CEDAR_CUDA_REQUIRE(wkv.out == wgate.out && wkv.in == wgate.in, "wkv and wgate shapes agree");
  CEDAR_CUDA_REQUIRE(first_pos >= 0 && m >= 0, "positions are non-negative");
  if (m == 0) return 0;
  const int d = wkv.out;
  scratch<float> a(size_t(m) * d), g(size_t(m) * d);
  linear(x, m, wkv, a.get());
  linear(x, m, wgate, g.get());
  const int t0 = first_pos % 2 == 1 ? 0 : 1;
  const int num_latents = t0 < m ? (m - t0 + 1) / 2 : 0;
  if (num_latents > 0) {
    cuda::detail::launch_dependent(merge_pairs_kernel, dim3(blocks_for((long long)num_latents * d, 256)), dim3(256), 0,
                                   a.get(), g.get(), tail, d, t0, num_latents, latents);
  }
  if ((first_pos + m - 1) % 2 == 0) {  // the last pair completes in a later call
    cuda::detail::launch_dependent(save_tail_kernel, dim3(blocks_for(d, 256)), dim3(256), 0,
                                   a.get() + size_t(m - 1) * d, g.get() + size_t(m - 1) * d, d, tail);
  }
  rmsnorm(latents, num_latents, d, norm, eps, latents);
  return num_latents;
}

void compress_ratio1(const float* x, int m, const bf16_weight& wkv, const float* norm, float eps,
                     float* latents, bf16_linear_fn linear) {
  linear(x, m, wkv, latents);
  rmsnorm(latents, m, wkv.out, norm, eps, latents);
}

}  // namespace cedar::cuda
