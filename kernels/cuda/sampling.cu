// CUDA token sampling (cuda_ops.hpp sample_rows), the rules of actors/sampler.cpp on the device:
// with top-k or top-p, a radix sort of the row by (logit desc, id asc), else the ids in index
// order; every exp of the draw and of the log-sum computed in parallel, each as the host
// computes it; then one block a row adds them in kernels/sampling_order.hpp's blocked order
// (one thread a chunk, then thread 0 over the chunk sums), so the chosen token and its logprob
// are the host's.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/sampling_order.hpp"

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

constexpr int chunk = sampling_order::chunk;
constexpr int draw_threads = 512;

/// Whether a sampled row's draw walks its ids best first (sorted), or in index order.
__host__ __device__ inline bool sorted_walk(const sample_request& p) {
  return p.temperature != 0.f && (p.top_k > 0 || p.top_p < 1.f);
}

/// Row blockIdx.y's terms, each the value the host computes, here by one thread each:
/// prob[i] = exp(l[id(i)] / t - mx) over the top k (sampled rows; id(i) = ids[i] when the row
/// is sorted, else i), and the log-sum's exp(l[i] - max) in index order.
__global__ void terms_kernel(const float* logits, int vocab, const int32_t* sorted_ids, const float* row_max,
                             request_group requests, bool leave_greedy, double* prob, double* lse_terms) {
  const int r = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const sample_request p = requests.rows[r];
  if (i >= vocab || (leave_greedy && p.temperature == 0.f)) return;
  const float* l = logits + std::size_t(r) * vocab;
  const float mxf = row_max[r];
  lse_terms[std::size_t(r) * vocab + i] = exp(double(l[i]) - mxf);
  if (p.temperature == 0.f) return;
  const bool ordered = sorted_walk(p);
  const int k = p.top_k > 0 ? min(p.top_k, vocab) : vocab;
  if (i >= k) return;
  const double t = p.temperature;  // in double, as on the host (a tiny temperature)
  const double mx = mxf / t;
  const int id = ordered ? sorted_ids[std::size_t(r) * vocab + i] : i;
  prob[std::size_t(r) * vocab + i] = exp(l[id] / t - mx);
}

/// Each thread sums whole chunks of term(i) into part[] (shared, one double a chunk); returns the
/// number of chunks once every sum is in place.
template <class Term>
__device__ int chunk_sums(int n, double* part, Term term) {
  const int chunks = (n + chunk - 1) / chunk;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    double a = 0;
    for (int i = c * chunk, end = min(n, (c + 1) * chunk); i < end; ++i) a += term(i);
    part[c] = a;
  }
  __syncthreads();
  return chunks;
}

/// sampling_order::find on a block: the chunk sums, then thread 0 adds them in order and walks
/// the chunk where stop first holds. Every thread calls it and gets the index (n if stop never
/// holds).
template <class Term, class Stop>
__device__ int blocked_find(int n, double* part, Term term, Stop stop) {
  __shared__ int found;
  const int chunks = chunk_sums(n, part, term);
  if (threadIdx.x == 0) {
    found = n;
    double prefix = 0;
    for (int c = 0; c < chunks; ++c) {
      if (!stop(prefix + part[c])) {
        prefix += part[c];
        continue;
      }
      double within = 0;
      for (int i = c * chunk, end = min(n, (c + 1) * chunk); i < end; ++i)
        if (stop(prefix + (within += term(i)))) {
          found = i;
          break;
        }
      break;
    }
  }
  __syncthreads();
  const int at = found;
  __syncthreads();  // every thread has read `found` before the next call writes it
  return at;
}

/// sampling_order::sum on a block; every thread gets the sum.
template <class Term>
__device__ double blocked_sum(int n, double* part, Term term) {
  __shared__ double total;
  const int chunks = chunk_sums(n, part, term);
  if (threadIdx.x == 0) {
    double t = 0;
    for (int c = 0; c < chunks; ++c) t += part[c];
    total = t;
  }
  __syncthreads();
  const double t = total;
  __syncthreads();
  return t;
}

