// Device-side steps of the GPU forward pass that are not model ops of their own: KV records at
// scattered addresses (ring slots, page entries), the stream expansion, attention candidate
// rows, score masking, scaling and reductions.
#include <cmath>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace cedar::cuda {
namespace detail {
namespace {

/// One thread per group: quantize (formats.cpp rules) and pack into the row's record.
__global__ void store_records_kernel(record_kind kind, const float* x, int m, int d, uint8_t* const* dst) {
  cuda::detail::dependent_start();
  const int G = kind == record_kind::fp4_e4m3 ? 16 : 32;
  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const int groups = d / G;
  if (t >= (long long)m * groups) return;
  const int r = int(t / groups), g = int(t % groups);
  const float* xg = x + size_t(r) * d + g * G;
  uint8_t* rec = dst[r];
  const float amax = group_amax(xg, G);
  if (kind == record_kind::fp8) {
    const float s = fp8_group_scale(amax);
    for (int i = 0; i < G; ++i) rec[g * G + i] = f32_to_e4m3(clampf(xg[i] / s, -448.0f, 448.0f));
    rec[d + g] = pow2_code(s);
    return;
  }
  float s;
  if (kind == record_kind::fp4_pow2) {
    s = fp4_pow2_scale(amax);
    rec[d / 2 + g] = pow2_code(s);
  } else {
    const uint8_t code = f32_to_e4m3(fmaxf(amax, 6.0f * 0x1p-9f) / 6.0f);
    s = e4m3_to_f32(code);
    rec[d / 2 + g] = code;
  }
  for (int i = 0; i < G; i += 2) {
    const uint8_t c0 = f32_to_e2m1(xg[i] / s), c1 = f32_to_e2m1(xg[i + 1] / s);
    rec[(g * G + i) / 2] = uint8_t((c0 & 0xF) | ((c1 & 0xF) << 4));
  }
}

__global__ void load_records_kernel(record_kind kind, const uint8_t* const* src, int m, int d, float* x) {
  cuda::detail::dependent_start();
  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (t >= (long long)m * d) return;
  const int r = int(t / d), i = int(t % d);
  const uint8_t* rec = src[r];
  if (kind == record_kind::fp8) {
    x[t] = e4m3_to_f32(rec[i]) * ue8m0_to_f32(rec[d + i / 32]);
  } else {
    const uint8_t code = (rec[i / 2] >> (4 * (i & 1))) & 0xF;
    const float s = kind == record_kind::fp4_pow2 ? ue8m0_to_f32(rec[d / 2 + i / 32]) : e4m3_to_f32(rec[d / 2 + i / 16]);
    x[t] = e2m1_to_f32(code) * s;
  }
}

__global__ void hc_expand_kernel(const float* e, int m, int hc, int d, float* X, float* pre) {
  cuda::detail::dependent_start();
  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (t >= (long long)m * hc * d) return;
  const long long r = t / (hc * d);
  const int c = int(t % d);
  X[t] = e[r * d + c];
  if (c == 0) {
    const int h = int(t / d % hc);
    pre[r * hc + h] = h == 0 ? 1.0f : 0.0f;
  }
}

__global__ void candidates_kernel(const int32_t* topk, int T, int K, int W, int64_t p0, int64_t floor_pos,
                                  int64_t ring_lo, int num_window, int32_t* idx) {
  cuda::detail::dependent_start();
  const int t = blockIdx.x;
  int32_t* row = idx + size_t(t) * (W + K);
  const int64_t i = p0 + t;
  const int64_t lo = max(floor_pos, i - (W - 1));
  for (int c = threadIdx.x; c < W; c += blockDim.x) {
    const int64_t p = lo + c;
    row[c] = p <= i ? int32_t(p - ring_lo) : -1;
  }
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    const int32_t j = topk[size_t(t) * K + k];
    row[W + k] = j < 0 ? -1 : num_window + j;
  }
}

__global__ void mask_scores_kernel(float* scores, int m, int n, int block, const uint8_t* mask, int nb) {
  cuda::detail::dependent_start();
  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (t >= (long long)m * n) return;
  const int r = int(t / n), j = int(t % n);
  if (!mask[size_t(r) * nb + j / block]) scores[t] = -__builtin_huge_valf();
}

__global__ void scale_kernel(float* x, size_t n, float s) {
  cuda::detail::dependent_start();
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) x[i] *= s;
}

__global__ void max_abs_kernel(const float* x, size_t n, unsigned* out) {
  unsigned best = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const unsigned bits = isfinite(v) ? __float_as_uint(fabsf(v)) : 0x7F800000u;
    best = max(best, bits);
  }
  atomicMax(out, best);
}

}  // namespace
}  // namespace detail

using namespace detail;

void store_records(record_kind kind, const float* x, int m, int d, uint8_t* const* dst) {
  CEDAR_CUDA_REQUIRE(d % 32 == 0, "record length is a multiple of 32");
  const long long n = (long long)m * (d / (kind == record_kind::fp4_e4m3 ? 16 : 32));
  if (n == 0) return;
  cuda::detail::launch_dependent(store_records_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, kind, x, m, d, dst);
}

void load_records(record_kind kind, const uint8_t* const* src, int m, int d, float* x) {
  const long long n = (long long)m * d;
  if (n == 0) return;
  cuda::detail::launch_dependent(load_records_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, kind, src, m, d, x);
}

void hc_expand(const float* e, int m, int hc, int d, float* X, float* pre) {
  const long long n = (long long)m * hc * d;
  if (n == 0) return;
  cuda::detail::launch_dependent(hc_expand_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, e, m, hc, d, X, pre);
}

void attention_candidates(const int32_t* topk, int T, int K, int W, int64_t p0, int64_t floor_pos,
                          int64_t ring_lo, int num_window, int32_t* idx) {
  if (T <= 0) return;
  CEDAR_CUDA_REQUIRE(K == 0 || topk != nullptr, "top-k rows for K > 0");
  cuda::detail::launch_dependent(candidates_kernel, dim3(T), dim3(128), 0, topk, T, K, W, p0, floor_pos, ring_lo,
                                 num_window, idx);
}

void mask_scores(float* scores, int m, int n, int block, const uint8_t* mask, int nb) {
  const long long t = (long long)m * n;
  if (t == 0) return;
  cuda::detail::launch_dependent(mask_scores_kernel, dim3(blocks_for(t, 256)), dim3(256), 0, scores, m, n, block, mask,
                                 nb);
}

void scale_values(float* x, std::size_t n, float s) {
  if (n == 0) return;
  cuda::detail::launch_dependent(scale_kernel, dim3(blocks_for((long long)n, 256)), dim3(256), 0, x, n, s);
}

void copy_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  CEDAR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}

float max_abs(const float* x, std::size_t n) {
  scratch<unsigned> out(1);
  CEDAR_CUDA_CHECK(cudaMemsetAsync(out.get(), 0, sizeof(unsigned), stream()));
  if (n > 0) {
    max_abs_kernel<<<264, 256, 0, stream()>>>(x, n, out.get());
    CEDAR_CUDA_LAUNCHED();
  }
  unsigned bits = 0;
  CEDAR_CUDA_CHECK(cudaMemcpyAsync(&bits, out.get(), sizeof bits, cudaMemcpyDeviceToHost, stream()));
  CEDAR_CUDA_CHECK(cudaStreamSynchronize(stream()));
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

}  // namespace cedar::cuda
