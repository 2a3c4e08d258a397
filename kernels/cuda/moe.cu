// CUDA MoE (kernels/cpu/moe.cpp): sqrt-softplus routing (ties to the lowest expert), the clamped
// SwiGLU experts, and moe_ffn with a device-side permutation: slots are grouped by expert in
// tiles of 4 (one weight decode shared by the tile), every slot's dots in dot_order, and each
// row's outputs summed in its top-k order, then the shared expert, as on the CPU.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/internal.cuh"

namespace cedar::cuda {
namespace detail {
namespace {

constexpr int max_experts = 1024;

__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1p_f(exp_f(x)); }

/// One thread per row: s = sqrt(softplus(logit)) in place, then top-k by s + bias (best first,
/// ties to the lowest expert) and the normalized weights.
__global__ void route_kernel(float* s, int m, int n, const float* bias, int topk, float route_scale,
                             int32_t* sel, float* weights) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= m) return;
  float* sr = s + size_t(r) * n;
  for (int e = 0; e < n; ++e) sr[e] = sqrtf(softplus_f(sr[e]));
  uint32_t taken[max_experts / 32] = {};
  int32_t* sel_r = sel + size_t(r) * topk;
  for (int i = 0; i < topk; ++i) {
    int best = -1;
    float best_v = 0.0f;
    for (int e = 0; e < n; ++e) {
      if (taken[e / 32] >> (e % 32) & 1) continue;
      const float v = sr[e] + bias[e];
      if (best < 0 || v > best_v) best = e, best_v = v;
    }
    taken[best / 32] |= 1u << (best % 32);
    sel_r[i] = best;
  }
  float sum = 0.0f;
  for (int i = 0; i < topk; ++i) sum += sr[sel_r[i]];
  for (int i = 0; i < topk; ++i) weights[size_t(r) * topk + i] = sr[sel_r[i]] / (sum + 1e-20f) * route_scale;
}

/// h = silu(min(g, limit)) * clamp(u, -limit, limit), times weight[row] when weight is given;
/// written over g. Rows of `inter` values.
__global__ void swiglu_kernel(float* g, const float* u, long long rows, int inter, const float* weight,
                              float limit) {
  const long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= rows * inter) return;
  const float h = swiglu_f(g[e], u[e], limit);
  g[e] = weight ? weight[e / inter] * h : h;
}

constexpr int tile_slots = 4;
constexpr int perm_threads = 1024;

/// Groups the valid slots (sel >= 0, expert present) by expert: expert e's slots fill
/// perm[off_e, off_e + count_e), off_e = sum of earlier counts rounded up to tiles of 4, the
/// gaps -1. *total = the padded length. Single block.
__global__ void permute_kernel(const int32_t* sel, int slots, const cpu::expert_weights* experts,
                               int num_experts, int32_t* perm, int capacity, int* total) {
  __shared__ int count[max_experts], offset[max_experts], cursor[max_experts];
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) count[e] = cursor[e] = 0;
  for (int i = threadIdx.x; i < capacity; i += blockDim.x) perm[i] = -1;
  __syncthreads();
  for (int s = threadIdx.x; s < slots; s += blockDim.x) {
    const int e = sel[s];
    if (e >= 0 && e < num_experts && experts[e].w1.data != nullptr) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int off = 0;
    for (int e = 0; e < num_experts; ++e) {
      offset[e] = off;
      off += (count[e] + tile_slots - 1) / tile_slots * tile_slots;
    }
    *total = off;
  }
  __syncthreads();
  for (int s = threadIdx.x; s < slots; s += blockDim.x) {
    const int e = sel[s];
    if (e >= 0 && e < num_experts && experts[e].w1.data != nullptr)
      perm[offset[e] + atomicAdd(&cursor[e], 1)] = s;
  }
}

