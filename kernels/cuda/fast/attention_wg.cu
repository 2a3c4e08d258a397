// The fused sparse attention for many rows on Hopper (attention.hpp, sm_90a): one block per row
// holds all 64 query heads, so each candidate is gathered and dequantized once per row instead
// of once per 16 heads, and both products run as warpgroup MMAs (wgmma) reading their operands
// straight from shared memory.
//
// Two warpgroups, 256 threads; head_dim 512, chunks of 64 candidates. Shared memory, all bf16
// tiles in unswizzled core matrices (wgmma.cuh): q as two terms [64, 512] (128 KB, loaded once),
// the chunk's KV [64, 512] (64 KB), P as two terms [64, 64], the score shares each warpgroup
// hands the other. Per chunk: every thread gathers and dequantizes 4 pieces of 32 values of one
// candidate; each warpgroup takes S over its 256 dims (m64n64k16, q terms as A, KV as K-major
// B); a thread holds two head rows of S, and each warpgroup finishes one of them: it adds the
// other's share (one fp32 add: the same bits either way round), runs the online softmax in
// registers (log2 domain, a quad of threads per row) and writes that row's P and rescale factor;
// then each warpgroup rescales its O [64, 256] (128 fp32 registers a thread) and adds P V
// (m64n256k16, the same KV tile read MN-major). The sink is added at the end. With one split per
// row and its own summation order, a row's output differs from attention.cu's in the last bits
// (both within the bounds).
#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fast/attention.hpp"
#include "kernels/cuda/fast/attention_records.cuh"
#include "kernels/cuda/fast/attention_wg.hpp"
#include "kernels/cuda/fast/wgmma.cuh"

