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
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= d) return;
  tail[c] = a_last[c];
  tail[d + c] = g_last[c];
}

}  // namespace
}  // namespace detail

using namespace detail;

int compress_ratio2(const float* x, int m, int64_t first_pos, const bf16_weight& wkv,
                    const bf16_weight& wgate, const float* norm, float eps, float* tail,
                    float* latents) {
  CEDAR_CUDA_REQUIRE(wkv.out == wgate.out && wkv.in == wgate.in, "wkv and wgate shapes agree");
  CEDAR_CUDA_REQUIRE(first_pos >= 0 && m >= 0, "positions are non-negative");
  if (m == 0) return 0;
  const int d = wkv.out;
  scratch<float> a(size_t(m) * d), g(size_t(m) * d);
  linear_bf16(x, m, wkv, a.get());
  linear_bf16(x, m, wgate, g.get());
  const int t0 = first_pos % 2 == 1 ? 0 : 1;
  const int num_latents = t0 < m ? (m - t0 + 1) / 2 : 0;
  if (num_latents > 0) {
    merge_pairs_kernel<<<blocks_for((long long)num_latents * d, 256), 256, 0, stream()>>>(
        a.get(), g.get(), tail, d, t0, num_latents, latents);
    CEDAR_CUDA_LAUNCHED();
  }
  if ((first_pos + m - 1) % 2 == 0) {  // the last pair completes in a later call
    save_tail_kernel<<<blocks_for(d, 256), 256, 0, stream()>>>(a.get() + size_t(m - 1) * d,
                                                               g.get() + size_t(m - 1) * d, d, tail);
    CEDAR_CUDA_LAUNCHED();
  }
  rmsnorm(latents, num_latents, d, norm, eps, latents);
  return num_latents;
}

void compress_ratio1(const float* x, int m, const bf16_weight& wkv, const float* norm, float eps,
                     float* latents) {
  linear_bf16(x, m, wkv, latents);
  rmsnorm(latents, m, wkv.out, norm, eps, latents);
}

}  // namespace cedar::cuda