/// grid (ceil(out / 8), capacity / 4): warp w computes column n of matrix `which` (0 = w1,
/// 1 = w3, 2 = w2) of the tile's expert for the tile's slots. x row of slot s: x + (s / x_div) * in.
__global__ void grouped_fp4_kernel(const float* x, int x_div, const int32_t* perm, const int* total,
                                   const int32_t* sel, const cpu::expert_weights* experts, int which,
                                   int out, int in, float* y) {
  const int tile = blockIdx.y;
  if (tile * tile_slots >= *total) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * 8 + warp;
  if (n >= out) return;
  const int32_t* ts = perm + tile * tile_slots;
  const int first = ts[0];
  if (first < 0) return;
  const cpu::expert_weights& ew = experts[sel[first]];
  const fp4_weight& w = which == 0 ? ew.w1 : which == 1 ? ew.w3 : ew.w2;
  const uint8_t* wrow = w.data + size_t(n) * (in / 2);
  const uint8_t* srow = w.scale + size_t(n) * (in / 32);
  const float* xr[tile_slots];
  float acc[tile_slots] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < tile_slots; ++i) xr[i] = ts[i] >= 0 ? x + size_t(ts[i] / x_div) * in : nullptr;
  for (int k = lane; k < in; k += 32) {
    const uint8_t byte = wrow[k / 2];
    const float wv = e2m1_to_f32((k & 1) ? (byte >> 4) : (byte & 0xF)) * ue8m0_to_f32(srow[k / 32]);
#pragma unroll
    for (int i = 0; i < tile_slots; ++i)
      if (xr[i]) acc[i] = acc[i] + wv * xr[i][k];
  }
#pragma unroll
  for (int i = 0; i < tile_slots; ++i) {
    const float s = warp_fold(acc[i]);
    if (lane == 0 && ts[i] >= 0) y[size_t(ts[i]) * out + n] = s;
  }
}

/// out[r, c] = sum_i partial[r, i, c] (top-k order) + shared[r, c], from 0.
__global__ void combine_kernel(const float* partial, const float* shared, int m, int topk, int d,
                               float* out) {
  const long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= (long long)m * d) return;
  const int r = int(e / d), c = int(e % d);
  float o = 0.0f;
  for (int i = 0; i < topk; ++i) o += partial[(size_t(r) * topk + i) * d + c];
  out[e] = o + shared[e];
}

template <class Weight, class Gemm>
void swiglu_expert(const float* y, int m, const Weight& w1, const Weight& w3, const Weight& w2,
                   const float* weight, float limit, float* out, Gemm gemm) {
  CEDAR_CUDA_REQUIRE(w1.out == w3.out && w2.in == w1.out && w1.in == w2.out, "SwiGLU shapes");
  if (m <= 0) return;
  const int inter = w1.out, d = w2.out;
  scratch<float> xq(size_t(m) * w1.in), g(size_t(m) * inter), u(size_t(m) * inter),
      hq(size_t(m) * inter), down(size_t(m) * d);
  quant_rows_fp8(y, w1.in, m, w1.in, xq.get());
  gemm(xq.get(), w1.in, m, w1, g.get(), inter);
  gemm(xq.get(), w3.in, m, w3, u.get(), inter);
  swiglu_kernel<<<blocks_for((long long)m * inter, 256), 256, 0, stream()>>>(g.get(), u.get(), m, inter,
                                                                            weight, limit);
  CEDAR_CUDA_LAUNCHED();
  quant_rows_fp8(g.get(), inter, m, inter, hq.get());
  gemm(hq.get(), inter, m, w2, down.get(), d);
  add_into(out, down.get(), (long long)m * d);
}

constexpr int moe_chunk_rows = 1024;

}  // namespace
}  // namespace detail

using namespace detail;

void moe_route(const float* y, int m, const bf16_weight& gate, const float* bias, int topk,
               float route_scale, int32_t* sel, float* weights) {
  const int n = gate.out;
  CEDAR_CUDA_REQUIRE(topk > 0 && topk <= n && n <= max_experts, "topk within the expert count");
  if (m <= 0) return;
  scratch<float> s(size_t(m) * n);
  linear_bf16(y, m, gate, s.get());
  route_kernel<<<blocks_for(m, 64), 64, 0, stream()>>>(s.get(), m, n, bias, topk, route_scale, sel, weights);
  CEDAR_CUDA_LAUNCHED();
}

void expert_ffn_fp4(const float* y, int m, const cpu::expert_weights& e, const float* weight,
                    float limit, float* out) {
  swiglu_expert(y, m, e.w1, e.w3, e.w2, weight, limit, out, gemm_fp4);
}

void expert_ffn_fp8(const float* y, int m, const cpu::shared_expert_weights& e, float limit, float* out) {
  swiglu_expert(y, m, e.w1, e.w3, e.w2, nullptr, limit, out, gemm_fp8);
}

