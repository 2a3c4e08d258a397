// CUDA Engram block, embedding lookup and greedy argmax (kernels/cpu/engram.cpp, embed.cpp,
// actors/sampler.cpp's greedy rule). The Engram gate's sums run serially in the CPU's order.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/internal.cuh"

namespace cedar::cuda {
namespace detail {
namespace {

/// emb [m * rows_per_token, head_dim] = dequantized table rows (row ids checked on the host side
/// of the CPU op; here an out-of-range id traps).
__global__ void gather_kernel(const uint8_t* table, const uint8_t* table_scale, int64_t num_rows,
                              int head_dim, const int64_t* rows, long long n, float* emb) {
  cuda::detail::dependent_start();
  const long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= n * head_dim) return;
  const long long i = e / head_dim;
  const int c = int(e % head_dim);
  const int64_t row = rows[i];
  if (row < 0 || row >= num_rows) __trap();
  emb[e] = e4m3_to_f32(table[row * head_dim + c]) * ue8m0_to_f32(table_scale[row * (head_dim / 32) + c / 32]);
}

/// One block per (row, copy): the gate from serial sums (thread 0), then every channel updated.
__global__ void gate_kernel(float* X, int hc, int d, const float* kv, const float* q_weight,
                            const float* k_weight, float eps) {
  cuda::detail::dependent_start();
  __shared__ float gate_shared;
  const long long rh = blockIdx.x;
  const long long r = rh / hc;
  const int h = int(rh % hc);
  float* x = X + rh * d;
  const float* kv_r = kv + r * (hc + 1) * d;
  const float* key = kv_r + size_t(h) * d;
  const float* value = kv_r + size_t(hc) * d;
  if (threadIdx.x == 0) {
    const float* qw = q_weight + size_t(h) * d;
    const float* kw = k_weight + size_t(h) * d;
    float dot = 0.0f, sx = 0.0f, sk = 0.0f;
    for (int c = 0; c < d; ++c) dot += x[c] * (qw[c] * kw[c]) * key[c];
    for (int c = 0; c < d; ++c) sx += x[c] * x[c];
    for (int c = 0; c < d; ++c) sk += key[c] * key[c];
    const float ms_x = sx / float(d), ms_k = sk / float(d);
    dot = dot * (1.0f / sqrtf(ms_x + eps)) * (1.0f / sqrtf(ms_k + eps)) / sqrtf(float(d));
    const float sign = dot > 0.0f ? 1.0f : (dot < 0.0f ? -1.0f : 0.0f);
    const float z = sign * sqrtf(std_max(fabsf(dot), 1e-6f));
    gate_shared = 1.0f / (1.0f + exp_f(-z));
  }
  __syncthreads();
  const float gate = gate_shared;
  for (int c = threadIdx.x; c < d; c += blockDim.x) x[c] = round_bf16(x[c] + gate * value[c]);
}

__global__ void embed_kernel(const int32_t* tokens, long long m, const uint16_t* table, int vocab,
                             int d, float* out) {
  cuda::detail::dependent_start();
  const long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= m * d) return;
  const int t = tokens[e / d];
  if (t < 0 || t >= vocab) __trap();
  out[e] = bf16_to_f32(table[size_t(t) * d + e % d]);
}

/// One block per row: the highest logit, ties to the lowest id.
__global__ void argmax_kernel(const float* logits, int vocab, int32_t* out) {
  cuda::detail::dependent_start();
  __shared__ float best_v[256];
  __shared__ int best_i[256];
  const float* l = logits + size_t(blockIdx.x) * vocab;
  float bv = 0.0f;
  int bi = -1;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x)
    if (bi < 0 || l[j] > bv) bv = l[j], bi = j;
  best_v[threadIdx.x] = bv;
  best_i[threadIdx.x] = bi;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const float ov = best_v[threadIdx.x + half];
      const int oi = best_i[threadIdx.x + half];
      const int mi = best_i[threadIdx.x];
      if (oi >= 0 && (mi < 0 || ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < mi))) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = best_i[0];
}

}  // namespace
}  // namespace detail

using namespace detail;

namespace detail {

void engram_gather(const cpu::engram_weights& w, const int64_t* rows, long long n, float* emb) {
  if (n <= 0) return;
  cuda::detail::launch_dependent(gather_kernel, dim3(blocks_for(n * w.head_dim, 256)), dim3(256), 0, w.table,
                                 w.table_scale, w.num_rows, w.head_dim, rows, n, emb);
}

}  // namespace detail

void engram(float* X, int m, int hc, int d, const int64_t* rows, int rows_per_token,
            const cpu::engram_weights& w, float eps) {
  const long long flat = (long long)rows_per_token * w.head_dim;
  CEDAR_CUDA_REQUIRE(w.head_dim % 32 == 0, "head_dim is whole UE8M0 groups");
  CEDAR_CUDA_REQUIRE(w.wkv.in == flat && w.wkv.out == (hc + 1) * d, "wkv shape");
  if (m <= 0) return;
  scratch<float> emb(size_t(m) * flat), kv(size_t(m) * (hc + 1) * d);
  engram_gather(w, rows, (long long)m * rows_per_token, emb.get());
  linear_fp8(emb.get(), m, w.wkv, kv.get());
  cuda::detail::launch_dependent(gate_kernel, dim3(unsigned(m) * hc), dim3(256), 0, X, hc, d, kv.get(), w.q_weight,
                                 w.k_weight, eps);
}

void embed(const int32_t* tokens, int m, const bf16_weight& table, float* out) {
  if (m <= 0) return;
  cuda::detail::launch_dependent(embed_kernel, dim3(blocks_for((long long)m * table.in, 256)), dim3(256), 0, tokens, m,
                                 table.data, table.out, table.in, out);
}

void argmax_rows(const float* logits, int m, int vocab, int32_t* out) {
  if (m <= 0) return;
  cuda::detail::launch_dependent(argmax_kernel, dim3(m), dim3(256), 0, logits, vocab, out);
}

}  // namespace cedar::cuda
