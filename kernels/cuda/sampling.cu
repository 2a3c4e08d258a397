// CUDA token sampling (cuda_ops.hpp sample_rows), the rules of actors/sampler.cpp on the device:
// a full radix sort of each row by (logit desc, id asc), then one thread walks the sorted ids in
// the sampler's order with the same double arithmetic, so the chosen token is the host's.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace cedar::cuda {
namespace detail {
namespace {

/// Larger key = better: logit order (-0 as +0), then the lower id.
__device__ __forceinline__ unsigned long long order_key(float v, int id) {
  if (v == 0.0f) v = 0.0f;
  uint32_t u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(u) << 32) | uint32_t(~uint32_t(id));
}

__global__ void keys_kernel(const float* l, int vocab, unsigned long long* keys, int32_t* ids) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= vocab) return;
  keys[i] = order_key(l[i], i);
  ids[i] = i;
}

/// One thread: the draw over the sorted ids, then the log-softmax of the chosen logit.
__global__ void draw_kernel(const float* l, int vocab, const int32_t* ids, sample_request p, double* prob,
                            int32_t* token, float* logprob) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int32_t chosen;
  if (p.temperature == 0.f) {
    chosen = ids[0];
  } else {
    const int k = p.top_k > 0 ? min(p.top_k, vocab) : vocab;
    const double t = p.temperature;  // in double, as on the host (a tiny temperature)
    const double mx = l[ids[0]] / t;
    double total = 0;
    for (int i = 0; i < k; ++i) total += prob[i] = exp(l[ids[i]] / t - mx);
    int n = k;
    if (p.top_p < 1.f) {
      double cum = 0;
      for (int i = 0; i < k; ++i)
        if ((cum += prob[i] / total) >= p.top_p) {
          n = i + 1;
          break;
        }
      total = 0;
      for (int i = 0; i < n; ++i) total += prob[i];
    }
    const uint64_t r = splitmix64(splitmix64(p.seed) ^ uint64_t(p.token_idx));
    const double u = double(r >> 11) * (1.0 / 9007199254740992.0) * total;
    double cum = 0;
    chosen = ids[n - 1];
    for (int i = 0; i < n; ++i)
      if ((cum += prob[i]) > u) {
        chosen = ids[i];
        break;
      }
  }
  float mxf = l[0];
  for (int i = 1; i < vocab; ++i) mxf = std_max(mxf, l[i]);
  double s = 0;
  for (int i = 0; i < vocab; ++i) s += exp(double(l[i]) - mxf);
  const double lse = mxf + log(s);
  *token = chosen;
  *logprob = float(l[chosen] - lse);
}

}  // namespace
}  // namespace detail

using namespace detail;

void sample_rows(const float* logits, int m, int vocab, const sample_request* requests, int32_t* tokens,
                 float* logprobs) {
  if (m <= 0 || vocab <= 0) return;
  scratch<unsigned long long> keys(vocab), keys_sorted(vocab);
  scratch<int32_t> ids(vocab), ids_sorted(vocab);
  scratch<double> prob(vocab);
  std::size_t temp_bytes = 0;
  CEDAR_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(nullptr, temp_bytes, keys.get(), keys_sorted.get(),
                                                             ids.get(), ids_sorted.get(), vocab, 0, 64, stream()));
  scratch<uint8_t> temp(temp_bytes);
  for (int r = 0; r < m; ++r) {
    const float* l = logits + size_t(r) * vocab;
    keys_kernel<<<blocks_for(vocab, 256), 256, 0, stream()>>>(l, vocab, keys.get(), ids.get());
    CEDAR_CUDA_LAUNCHED();
    CEDAR_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(temp.get(), temp_bytes, keys.get(), keys_sorted.get(),
                                                               ids.get(), ids_sorted.get(), vocab, 0, 64, stream()));
    draw_kernel<<<1, 32, 0, stream()>>>(l, vocab, ids_sorted.get(), requests[r], prob.get(), tokens + r,
                                        logprobs + r);
    CEDAR_CUDA_LAUNCHED();
  }
}

}  // namespace cedar::cuda