int detail::expert_inter(const cpu::expert_weights* experts, int num_experts, int d) {
  int inter = 0;
  for (int e = 0; e < num_experts; ++e)
    if (experts[e].w1.data) {
      CEDAR_CUDA_REQUIRE(experts[e].w1.in == d && experts[e].w2.out == d, "expert shapes");
      CEDAR_CUDA_REQUIRE(inter == 0 || inter == experts[e].w1.out, "experts share one shape");
      inter = experts[e].w1.out;
    }
  return inter;
}

void moe_ffn(const float* y, int m, int d, const int32_t* sel, const float* weights, int topk,
             const cpu::expert_weights* experts, int num_experts, const cpu::shared_expert_weights* shared,
             float limit, float* out) {
  CEDAR_CUDA_REQUIRE(num_experts > 0 && num_experts <= max_experts, "expert count");
  if (m <= 0) return;
  const int inter = cuda::detail::expert_inter(experts, num_experts, d);
  scratch<cpu::expert_weights> table(num_experts);
  CEDAR_CUDA_CHECK(cudaMemcpyAsync(table.get(), experts, sizeof(cpu::expert_weights) * num_experts,
                                   cudaMemcpyHostToDevice, stream()));
  const int chunk = std::min(m, moe_chunk_rows);
  const int capacity = (chunk * topk + (tile_slots - 1) * num_experts + tile_slots - 1) / tile_slots * tile_slots;
  scratch<int32_t> perm(capacity);
  scratch<int> total(1);
  scratch<float> xq(size_t(chunk) * d), g(size_t(chunk) * topk * std::max(inter, 1)),
      u(g.size()), hq(g.size()), partial(size_t(chunk) * topk * d), shared_out(size_t(chunk) * d);
  for (int r0 = 0; r0 < m; r0 += moe_chunk_rows) {
    const int rows = std::min(moe_chunk_rows, m - r0);
    const int slots = rows * topk;
    const int32_t* sel_c = sel + size_t(r0) * topk;
    const float* y_c = y + size_t(r0) * d;
    CEDAR_CUDA_CHECK(cudaMemsetAsync(partial.get(), 0, sizeof(float) * slots * d, stream()));
    CEDAR_CUDA_CHECK(cudaMemsetAsync(shared_out.get(), 0, sizeof(float) * rows * d, stream()));
    if (inter > 0) {
      permute_kernel<<<1, perm_threads, 0, stream()>>>(sel_c, slots, table.get(), num_experts,
                                                       perm.get(), capacity, total.get());
      CEDAR_CUDA_LAUNCHED();
      quant_rows_fp8(y_c, d, rows, d, xq.get());
      const dim3 grid_up(blocks_for(inter, 8), capacity / tile_slots);
      grouped_fp4_kernel<<<grid_up, 256, 0, stream()>>>(xq.get(), topk, perm.get(), total.get(), sel_c,
                                                        table.get(), 0, inter, d, g.get());
      CEDAR_CUDA_LAUNCHED();
      grouped_fp4_kernel<<<grid_up, 256, 0, stream()>>>(xq.get(), topk, perm.get(), total.get(), sel_c,
                                                        table.get(), 1, inter, d, u.get());
      CEDAR_CUDA_LAUNCHED();
      swiglu_kernel<<<blocks_for((long long)slots * inter, 256), 256, 0, stream()>>>(
          g.get(), u.get(), slots, inter, weights + size_t(r0) * topk, limit);
      CEDAR_CUDA_LAUNCHED();
      quant_rows_fp8(g.get(), inter, slots, inter, hq.get());
      const dim3 grid_down(blocks_for(d, 8), capacity / tile_slots);
      grouped_fp4_kernel<<<grid_down, 256, 0, stream()>>>(hq.get(), 1, perm.get(), total.get(), sel_c,
                                                          table.get(), 2, d, inter, partial.get());
      CEDAR_CUDA_LAUNCHED();
    }
    if (shared != nullptr) cuda::expert_ffn_fp8(y_c, rows, *shared, limit, shared_out.get());
    combine_kernel<<<blocks_for((long long)rows * d, 256), 256, 0, stream()>>>(
        partial.get(), shared_out.get(), rows, topk, d, out + size_t(r0) * d);
    CEDAR_CUDA_LAUNCHED();
  }
}

}  // namespace cedar::cuda
