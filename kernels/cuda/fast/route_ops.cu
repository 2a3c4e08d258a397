// The MoE router, the Engram gate and greedy sampling of the fast kernel set (layer_ops.hpp).
//
// moe_route: the gate logits by the bf16 GEMV (split over the warps of a block per expert) or,
// past the decode sizes, the split bf16 GEMM of linear_fast.cu; then one warp per row turns them
// into scores and picks the top-k with warp argmax rounds.
// engram: the table rows gathered, their projection, then a block per (row, copy) for the gate.
// greedy_rows: one block per row, argmax and the log-sum-exp by block reductions.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fast/expert_groups.cuh"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/layer_ops.hpp"
#include "kernels/cuda/internal.cuh"

namespace cedar::cuda::fast {
namespace detail {
namespace {

using cuda::detail::exp_f;
using cuda::detail::log1p_f;
using cuda::detail::round_bf16;
using cuda::detail::scratch;

constexpr int slice = 256;  ///< threads of the Engram gate's blocks

/// Sum over the block of v (blockDim.x == slice); every thread gets the result.
__device__ float block_sum(float v, float* shared /*[slice / 32]*/) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < int(blockDim.x / 32); ++w) s += shared[w];
  return s;
}

// ---- router ----

constexpr int route_warps = 8;
constexpr int max_route_experts = 1024;
/// Rows up to which the gate logits come from the bf16 GEMV (a row's bits whatever the batch, as
/// far as decode steps run under graphs); above, from the split bf16 GEMM (tensor cores).
constexpr int route_gemv_max_rows = 64;
/// Expert scores a lane keeps in registers over the top-k rounds (the first route_cached_q * 32).
constexpr int route_cached_q = 4;

__device__ __forceinline__ float softplus_fast(float x) { return x > 20.0f ? x : log1p_f(exp_f(x)); }

/// One warp: the experts of one row, from its gate logits sr [n] (turned into scores in place
/// past the first cached_q * 32), into sel_r [topk] and weights_r [topk] (and sel_shared [topk]
/// when given).
__device__ __forceinline__ void pick_row(float* sr, int n, const float* bias, const float (&bias_c)[route_cached_q],
                                         int topk, float route_scale, int32_t* sel_r, float* weights_r,
                                         int* sel_shared) {
  constexpr int cached_q = route_cached_q;
  const int lane = threadIdx.x & 31;
  float raw[cached_q], biased[cached_q];
#pragma unroll
  for (int q = 0; q < cached_q; ++q) {
    const int x = lane + 32 * q;
    raw[q] = x < n ? sqrtf(softplus_fast(sr[x])) : 0.0f;
    biased[q] = x < n ? raw[q] + bias_c[q] : 0.0f;
  }
  for (int x = lane + 32 * cached_q; x < n; x += 32) sr[x] = sqrtf(softplus_fast(sr[x]));  // past the cached
  __syncwarp();
  __shared__ float picked[route_warps][16];
  float* picked_r = picked[threadIdx.x / 32];
  uint32_t taken = 0;  // lane-local bit q: expert lane + 32 q was taken (n <= 1024)
  float sum = 0.0f;
  for (int t = 0; t < topk; ++t) {
    int best = -1;
    float best_v = 0.0f;
#pragma unroll
    for (int q = 0; q < cached_q; ++q) {
      const int x = lane + 32 * q;
      if (x >= n || (taken >> q & 1)) continue;
      if (best < 0 || biased[q] > best_v) best = x, best_v = biased[q];
    }
    for (int q = cached_q; lane + 32 * q < n; ++q) {
      const int x = lane + 32 * q;
      if (taken >> q & 1) continue;
      const float v = sr[x] + bias[x];
      if (best < 0 || v > best_v) best = x, best_v = v;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const int ob = __shfl_xor_sync(0xffffffffu, best, o);
      const float ov = __shfl_xor_sync(0xffffffffu, best_v, o);
      if (ob >= 0 && (best < 0 || ov > best_v || (ov == best_v && ob < best))) best = ob, best_v = ov;
    }
    if (best % 32 == lane) taken |= 1u << (best / 32);
    float mine = 0.0f;  // the picked expert's score, from the lane that holds it
#pragma unroll
    for (int q = 0; q < cached_q; ++q)
      if (best / 32 == q) mine = raw[q];
    if (best / 32 >= cached_q && best % 32 == lane) mine = sr[best];
    const float score = __shfl_sync(0xffffffffu, mine, best % 32);
    if (lane == 0) {
      sel_r[t] = best, picked_r[t] = score;
      if (sel_shared) sel_shared[t] = best;
    }
    sum += score;
  }
  __syncwarp();
  if (lane == 0)
    for (int t = 0; t < topk; ++t) weights_r[t] = picked_r[t] / (sum + 1e-20f) * route_scale;
}

/// grid ceil(m / 8): warp w of block x picks the experts of row 8 x + w from its gate logits
/// s [m, n], which it turns into scores sqrt(softplus(.)) first (in registers, and in place past
/// the first 128). Plan (one block): then the block groups the m * topk slots by expert into
/// plan (expert_groups.cuh), over the device table of the layer's num_experts experts.
template <bool Plan>
__global__ void __launch_bounds__(route_warps * 32)
    route_pick_kernel(float* s, int m, int n, const float* bias, int topk, float route_scale, int32_t* sel,
                      float* weights, const cpu::expert_weights* table, int num_experts, plan_arrays plan) {
  // the first cached_q * 32 experts' scores stay in registers over the rounds, and the picked
  // scores in shared memory: each round and the weights wait on no load (64 experts: none);
  // their biases (weights, which no kernel writes) are loaded before the wait
  constexpr int cached_q = route_cached_q;
  const int lane = threadIdx.x & 31, r = blockIdx.x * route_warps + int(threadIdx.x / 32);
  float bias_c[cached_q];
#pragma unroll
  for (int q = 0; q < cached_q; ++q) bias_c[q] = lane + 32 * q < n ? bias[lane + 32 * q] : 0.0f;
  // the plan's expert table (weights: no kernel writes it) before the wait too
  using grouping = block_grouping<route_warps * 32, group_block_max_experts / (route_warps * 32)>;
  [[maybe_unused]] grouping g;
  [[maybe_unused]] typename grouping::shared_part* gsh = nullptr;
  [[maybe_unused]] int* sel_s = nullptr;
  if constexpr (Plan) {
    __shared__ typename grouping::shared_part sh;
    __shared__ int sel_shared[route_warps * 16];
    gsh = &sh, sel_s = sel_shared;
    g.load(table, num_experts, sh);
  }
  cuda::detail::dependent_start();
  if (r < m)  // r is uniform across the warp
    pick_row(s + size_t(r) * n, n, bias, bias_c, topk, route_scale, sel + size_t(r) * topk, weights + size_t(r) * topk,
             Plan ? sel_s + r * topk : nullptr);
  if constexpr (Plan) {
    __syncthreads();  // every row's experts in sel_s, every thread's part of the table loaded
    g.group(sel_s, m * topk, topk, plan, *gsh);
  }
}

// ---- Engram ----

/// One block per (row, copy): the three sums of the gate by block reduction, then every channel.
__global__ void __launch_bounds__(slice) engram_gate_kernel(float* X, int hc, int d, const float* kv,
                                                            const float* q_weight, const float* k_weight, float eps) {
  cuda::detail::dependent_start();
  __shared__ float red[slice / 32];
  const long long rh = blockIdx.x;
  const long long r = rh / hc;
  const int h = int(rh % hc);
  float* x = X + rh * d;
  const float* kv_r = kv + r * (hc + 1) * d;
  const float* key = kv_r + size_t(h) * d;
  const float* value = kv_r + size_t(hc) * d;
  const float* qw = q_weight + size_t(h) * d;
  const float* kw = k_weight + size_t(h) * d;
  float dot = 0.0f, sx = 0.0f, sk = 0.0f;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    dot += x[c] * (qw[c] * kw[c]) * key[c];
    sx += x[c] * x[c];
    sk += key[c] * key[c];
  }
  dot = block_sum(dot, red);
  sx = block_sum(sx, red);
  sk = block_sum(sk, red);
  const float ms_x = sx / float(d), ms_k = sk / float(d);
  dot = dot * (1.0f / sqrtf(ms_x + eps)) * (1.0f / sqrtf(ms_k + eps)) / sqrtf(float(d));
  const float sign = dot > 0.0f ? 1.0f : (dot < 0.0f ? -1.0f : 0.0f);
  const float z = sign * sqrtf(fmaxf(fabsf(dot), 1e-6f));
  const float gate = 1.0f / (1.0f + exp_f(-z));
  __syncthreads();  // every thread has read x before any writes it
  for (int c = threadIdx.x; c < d; c += blockDim.x) x[c] = round_bf16(x[c] + gate * value[c]);
}

