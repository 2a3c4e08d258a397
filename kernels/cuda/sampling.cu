// CUDA token sampling (cuda_ops.hpp sample_rows), the rules of actors/sampler.cpp on the device:
// a full radix sort of each row by (logit desc, id asc); every exp of the draw and of the
// log-sum computed in parallel, each as the host computes it; then one thread a row adds them
// in the sampler's order (its block staging them in shared memory) and walks the sorted ids,
// so the chosen token and its logprob are the host's. One thread doing all of it took 62 ms a
// step at a 129,280-token vocab (docs/BENCHMARKS.md).
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdlib>
#include <string_view>

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

/// Rows sampled together; passed by value (kernel parameters), so no copy precedes the launch.
constexpr int group_rows = 16;
struct request_group {
  sample_request rows[group_rows];
};

/// Row blockIdx.y's terms, each the value the serial walk below computes, here by one thread
/// each: prob[i] = exp(l[ids[i]] / t - mx) over the top k (sampled rows), and the log-sum's
/// exp(l[i] - max) in index order.
__global__ void terms_kernel(const float* logits, int vocab, const int32_t* sorted_ids, request_group requests,
                             bool leave_greedy, double* prob, double* lse_terms) {
  const int r = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= vocab || (leave_greedy && requests.rows[r].temperature == 0.f)) return;
  const float* l = logits + std::size_t(r) * vocab;
  const int32_t* ids = sorted_ids + std::size_t(r) * vocab;
  const float mxf = l[ids[0]];  // the row's largest logit: sorted first
  lse_terms[std::size_t(r) * vocab + i] = exp(double(l[i]) - mxf);
  const sample_request p = requests.rows[r];
  if (p.temperature == 0.f) return;
  const int k = p.top_k > 0 ? min(p.top_k, vocab) : vocab;
  if (i >= k) return;
  const double t = p.temperature;  // in double, as on the host (a tiny temperature)
  const double mx = l[ids[0]] / t;
  prob[std::size_t(r) * vocab + i] = exp(l[ids[i]] / t - mx);
}

constexpr int stage_len = 2048;  // doubles of shared memory a row's block stages at a time

/// Adds add(acc, x[i]) in order for i in [0, n) on thread 0 after the block stages each chunk of
/// x in shared memory (one thread's serial loads from global memory were the cost), stopping
/// after the first i at which stop(acc) holds. Returns i + 1, or n; `acc` is thread 0's. Every
/// thread of the block calls it; add and stop run on thread 0 only.
template <class Add, class Stop>
__device__ int ordered_scan(const double* x, int n, double* stage, double& acc, Add add, Stop stop) {
  __shared__ int found;
  __syncthreads();  // every thread has read the previous scan's `found`
  if (threadIdx.x == 0) found = -1;
  for (int base = 0; base < n; base += stage_len) {
    const int len = min(stage_len, n - base);
    for (int j = threadIdx.x; j < len; j += blockDim.x) stage[j] = x[base + j];
    __syncthreads();
    if (threadIdx.x == 0)
      for (int j = 0; j < len; ++j)
        if (stop(acc = add(acc, stage[j]))) {
          found = base + j;
          break;
        }
    __syncthreads();
    if (found >= 0) return found + 1;
  }
  return n;
}

