// CUDA indexer scores, exact top-k (ties to the lowest index) and level-1 candidate blocks
// (kernels/cpu/indexer.cpp, topk.cpp). Top-k is a radix select over a 64-bit key (score
// order, then lowest index), so the chosen set is the CPU's exactly; indices are written in
// ascending order by a block scan.
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/internal.cuh"

namespace cedar::cuda {
namespace detail {
namespace {

constexpr float neg_inf = -__builtin_huge_valf();

/// grid (ceil(num_keys / 8), m), one warp per key; heads ascending, each dot in dot_order.
__global__ void index_scores_kernel(const float* q, const float* w, int heads, int dim,
                                    const float* keys, int num_keys, const int32_t* num_visible,
                                    float* scores) {
  const int r = blockIdx.y;
  const int j = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (j >= num_keys) return;
  const int visible = min(max(num_visible[r], 0), num_keys);
  float* s = scores + size_t(r) * num_keys;
  if (j >= visible) {
    if ((threadIdx.x & 31) == 0) s[j] = neg_inf;
    return;
  }
  const float* qr = q + size_t(r) * heads * dim;
  const float* wr = w + size_t(r) * heads;
  float score = 0.0f;
  for (int h = 0; h < heads; ++h) {
    const float d = warp_dot(qr + size_t(h) * dim, keys + size_t(j) * dim, dim);
    score += wr[h] * std_max(d, 0.0f);
  }
  if ((threadIdx.x & 31) == 0) s[j] = score;
}

constexpr int topk_threads = 1024;

/// Larger key = better: score order (-0 taken as +0), then the lower index.
__device__ __forceinline__ unsigned long long topk_key(float s, int j) {
  if (s == 0.0f) s = 0.0f;
  uint32_t u = __float_as_uint(s);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(u) << 32) | uint32_t(~uint32_t(j));
}

__device__ __forceinline__ bool selectable(float s) { return s > neg_inf; }  // drops -inf, NaN

/// Adds 1 to hist[bin] for every lane of the warp that passes `active`, one shared-memory atomic
/// per distinct bin of the warp (the first passes put most keys of a row in a few bins).
__device__ __forceinline__ void warp_count(int* hist, int bin, bool active) {
  const unsigned lanes = __ballot_sync(0xFFFFFFFFu, active);
  if (!active) return;
  const unsigned same = __match_any_sync(lanes, bin);
  if ((threadIdx.x & 31) == __ffs(same) - 1) atomicAdd(&hist[bin], __popc(same));
}

/// One block per row.
__global__ void topk_kernel(const float* scores, int n, int k, int32_t* out) {
  cuda::detail::dependent_start();
  using scan_t = cub::BlockScan<int, topk_threads>;
  __shared__ typename scan_t::TempStorage scan_storage;
  __shared__ int hist[256];
  __shared__ int valid_shared;
  __shared__ unsigned long long prefix_shared;
  __shared__ int remaining_shared;
  __shared__ int written_shared;
  __shared__ bool done_shared;
  const float* s = scores + size_t(blockIdx.x) * n;
  int32_t* o = out + size_t(blockIdx.x) * k;
  const int lane = threadIdx.x & 31;

  int local = 0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) local += selectable(s[j]);
  for (int off = 16; off >= 1; off /= 2) local += __shfl_xor_sync(0xFFFFFFFFu, local, off);
  if (threadIdx.x == 0) valid_shared = 0;
  __syncthreads();
  if (lane == 0) atomicAdd(&valid_shared, local);
  __syncthreads();
  const int valid = valid_shared;
  const int take = min(k, valid);