__global__ void gather_kernel(const float* src, const int32_t* rows, int width, float* dst) {
  cuda::detail::dependent_start();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < width) dst[size_t(blockIdx.y) * width + i] = src[size_t(rows[blockIdx.y]) * width + i];
}

// ---- greedy sampling ----

constexpr int greedy_threads = 1024;

__global__ void __launch_bounds__(greedy_threads)
    greedy_kernel(const float* logits, int vocab, int32_t* tokens, float* logprobs) {
  cuda::detail::dependent_start();
  __shared__ float best_v[greedy_threads / 32];
  __shared__ int best_i[greedy_threads / 32];
  __shared__ double sums[greedy_threads / 32];
  const float* l = logits + size_t(blockIdx.x) * vocab;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  float bv = 0.0f;
  int bi = -1;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    if (bi < 0 || l[i] > bv) bv = l[i], bi = i;
  const auto better = [](float v, int i, float w, int j) { return j >= 0 && (i < 0 || w > v || (w == v && j < i)); };
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, bv, o);
    const int j = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(bv, bi, w, j)) bv = w, bi = j;
  }
  if (lane == 0) best_v[warp] = bv, best_i[warp] = bi;
  __syncthreads();
  bv = best_v[0], bi = best_i[0];
  for (int w = 1; w < int(blockDim.x / 32); ++w)
    if (better(bv, bi, best_v[w], best_i[w])) bv = best_v[w], bi = best_i[w];
  double s = 0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) s += exp(double(l[i]) - double(bv));
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) sums[warp] = s;
  __syncthreads();
  if (threadIdx.x != 0) return;
  double total = 0;
  for (int w = 0; w < int(blockDim.x / 32); ++w) total += sums[w];
  tokens[blockIdx.x] = bi;
  logprobs[blockIdx.x] = float(double(l[bi]) - (double(bv) + log(total)));
}

}  // namespace
}  // namespace detail