/// One block a row: the host sampler's sums, in its order, over the terms above (thread 0 adds,
/// the block stages), the top-p cut, the draw, then the log-softmax of the chosen logit.
/// serial: thread 0 alone computes the terms and reads them from global memory (the former
/// form, CEDAR_GPU_SAMPLER=serial, kept to measure against).
__global__ void draw_kernel(const float* logits, int vocab, const int32_t* sorted_ids, request_group requests,
                            bool leave_greedy, bool serial, double* prob_rows, double* lse_rows, int32_t* tokens,
                            float* logprobs) {
  __shared__ double stage[stage_len];
  const int r = blockIdx.x;
  const sample_request p = requests.rows[r];
  if (leave_greedy && p.temperature == 0.f) return;
  const float* l = logits + std::size_t(r) * vocab;
  const int32_t* ids = sorted_ids + std::size_t(r) * vocab;
  double* prob = prob_rows + std::size_t(r) * vocab;
  double* lse_terms = lse_rows + std::size_t(r) * vocab;
  const int k = p.top_k > 0 ? min(p.top_k, vocab) : vocab;
  if (serial) {
    if (threadIdx.x != 0) return;
    const float mxf = l[ids[0]];
    for (int i = 0; i < vocab; ++i) lse_terms[i] = exp(double(l[i]) - mxf);
    if (p.temperature != 0.f) {
      const double t = p.temperature;
      const double mx = l[ids[0]] / t;
      for (int i = 0; i < k; ++i) prob[i] = exp(l[ids[i]] / t - mx);
    }
    int32_t chosen = ids[0];
    if (p.temperature != 0.f) {
      double total = 0;
      for (int i = 0; i < k; ++i) total += prob[i];
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
      const uint64_t rnd = splitmix64(splitmix64(p.seed) ^ uint64_t(p.token_idx));
      const double u = double(rnd >> 11) * (1.0 / 9007199254740992.0) * total;
      double cum = 0;
      chosen = ids[n - 1];
      for (int i = 0; i < n; ++i)
        if ((cum += prob[i]) > u) {
          chosen = ids[i];
          break;
        }
    }
    double s = 0;
    for (int i = 0; i < vocab; ++i) s += lse_terms[i];
    tokens[r] = chosen;
    logprobs[r] = float(l[chosen] - (double(l[ids[0]]) + log(s)));
    return;
  }
  const auto plus = [](double a, double x) { return a + x; };
  const auto never = [](double) { return false; };
  int32_t chosen = ids[0];
  if (p.temperature != 0.f) {
    double total = 0;
    ordered_scan(prob, k, stage, total, plus, never);
    int n = k;
    if (p.top_p < 1.f) {
      double cum = 0;
      n = ordered_scan(prob, k, stage, cum, [&](double a, double x) { return a + x / total; },
                       [&](double a) { return a >= p.top_p; });
      total = 0;
      ordered_scan(prob, n, stage, total, plus, never);
    }
    const uint64_t rnd = splitmix64(splitmix64(p.seed) ^ uint64_t(p.token_idx));
    const double u = double(rnd >> 11) * (1.0 / 9007199254740992.0) * total;  // thread 0's total
    double cum = 0;
    chosen = ids[ordered_scan(prob, n, stage, cum, plus, [&](double a) { return a > u; }) - 1];
  }
  double s = 0;
  ordered_scan(lse_terms, vocab, stage, s, plus, never);
  if (threadIdx.x != 0) return;
  tokens[r] = chosen;
  logprobs[r] = float(l[chosen] - (double(l[ids[0]]) + log(s)));
}

}  // namespace
}  // namespace detail

using namespace detail;

void sample_rows(const float* logits, int m, int vocab, const sample_request* requests, int32_t* tokens,
                 float* logprobs, bool leave_greedy) {
  if (m <= 0 || vocab <= 0) return;
  static const bool serial = [] {
    const char* v = std::getenv("CEDAR_GPU_SAMPLER");
    return v && std::string_view(v) == "serial";
  }();
  // Rows in groups (scratch of 40 bytes a logit): each row sorted on its own, then every row's
  // terms in one launch and its serial sums in a block of its own, the rows side by side.
  const int g = std::min(m, group_rows);
  scratch<unsigned long long> keys(vocab), keys_sorted(vocab);
  scratch<int32_t> ids(vocab), ids_sorted(std::size_t(g) * vocab);
  scratch<double> prob(std::size_t(g) * vocab), lse_terms(std::size_t(g) * vocab);
  std::size_t temp_bytes = 0;
  CEDAR_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(nullptr, temp_bytes, keys.get(), keys_sorted.get(),
                                                             ids.get(), ids_sorted.get(), vocab, 0, 64, stream()));
  scratch<uint8_t> temp(temp_bytes);
  for (int first = 0; first < m; first += g) {
    const int rows = std::min(g, m - first);
    const float* l = logits + std::size_t(first) * vocab;
    request_group group{};
    std::copy(requests + first, requests + first + rows, group.rows);
    for (int r = 0; r < rows; ++r) {
      if (leave_greedy && requests[first + r].temperature == 0.f) continue;
      keys_kernel<<<blocks_for(vocab, 256), 256, 0, stream()>>>(l + std::size_t(r) * vocab, vocab, keys.get(),
                                                                ids.get());
      CEDAR_CUDA_LAUNCHED();
      CEDAR_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(temp.get(), temp_bytes, keys.get(),
                                                                 keys_sorted.get(), ids.get(),
                                                                 ids_sorted.get() + std::size_t(r) * vocab, vocab, 0,
                                                                 64, stream()));
    }
    if (!serial) {
      terms_kernel<<<dim3(blocks_for(vocab, 256), unsigned(rows)), 256, 0, stream()>>>(
          l, vocab, ids_sorted.get(), group, leave_greedy, prob.get(), lse_terms.get());
      CEDAR_CUDA_LAUNCHED();
    }
    draw_kernel<<<unsigned(rows), 256, 0, stream()>>>(l, vocab, ids_sorted.get(), group, leave_greedy, serial,
                                                      prob.get(), lse_terms.get(), tokens + first, logprobs + first);
    CEDAR_CUDA_LAUNCHED();
  }
}

}  // namespace cedar::cuda