/// One block a row: the total, the top-p cut, the draw, then the log-softmax of the chosen
/// logit, over the terms above.
__global__ void draw_kernel(const float* logits, int vocab, const int32_t* sorted_ids, const float* row_max,
                            const int32_t* row_arg, request_group requests, bool leave_greedy,
                            const double* prob_rows, const double* lse_rows, int32_t* tokens, float* logprobs) {
  extern __shared__ double part[];
  const int r = blockIdx.x;
  const sample_request p = requests.rows[r];
  if (leave_greedy && p.temperature == 0.f) return;
  const float* l = logits + std::size_t(r) * vocab;
  const bool ordered = sorted_walk(p);
  const int32_t* ids = sorted_ids + std::size_t(r) * vocab;
  const double* prob = prob_rows + std::size_t(r) * vocab;
  const double* lse_terms = lse_rows + std::size_t(r) * vocab;
  const int k = p.top_k > 0 ? min(p.top_k, vocab) : vocab;
  const float mxf = row_max[r];
  int32_t chosen = row_arg[r];  // greedy: the arg-max, ties to the lowest id
  if (p.temperature != 0.f) {
    const auto term = [&](int i) { return prob[i]; };
    double total = blocked_sum(k, part, term);
    int n = k;
    if (p.top_p < 1.f) {
      n = min(k, blocked_find(k, part, [&](int i) { return prob[i] / total; },
                              [&](double cum) { return cum >= p.top_p; }) + 1);
      total = blocked_sum(n, part, term);
    }
    const uint64_t rnd = splitmix64(splitmix64(p.seed) ^ uint64_t(p.token_idx));
    const double u = double(rnd >> 11) * (1.0 / 9007199254740992.0) * total;
    const int i = min(n - 1, blocked_find(n, part, term, [&](double cum) { return cum > u; }));
    chosen = ordered ? ids[i] : i;
  }
  const double s = blocked_sum(vocab, part, [&](int i) { return lse_terms[i]; });
  if (threadIdx.x != 0) return;
  tokens[r] = chosen;
  logprobs[r] = float(l[chosen] - (double(mxf) + log(s)));
}

/// Each row's largest logit and its lowest id (exact, in any order), one block a row.
__global__ void row_max_kernel(const float* logits, int vocab, float* row_max, int32_t* row_arg) {
  __shared__ float best[32];
  __shared__ int best_id[32];
  const float* l = logits + std::size_t(blockIdx.x) * vocab;
  float m = -INFINITY;
  int at = 0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    if (l[i] > m) m = l[i], at = i;  // a thread's ids rise: the first of its equals stays
  const auto better = [](float v, int id, float w, int wid) { return w > v || (w == v && wid < id); };
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, m, o);
    const int wid = __shfl_xor_sync(0xffffffffu, at, o);
    if (better(m, at, w, wid)) m = w, at = wid;
  }
  if ((threadIdx.x & 31) == 0) best[threadIdx.x >> 5] = m, best_id[threadIdx.x >> 5] = at;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x >> 5); ++w)
      if (better(m, at, best[w], best_id[w])) m = best[w], at = best_id[w];
    row_max[blockIdx.x] = m;
    row_arg[blockIdx.x] = at;
  }
}

}  // namespace
}  // namespace detail

using namespace detail;

void sample_rows(const float* logits, int m, int vocab, const sample_request* requests, int32_t* tokens,
                 float* logprobs, bool leave_greedy) {
  if (m <= 0 || vocab <= 0) return;
  const int chunks = (vocab + chunk - 1) / chunk;
  const std::size_t part_bytes = std::size_t(chunks) * sizeof(double);
  if (part_bytes > 48 * 1024)
    throw std::runtime_error("sample_rows: a vocabulary of " + std::to_string(vocab) +
                             " has more chunk sums than a block's shared memory holds");
  // Rows in groups (scratch of about 30 bytes a logit): the rows with top-k or top-p sorted one
  // by one, then every row's max, terms and sums in one launch each, the rows side by side.
  const int g = std::min(m, group_rows);
  scratch<unsigned long long> keys(vocab), keys_sorted(vocab);
  scratch<int32_t> ids(vocab), ids_sorted(std::size_t(g) * vocab), row_arg(g);
  scratch<float> row_max(g);
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
      if (!sorted_walk(requests[first + r])) continue;
      keys_kernel<<<blocks_for(vocab, 256), 256, 0, stream()>>>(l + std::size_t(r) * vocab, vocab, keys.get(),
                                                                ids.get());
      CEDAR_CUDA_LAUNCHED();
      CEDAR_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(temp.get(), temp_bytes, keys.get(),
                                                                 keys_sorted.get(), ids.get(),
                                                                 ids_sorted.get() + std::size_t(r) * vocab, vocab, 0,
                                                                 64, stream()));
    }
    row_max_kernel<<<unsigned(rows), 1024, 0, stream()>>>(l, vocab, row_max.get(), row_arg.get());
    CEDAR_CUDA_LAUNCHED();
    terms_kernel<<<dim3(blocks_for(vocab, 256), unsigned(rows)), 256, 0, stream()>>>(
        l, vocab, ids_sorted.get(), row_max.get(), group, leave_greedy, prob.get(), lse_terms.get());
    CEDAR_CUDA_LAUNCHED();
    draw_kernel<<<unsigned(rows), draw_threads, part_bytes, stream()>>>(
        l, vocab, ids_sorted.get(), row_max.get(), row_arg.get(), group, leave_greedy, prob.get(),
        lse_terms.get(), tokens + first, logprobs + first);
    CEDAR_CUDA_LAUNCHED();
  }
}

}  // namespace cedar::cuda