using namespace detail;

void engram(float* X, int m, int hc, int d, const int64_t* rows, int rows_per_token, const cpu::engram_weights& w,
            float eps) {
  const long long flat = (long long)rows_per_token * w.head_dim;
  CEDAR_CUDA_REQUIRE(w.head_dim % 32 == 0, "head_dim is whole UE8M0 groups");
  CEDAR_CUDA_REQUIRE(w.wkv.in == flat && w.wkv.out == (hc + 1) * d, "wkv shape");
  if (m <= 0) return;
  scratch<float> emb(size_t(m) * flat), kv(size_t(m) * (hc + 1) * d);
  const long long n = (long long)m * rows_per_token;
  cuda::detail::engram_gather(w, rows, n, emb.get());
  linear_fp8(emb.get(), m, w.wkv, kv.get());
  cuda::detail::launch_dependent(engram_gate_kernel, dim3(unsigned(m) * hc), dim3(slice), 0, X, hc, d, kv.get(),
                                 w.q_weight, w.k_weight, eps);
}

void gather_rows(const float* src, const int32_t* rows, int m, int width, float* dst) {
  if (m <= 0 || width <= 0) return;
  cuda::detail::launch_dependent(gather_kernel, dim3((width + 255) / 256, m), dim3(256), 0, src, rows, width, dst);
}

void greedy_rows(const float* logits, int m, int vocab, int32_t* tokens, float* logprobs) {
  if (m <= 0 || vocab <= 0) return;
  cuda::detail::launch_dependent(greedy_kernel, dim3(m), dim3(greedy_threads), 0, logits, vocab, tokens, logprobs);
}

bool route_makes_plan(int m, int topk) {
  return tuning_now().expert_plan_in_route && m >= 1 && m <= route_warps && topk <= 16;
}

void moe_route(const float* y, int m, const bf16_weight& gate, const float* bias, int topk, float route_scale,
               int32_t* sel, float* weights, expert_plan* plan) {
  CEDAR_CUDA_REQUIRE(gate.out <= max_route_experts && topk >= 1 && topk <= 16 && topk <= gate.out,
                     "moe_route: at most 1024 experts, top-k 1..16");
  if (m <= 0) return;
  scratch<float> s(size_t(m) * gate.out);
  const auto* g = reinterpret_cast<const uint16_t*>(gate.data);
  if (m > route_gemv_max_rows ||
      !fast::detail::gemv_bf16(y, gate.in, m, g, gate.out, gate.in, s.get(), gate.out, 1, 0, 0, 0))
    linear_bf16(y, m, gate, s.get());
  if (plan) plan->rows = plan->topk = 0;
  if (plan && plan->experts && route_makes_plan(m, topk)) {
    CEDAR_CUDA_REQUIRE(plan->num_experts >= 1 && plan->num_experts <= group_block_max_experts && plan->buffer,
                       "moe_route: an expert plan needs 1..1024 experts and its buffer");
    plan->table = expert_table(plan->experts, plan->num_experts);
    cuda::detail::launch_dependent(route_pick_kernel<true>, dim3(1), dim3(route_warps * 32), 0, s.get(), m, gate.out,
                                   bias, topk, route_scale, sel, weights, plan->table, plan->num_experts,
                                   plan_layout(plan->buffer, m, topk, plan->num_experts));
    plan->rows = m, plan->topk = topk;
    return;
  }
  cuda::detail::launch_dependent(route_pick_kernel<false>, dim3((m + route_warps - 1) / route_warps),
                                 dim3(route_warps * 32), 0, s.get(), m, gate.out, bias, topk, route_scale, sel, weights,
                                 static_cast<const cpu::expert_weights*>(nullptr), 0, plan_arrays{});
}

}  // namespace cedar::cuda::fast