namespace cedar::cuda::fast {
namespace {

using namespace attn;
using wg::core_offset;

constexpr int H = 64, D = 512, C = 64, threads = 256;

/// Shared-memory plan (bytes).
struct wg_smem {
  static constexpr std::size_t q_term = std::size_t(H) * D * 2, p_term = std::size_t(H) * C * 2;
  static constexpr std::size_t q = 0;                              // bf16 [terms][64, 512]
  static constexpr std::size_t kv = q + terms * q_term;            // bf16 [64, 512]
  static constexpr std::size_t p = kv + std::size_t(C) * D * 2;    // bf16 [terms][64, 64]
  static constexpr std::size_t sx = p + terms * p_term;            // float2 [2][8][128]: S shares
  static constexpr std::size_t alpha = sx + 2 * 8 * 128 * 8;       // f32 [64]
  static constexpr std::size_t fin = alpha + H * 4;                // f32 [2][64]: final max, sum
  static constexpr std::size_t cand = fin + 2 * H * 4;             // pointers [2][64]: two chunks
  static constexpr std::size_t kind = cand + 2 * C * sizeof(void*);  // int [2][64]
  static constexpr std::size_t valid = kind + 2 * C * 4;           // uint32 [2][2]: kind != none
  static constexpr std::size_t bytes = valid + 4 * 4;
};
static_assert(wg_smem::bytes <= 227 * 1024, "one block a SM");

/// The gather of a chunk: thread tid takes candidate tid % 64, pieces of 32 values at
/// 32 (tid / 64) + 128 j (j < 4): one record, so one pointer and one kind for all four. Its
/// loads are issued a phase before their conversion into the tile, so they are in flight during
/// the products of the chunk before.
[[maybe_unused]]  // (in the sm_90a compilation only)
__device__ __forceinline__ void gather_load(record32 (&raw)[4], const uint8_t* const* cand, const int* kinds, int tid) {
  const int c = tid & (C - 1), d0 = (tid >> 6) * 32;
  const int kind = kinds[c];
  const uint8_t* rec = cand[c];
  if (kind == cand_fp4) {
#pragma unroll
    for (int j = 0; j < 4; ++j) raw[j] = load_record32<true, true>(rec, D, d0 + 128 * j);
  } else if (kind == cand_fp8) {
#pragma unroll
    for (int j = 0; j < 4; ++j) raw[j] = load_record32<false, true>(rec, D, d0 + 128 * j);
  }
}

/// The pieces of gather_load as bf16 into the tile (core matrices; 8 consecutive threads fill
/// the 8 rows of one).
[[maybe_unused]]  // (in the sm_90a compilation only)
__device__ __forceinline__ void gather_store(const record32 (&raw)[4], const uint8_t* const* cand, const int* kinds,
                                             int tid, unsigned char* kvs) {
  const int c = tid & (C - 1), d0 = (tid >> 6) * 32;
  const int kind = kinds[c];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int d = d0 + 128 * j;
    const auto to_tile = [kvs, c, d](int q, uint4 v) {
      *reinterpret_cast<uint4*>(kvs + core_offset(c, d + 8 * q, D)) = v;
    };
    switch (kind) {
      case cand_fp8: dequant_record32<false>(raw[j], to_tile); break;
      case cand_fp4: dequant_record32<true>(raw[j], to_tile); break;
      case cand_fresh: fresh_row32(reinterpret_cast<const float*>(cand[c]), d, to_tile); break;
      default:
        for (int q = 0; q < 4; ++q) to_tile(q, make_uint4(0, 0, 0, 0));
    }
  }
}

__global__ void __launch_bounds__(threads, 1) attention_wg_kernel(sparse_attention_params p, kv_items it) {
  cuda::detail::dependent_start();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = wg_smem;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* qs = smem + L::q;
  unsigned char* kvs = smem + L::kv;
  unsigned char* ps = smem + L::p;
  float2* sx = reinterpret_cast<float2*>(smem + L::sx);
  uint32_t* valid = reinterpret_cast<uint32_t*>(smem + L::valid);
  float* alpha = reinterpret_cast<float*>(smem + L::alpha);
  float* fin = reinterpret_cast<float*>(smem + L::fin);
  const uint8_t** cand = reinterpret_cast<const uint8_t**>(smem + L::cand);
  int* kinds = reinterpret_cast<int*>(smem + L::kind);

  const int r = blockIdx.x, tid = threadIdx.x, wgi = tid >> 7, t = tid & 127;
  const int lane = tid & 31, gid = lane >> 2, tig = lane & 3;
  const int row0 = 16 * (t >> 5) + gid, row1 = row0 + 8;  // this thread's head rows in both products
  const int my_row = wgi ? row1 : row0;                  // the row whose softmax it runs
  const row_candidates rc(p, it, r);
  const int num_chunks = (rc.nc + C - 1) / C;

  // A chunk's candidates (threads < 64: slot ch * 64 + tid): the top-k entry is loaded a chunk
  // ahead, so the record address (a page-table load) is issued before S without waiting, and
  // written with its kind to buffer ch % 2 after S.
  int32_t entry_next = tid < C ? rc.entry(p, r, tid) : -1;
  const uint8_t* ptr_next = nullptr;
  int kind_next = cand_none;
  const auto pick_issue = [&](int ch) {
    if (tid < C && ch < num_chunks) {
      kind_next = rc.record<D>(p, it, ch * C + tid, entry_next, ptr_next);
      entry_next = rc.entry(p, r, (ch + 1) * C + tid);
    }
  };
  const auto pick_store = [&](int ch) {
    if (tid < C && ch < num_chunks) {
      kinds[(ch & 1) * C + tid] = kind_next;
      cand[(ch & 1) * C + tid] = ptr_next;
      const uint32_t bits = __ballot_sync(0xFFFFFFFFu, kind_next != cand_none);
      if (lane == 0) valid[(ch & 1) * 2 + (tid >> 5)] = bits;
    }
  };
  record32 raw[4];  // the gather's records in flight (gather_load, then gather_store)
  float o[128];
  for (float& v : o) v = 0.0f;
  float m_run = neg_inf, l_run = 0.0f;  // row my_row's running max (log2 domain) and sum
  const float scale2 = p.scale * 1.44269504088896340736f;  // scores to the log2 domain

  // the operands' shared-memory addresses at k = 0 (descriptors are built per step from them):
  // this warpgroup's half of the dims of q (A) and of the tile (B, K-major) for S; P (A) and the
  // tile read MN-major (B: candidates along K, this warpgroup's dims along N) for P V
  const uint32_t half_dims = core_offset(0, wgi * (D / 2), D);
  const uint32_t q_base = wg::smem_address(qs) + half_dims, p_base = wg::smem_address(ps);
  const uint32_t kv_base = wg::smem_address(kvs) + half_dims;

  pick_issue(0);
  // q as two bf16 terms; 8 consecutive threads fill the 8 rows of one core matrix; 8 steps'
  // loads issued at once (the first chunk's page-table loads are in flight meanwhile)
  const float* qrow = p.q + std::size_t(r) * H * D;
  for (int i0 = tid; i0 < H * D / 8; i0 += 8 * threads) {
    float4 a[8], b[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int i = i0 + u * threads, h = (i & 7) | (i >> 9) << 3, d = ((i >> 3) & 63) * 8;
      a[u] = *reinterpret_cast<const float4*>(qrow + h * D + d);
      b[u] = *reinterpret_cast<const float4*>(qrow + h * D + d + 4);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int i = i0 + u * threads, h = (i & 7) | (i >> 9) << 3, d = ((i >> 3) & 63) * 8;
      uint32_t w[4][terms];
      split_terms(a[u].x, a[u].y, w[0]), split_terms(a[u].z, a[u].w, w[1]);
      split_terms(b[u].x, b[u].y, w[2]), split_terms(b[u].z, b[u].w, w[3]);
      for (int term = 0; term < terms; ++term)
        *reinterpret_cast<uint4*>(qs + term * L::q_term + core_offset(h, d, D)) =
            make_uint4(w[0][term], w[1][term], w[2][term], w[3][term]);
    }
  }

  pick_store(0);
  __syncthreads();
  if (num_chunks > 0) gather_load(raw, cand, kinds, tid);  // (no slots: buffer 0 was never written)
  for (int ch = 0; ch < num_chunks; ++ch) {
    gather_store(raw, cand + (ch & 1) * C, kinds + (ch & 1) * C, tid, kvs);
    wg::fence_smem();
    __syncthreads();  // the tile is whole
    pick_issue(ch + 1);  // its page-table load in flight during S

    // S over this warpgroup's dims
    float s[32];
    for (float& v : s) v = 0.0f;
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < D / 2 / 16; ++ks)  // 16 dims: two core matrices along K, 256 bytes
#pragma unroll
      for (int term = 0; term < terms; ++term)
        wg::mma_m64n64(s, wg::desc_at(q_base + term * L::q_term + 256 * ks, 128, (D / 8) * 128),
                       wg::desc_at(kv_base + 256 * ks, 128, (D / 8) * 128), ks | term);
    wg::commit_and_wait();
    for (float& v : s) wg::pin(v);
    pick_store(ch + 1);

    // each warpgroup finishes one of its threads' two rows, my_row: its values s[4k + 2 wgi + {0, 1}]
    // plus the other warpgroup's share of them
    // (selects, not an index by wgi: that would put s in local memory)
    for (int k = 0; k < 8; ++k)
      sx[(wgi * 8 + k) * 128 + t] = wgi ? make_float2(s[4 * k], s[4 * k + 1]) : make_float2(s[4 * k + 2], s[4 * k + 3]);
    __syncthreads();
    {  // online softmax of row my_row (log2 domain), 16 candidates a thread, 4 threads a row
      const uint64_t ok = valid[(ch & 1) * 2] | uint64_t(valid[(ch & 1) * 2 + 1]) << 32;
      float x[16], mx = neg_inf;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float2 v = sx[((1 - wgi) * 8 + k) * 128 + t];
        const int c = 8 * k + 2 * tig;
        const float s0 = wgi ? s[4 * k + 2] : s[4 * k], s1 = wgi ? s[4 * k + 3] : s[4 * k + 1];
        x[2 * k] = (ok >> c & 1) ? (s0 + v.x) * scale2 : neg_inf;
        x[2 * k + 1] = (ok >> (c + 1) & 1) ? (s1 + v.y) * scale2 : neg_inf;
        mx = fmaxf(mx, fmaxf(x[2 * k], x[2 * k + 1]));
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
      const float m_new = fmaxf(m_run, mx);
      const float a = m_new == neg_inf ? 1.0f : exp2f(m_run - m_new);
      m_run = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float e0 = m_new == neg_inf ? 0.0f : exp2f(x[2 * k] - m_new);
        const float e1 = m_new == neg_inf ? 0.0f : exp2f(x[2 * k + 1] - m_new);
        sum += e0 + e1;
        uint32_t w[terms];
        split_terms(e0, e1, w);
        for (int term = 0; term < terms; ++term)
          *reinterpret_cast<uint32_t*>(ps + term * L::p_term + core_offset(my_row, 8 * k + 2 * tig, C)) = w[term];
      }
      sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
      sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
      l_run = l_run * a + sum;
      if (tig == 0) alpha[my_row] = a;
    }
    if (ch + 1 < num_chunks) gather_load(raw, cand + ((ch + 1) & 1) * C, kinds + ((ch + 1) & 1) * C, tid);
    wg::fence_smem();
    __syncthreads();