  unsigned long long prefix = 0, mask = 0;
  if (threadIdx.x == 0) remaining_shared = take;
  if (take > 0) {
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
      __syncthreads();
      // whole warps go round the loop together (warp_count's shuffles need every lane)
      for (int base = 0; base < n; base += blockDim.x) {
        const int j = base + threadIdx.x;
        const bool live = j < n && selectable(s[j]);
        const unsigned long long key = live ? topk_key(s[j], j) : 0;
        warp_count(hist, int((key >> shift) & 255), live && (key & mask) == prefix);
      }
      __syncthreads();
      if (threadIdx.x < 32) {
        // the bucket of the remaining-th largest key: lane l holds bins 255 - 8 l .. 248 - 8 l,
        // a scan over the lanes gives the count above each lane's bins, and the one lane whose
        // bins hold the remaining-th key walks them (the serial walk's bin, found in parallel)
        const int remaining = remaining_shared;
        int c[8], sum = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) c[i] = hist[255 - 8 * lane - i], sum += c[i];
        int incl = sum;
#pragma unroll
        for (int off = 1; off < 32; off *= 2) {
          const int v = __shfl_up_sync(0xFFFFFFFFu, incl, off);
          if (lane >= off) incl += v;
        }
        int above = incl - sum;
        __syncwarp();  // every lane has read remaining_shared before one lane writes it
        if (above < remaining && (remaining <= incl || lane == 31)) {
          int b = 255 - 8 * lane, i = 0;
          for (; i < 7 && above + c[i] < remaining; ++i) above += c[i];
          b -= i;
          remaining_shared = remaining - above;
          prefix_shared = prefix | (static_cast<unsigned long long>(b) << shift);
          done_shared = remaining - above == c[i];  // the whole bucket is taken
        }
      }
      __syncthreads();
      prefix = prefix_shared;
      mask |= 255ull << shift;
      if (done_shared) break;  // uniform: read after the barrier, written before the next one
    }
  }
  // prefix is now the key of the take-th best entry, or (a pass took its whole bucket) that
  // bucket's lowest key with the bits below zero: either way exactly `take` keys are >= it.
  if (threadIdx.x == 0) written_shared = 0;
  __syncthreads();
  if (take > 0) {
    for (int base = 0; base < n; base += blockDim.x) {
      const int j = base + threadIdx.x;
      const int flag = j < n && selectable(s[j]) && topk_key(s[j], j) >= prefix;
      int pos = 0, total = 0;
      scan_t(scan_storage).ExclusiveSum(flag, pos, total);
      const int written = written_shared;
      if (flag) o[written + pos] = j;
      __syncthreads();
      if (threadIdx.x == 0) written_shared = written + total;
      __syncthreads();
    }
  }
  for (int i = take + threadIdx.x; i < k; i += blockDim.x) o[i] = -1;
}

/// Block maxima as the CPU takes them (std::max in ascending order), the newest visible
/// entry's block set to +inf. One thread per (row, block).
__global__ void block_scores_kernel(const float* scores, int m, int n, int block, int num_blocks,
                                    const int32_t* num_visible, float* out) {
  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (t >= (long long)m * num_blocks) return;
  const int r = int(t / num_blocks), b = int(t % num_blocks);
  const float* s = scores + size_t(r) * n;
  float v = neg_inf;
  for (int j = b * block; j < min(n, (b + 1) * block); ++j) v = std_max(v, s[j]);
  if (num_visible[r] > 0 && (min(num_visible[r], n) - 1) / block == b) v = __builtin_huge_valf();
  out[t] = v;
}

__global__ void mask_kernel(const int32_t* kept, int m, int keep, int num_blocks, uint8_t* mask) {
  const int r = blockIdx.x;
  for (int b = threadIdx.x; b < num_blocks; b += blockDim.x) mask[size_t(r) * num_blocks + b] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < keep; i += blockDim.x) {
    const int b = kept[size_t(r) * keep + i];
    if (b >= 0) mask[size_t(r) * num_blocks + b] = 1;
  }
}

}  // namespace
}  // namespace detail

using namespace detail;

void index_scores(const float* q, const float* w, int m, int heads, int dim, const float* keys,
                  int num_keys, const int32_t* num_visible, float* scores) {
  if (m <= 0 || num_keys <= 0) return;
  CEDAR_CUDA_REQUIRE(m <= 65535, "index_scores: at most 65535 rows per call");
  const dim3 grid(blocks_for(num_keys, 8), m);
  index_scores_kernel<<<grid, 256, 0, stream()>>>(q, w, heads, dim, keys, num_keys, num_visible, scores);
  CEDAR_CUDA_LAUNCHED();
}

void topk_indices(const float* scores, int m, int n, int k, int32_t* out) {
  CEDAR_CUDA_REQUIRE(k >= 0 && n >= 0, "sizes are non-negative");
  if (m <= 0 || k == 0) return;
  cuda::detail::launch_dependent(topk_kernel, dim3(m), dim3(topk_threads), 0, scores, n, k, out);
}

void candidate_blocks(const float* scores, int m, int n, int block, int keep,
                      const int32_t* num_visible, uint8_t* mask) {
  CEDAR_CUDA_REQUIRE(block > 0 && keep >= 0, "block size and keep count");
  if (m <= 0) return;
  const int num_blocks = (n + block - 1) / block;
  scratch<float> bs(size_t(m) * num_blocks);
  scratch<int32_t> kept(size_t(m) * keep);
  if (num_blocks > 0) {
    block_scores_kernel<<<blocks_for((long long)m * num_blocks, 256), 256, 0, stream()>>>(
        scores, m, n, block, num_blocks, num_visible, bs.get());
    CEDAR_CUDA_LAUNCHED();
  }
  topk_indices(bs.get(), m, num_blocks, keep, kept.get());
  mask_kernel<<<m, 256, 0, stream()>>>(kept.get(), m, keep, num_blocks, mask);
  CEDAR_CUDA_LAUNCHED();
}

}  // namespace cedar::cuda
