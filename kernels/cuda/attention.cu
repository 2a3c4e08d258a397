// CUDA sparse MQA with the per-head sink, and the grouped output LoRA (kernels/cpu/attention.cpp):
// one block per (row, head); scores in dot_order, the softmax and the value sum in candidate
// order, so each (row, head) has the CPU's bits.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/internal.cuh"

namespace cedar::cuda {
namespace detail {
namespace {

constexpr int attn_threads = 128;

/// Dynamic shared memory: probs [num_idx] floats, then rows [num_idx] int32.
__global__ void sparse_attention_kernel(const float* q, int num_heads, int dim, const float* kv,
                                        const int32_t* idx, int num_idx, const float* sink,
                                        float scale, float* out) {
  extern __shared__ float smem[];
  float* probs = smem;
  int32_t* rows = reinterpret_cast<int32_t*>(smem + num_idx);
  __shared__ int nc_shared;
  const int r = blockIdx.x / num_heads, h = blockIdx.x % num_heads;
  const int32_t* ir = idx + size_t(r) * num_idx;
  if (threadIdx.x == 0) {
    int nc = 0;
    for (int c = 0; c < num_idx; ++c)
      if (ir[c] >= 0) rows[nc++] = ir[c];
    nc_shared = nc;
  }
  __syncthreads();
  const int nc = nc_shared;
  const float* qh = q + (size_t(r) * num_heads + h) * dim;
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int c = warp; c < nc; c += warps) {
    const float s = warp_dot(qh, kv + size_t(rows[c]) * dim, dim);
    if ((threadIdx.x & 31) == 0) probs[c] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float mx = sink[h];
    for (int c = 0; c < nc; ++c) mx = std_max(mx, probs[c] *= scale);
    float denom = exp_f(sink[h] - mx);
    for (int c = 0; c < nc; ++c) denom += (probs[c] = exp_f(probs[c] - mx));
    const float inv = 1.0f / denom;
    for (int c = 0; c < nc; ++c) probs[c] *= inv;
  }
  __syncthreads();
  float* o = out + (size_t(r) * num_heads + h) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int c = 0; c < nc; ++c) acc += probs[c] * kv[size_t(rows[c]) * dim + i];
    o[i] = acc;
  }
}

}  // namespace
}  // namespace detail

using namespace detail;

void sparse_attention(const float* q, int m, int num_heads, int dim, const float* kv,
                      const int32_t* idx, int num_idx, const float* sink, float scale, float* out) {
  if (m <= 0 || num_heads <= 0) return;
  const size_t smem = size_t(num_idx) * (sizeof(float) + sizeof(int32_t));
  if (smem > 48 * 1024)
    CEDAR_CUDA_CHECK(cudaFuncSetAttribute(sparse_attention_kernel,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  sparse_attention_kernel<<<unsigned(m) * num_heads, attn_threads, smem, stream()>>>(
      q, num_heads, dim, kv, idx, num_idx, sink, scale, out);
  CEDAR_CUDA_LAUNCHED();
}

void grouped_output(const float* o, int m, int groups, const bf16_weight& wo_a,
                    const fp8_weight& wo_b, float* out) {
  CEDAR_CUDA_REQUIRE(groups > 0 && wo_a.out % groups == 0, "wo_a rows split into groups");
  CEDAR_CUDA_REQUIRE(wo_b.in == wo_a.out, "wo_b takes concat(u)");
  if (m <= 0) return;
  const int rank = wo_a.out / groups, group_in = wo_a.in;
  scratch<float> u(size_t(m) * wo_a.out);
  for (int g = 0; g < groups; ++g) {
    const bf16_weight block{rank, group_in, wo_a.data + size_t(g) * rank * group_in};
    // rows of o_g are o[r, g*group_in ...] (stride groups*group_in); u_g lands in u[r, g*rank ...]
    gemm_bf16(o + size_t(g) * group_in, groups * group_in, m, block, u.get() + size_t(g) * rank,
              wo_a.out);
  }
  linear_fp8(u.get(), m, wo_b, out);
}

}  // namespace cedar::cuda