    // O = O alpha + P V over this warpgroup's dims
    const float a0 = alpha[row0], a1 = alpha[row1];
    for (int k = 0; k < 32; ++k) o[4 * k] *= a0, o[4 * k + 1] *= a0, o[4 * k + 2] *= a1, o[4 * k + 3] *= a1;
    for (float& v : o) wg::pin(v);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < C / 16; ++ks)  // 16 candidates: 256 bytes of P along K, 16 rows of the tile
#pragma unroll
      for (int term = 0; term < terms; ++term)
        wg::mma_m64n256<1>(o, wg::desc_at(p_base + term * L::p_term + 256 * ks, 128, (C / 8) * 128),
                           wg::desc_at(kv_base + 2 * (D / 8) * 128 * ks, (D / 8) * 128, 128), 1);
    wg::commit_and_wait();
    for (float& v : o) wg::pin(v);
    __syncthreads();  // both warpgroups are done with the tile
  }

  if (tig == 0) fin[my_row] = m_run, fin[H + my_row] = l_run;
  __syncthreads();
  for (int half = 0; half < 2; ++half) {
    const int h = half ? row1 : row0;
    const float mm = fin[h], ll = fin[H + h];
    const float inv = 1.0f / (ll + (mm == neg_inf ? 1.0f : exp2f(p.sink[h] * 1.44269504088896340736f - mm)));
    float* out = p.out + (std::size_t(r) * H + h) * D + wgi * (D / 2) + 2 * tig;
    for (int k = 0; k < 32; ++k)
      *reinterpret_cast<float2*>(out + 8 * k) = make_float2(o[4 * k + 2 * half] * inv, o[4 * k + 2 * half + 1] * inv);
  }
#endif
}

}  // namespace

bool wg::available() {
  // the sm_90a machine code runs on compute capability 9.0 only (elsewhere the compute_90 PTX,
  // without wgmma, would be compiled)
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    CEDAR_CUDA_CHECK(cudaGetDevice(&dev));
    CEDAR_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CEDAR_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major == 9 && minor == 0;
  }();
  return ok;
}

bool attention_wg_supports(const sparse_attention_params& p) {
  return p.dim == D && p.heads == H && wg::available();
}

void attention_wg(const sparse_attention_params& p, const kv_items& items) {
  CEDAR_CUDA_REQUIRE(attention_wg_supports(p), "all-heads attention: 64 heads of 512 on an sm_90a device");
  cuda::detail::allow_dynamic_smem(reinterpret_cast<const void*>(attention_wg_kernel), int(wg_smem::bytes));
  cuda::detail::launch_dependent(attention_wg_kernel, dim3(unsigned(p.rows)), dim3(threads), wg_smem::bytes, p,
                                 items);
}

}  // namespace cedar::cuda::fast
