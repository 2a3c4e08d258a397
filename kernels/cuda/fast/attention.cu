// Fused sparse attention and indexer scores of the fast kernel set (attention.hpp): candidates
// are gathered through device page tables, dequantized in registers into bf16 shared-memory
// tiles, and multiplied on tensor cores (mma.sync m16n8k16 bf16, fp32 accumulation).
//
// Attention: one block per (row, 16 heads, split); 8 warps (4 for head_dim 64), warp w owning a
// slice of the dims. Per chunk of 64 candidates: gather + dequant the chunk [64, dim] into smem,
// S = Q K^T (each warp its dims' share for all candidates, q fragments in registers, shares summed
// in warp order), online softmax (16 threads per head), O = O alpha + P V (each warp its dims).
// q and P are split into two bf16 terms (hi + lo). With more than one split the partial
// (O, max, sum) go to scratch and a second kernel combines them with the sink.
// Indexer: one block per (row, 256 or 1024 keys): q [heads, dim] (exact in bf16) times 256-key
// tiles, 8 warps of 32 keys.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fast/attention.hpp"
#include "kernels/cuda/fast/attention_records.cuh"
#include "kernels/cuda/fast/attention_wg.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/mma.cuh"

namespace cedar::cuda::fast {
namespace {

using namespace attn;
using cuda::detail::num_sms;
using cuda::detail::scratch;
using cuda::detail::stream;

// ---- tensor-core and format helpers ------------------------------------------------------

/// C += A B, A 16x16 bf16 (row), B 16x8 bf16 (col), fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Four 8x8 bf16 matrices, transposed: lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* smem) {
  const uint32_t s = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ __forceinline__ uint32_t ld32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

/// Values d .. d+7 of an FP8 record (codes [dim], then a UE8M0 scale per 32).
__device__ __forceinline__ uint4 fp8_record8(const uint8_t* rec, int dim, int d) {
  const uint32_t lo = load_u32(rec + d), hi = load_u32(rec + d + 4);
  return dequant8(lo, hi, cuda::detail::ue8m0_to_f32(rec[dim + d / 32]));
}

/// Values d .. d+7 of an FP4 index-key record (packed E2M1 [dim / 2], then a UE8M0 scale per 32;
/// the latents' records, an E4M3 scale per 16, go through load_record32 below).
__device__ __forceinline__ uint4 fp4_key8(const uint8_t* rec, int dim, int d) {
  const uint32_t w = load_u32(rec + d / 2);
  const float s = cuda::detail::ue8m0_to_f32(rec[dim / 2 + d / 32]);
  const uint2 e = detail::e2m1x8_to_e4m3(w);
  return dequant8(e.x, e.y, s);
}

/// The ring store of a call's window rows: record r of rec [rows, rec_bytes] to slot pos mod W
/// of `layer`, for the rows among their item's last W rows (rec == null: none). The attention's
/// last pass (the split combine, or the rotation back) carries it, a block per row, so the
/// records go in once every attention block has read the ring.
struct ring_store {
  const uint8_t* rec = nullptr;
  std::size_t rec_bytes = 0;
  kv_items it;
  int layer = 0, window = 0;

  /// Row r's copy by the calling block's threads.
  __device__ __forceinline__ void copy_row(int r) const {
    const int item = it.row_item[r];
    if (r < it.row_end[item] - window) return;  // a later row of the item takes this slot
    const int64_t pos = row_position(it, r, item);
    uint8_t* dst = it.rings[item] + (std::size_t(layer) * window + std::size_t(pos % window)) * rec_bytes;
    const uint8_t* src = rec + std::size_t(r) * rec_bytes;
    for (std::size_t i = threadIdx.x; i < rec_bytes; i += blockDim.x) dst[i] = src[i];
  }
};

/// grid (rows): the ring store alone, where no pass follows the attention.
__global__ void store_ring_kernel(ring_store rs) {
  cuda::detail::dependent_start();
  rs.copy_row(blockIdx.x);
}

// ---- sparse attention ------------------------------------------------------------------------

constexpr int heads_per_block = 16;  // one mma M tile
constexpr int max_rope_half = 64;    ///< RoPE pairs the output's rotation takes (rope_dim <= 128)

/// Row r's RoPE cos and sin (sparse_attention's rope_cs) into shared memory, threads
/// first, first + stride, ... of the block.
__device__ __forceinline__ void load_rope(const float* rope_cs, int r, int rope_dim, float* c, float* s,
                                          int first = int(threadIdx.x), int stride = int(blockDim.x)) {
  const int half = rope_dim / 2;
  const float* row = rope_cs + std::size_t(r) * rope_dim;
  for (int i = first; i < half; i += stride) c[i] = row[i], s[i] = row[half + i];
}
constexpr int chunk = 64;            // candidates per step
/// Warps per block: 8 for the real head_dim, 4 for small ones; warp w owns dims
/// [w dim / WARPS, (w + 1) dim / WARPS) in both products.
template <int DIM>
constexpr int attn_warps = DIM >= 256 ? 8 : 4;

/// Shared-memory plan of the attention kernel (bytes; bf16 rows padded by 8 so that the fragment
/// loads of 8 rows x 4 words hit 32 distinct banks; score rows padded by 8 floats so that a
/// half-warp's 8-byte stores of 4 rows x 4 pairs hit 32 distinct banks, and a quarter-warp's
/// 16-byte loads of 8 x 4 consecutive scores too).
template <int DIM, int WARPS = attn_warps<DIM>>
struct attn_smem {
  static constexpr int ld = DIM + 8, ld_p = chunk + 8, ld_s = chunk + 8;
  static constexpr std::size_t kv = 0;                                                        // bf16 [chunk, ld]
  static constexpr std::size_t s = kv + std::size_t(chunk) * ld * 2;                          // f32 [WARPS, 16, ld_s]
  static constexpr std::size_t p = s + std::size_t(WARPS) * heads_per_block * ld_s * 4;        // bf16 [terms, 16, ld_p]
  static constexpr std::size_t stats = p + std::size_t(terms) * heads_per_block * ld_p * 2;    // m, l, alpha
  static constexpr std::size_t cand = stats + 3 * heads_per_block * 4;
  static constexpr std::size_t kind = cand + chunk * sizeof(void*);
  static constexpr std::size_t bytes = kind + chunk * 4;
};

/// grid (rows, heads / 16, splits). Split s takes chunks s, s + splits, ...; with one split the
/// block writes the final output, else its partial O [16, dim], max and sum. Each warp keeps the
/// q fragments of its dims in registers (3 bf16 terms) and adds its share of every score into
/// smem; the shares are summed in warp order, so the result does not depend on timing.
template <int DIM, int WARPS = attn_warps<DIM>>
__global__ void __launch_bounds__(WARPS * 32, 2)
    attention_kernel(sparse_attention_params p, kv_items it, float* part_o, float* part_ml) {
  cuda::detail::dependent_start();
  using L = attn_smem<DIM, WARPS>;
  constexpr int threads = WARPS * 32, ld = L::ld, ld_p = L::ld_p, ld_s = L::ld_s;
  constexpr int dims_per_warp = DIM / WARPS, ksteps = dims_per_warp / 16, tiles = dims_per_warp / 8;
  constexpr int threads_per_head = threads / heads_per_block, cands_per_thread = chunk / threads_per_head;
  static_assert(ksteps >= 1 && tiles % 2 == 0 && cands_per_thread % 2 == 0, "tile shapes");
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* kvt = reinterpret_cast<uint16_t*>(smem + L::kv);
  float* st = reinterpret_cast<float*>(smem + L::s);
  uint16_t* pt = reinterpret_cast<uint16_t*>(smem + L::p);  // [term][head][cand]
  float* m_run = reinterpret_cast<float*>(smem + L::stats);
  float* l_run = m_run + heads_per_block;
  float* alpha = l_run + heads_per_block;
  const uint8_t** cand = reinterpret_cast<const uint8_t**>(smem + L::cand);
  int* kinds = reinterpret_cast<int*>(smem + L::kind);

  const int r = blockIdx.x, h0 = blockIdx.y * heads_per_block, split = blockIdx.z, splits = gridDim.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const row_candidates rc(p, it, r);
  const int num_chunks = (rc.nc + chunk - 1) / chunk;
  const int d_warp = warp * dims_per_warp;

  // q fragments of this warp's dims: [kstep][term][4], rows gid and gid + 8; an unrotated q's
  // pair (d, d + 1) in the last rope_dim dims rotated first (rope_rotate, finish_rows' values)
  const int q_rope_dim = p.q_rope_cs ? p.q_rope_dim : 0, q_rope_from = DIM - q_rope_dim;
  uint32_t qf[ksteps][terms][4];
  for (int ks = 0; ks < ksteps; ++ks)
    for (int half = 0; half < 2; ++half)      // k and k + 8
      for (int row = 0; row < 2; ++row) {     // gid and gid + 8
        const int h = gid + row * 8, d = d_warp + ks * 16 + half * 8 + tig * 2;
        float2 v = make_float2(0.0f, 0.0f);
        if (h0 + h < p.heads) v = *reinterpret_cast<const float2*>(p.q + (std::size_t(r) * p.heads + h0 + h) * DIM + d);
        if (d >= q_rope_from && q_rope_dim > 0) {
          const float* cs = p.q_rope_cs + std::size_t(r) * q_rope_dim;
          const int i = (d - q_rope_from) / 2;
          float rot[2];
          cuda::detail::rope_rotate(v.x, v.y, cs[i], cs[q_rope_dim / 2 + i], rot);
          v = make_float2(rot[0], rot[1]);
        }
        uint32_t t[terms];
        split_terms(v.x, v.y, t);
        for (int term = 0; term < terms; ++term) qf[ks][term][half * 2 + row] = t[term];
      }
  if (tid < heads_per_block) m_run[tid] = neg_inf, l_run[tid] = 0.0f;
  float o[tiles][4];
  for (int t = 0; t < tiles; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;

  for (int ch = split; ch < num_chunks; ch += splits) {
    __syncthreads();  // the previous chunk is done with the tiles
    if (tid < chunk) {
      const uint8_t* ptr;
      kinds[tid] = rc.pick<DIM>(p, it, r, ch * chunk + tid, ptr);
      cand[tid] = ptr;
    }
    __syncthreads();
    {  // gather: a thread takes 32-value pieces, Batch at a time: their loads are issued before
       // any is converted (more would spill: the q fragments and O stay in registers)
      constexpr int pieces = DIM / 32, per_thread = chunk * pieces / threads;
      constexpr int Batch = per_thread < 2 ? per_thread : 2;
      static_assert(chunk * pieces % threads == 0 && per_thread % Batch == 0, "whole pieces a thread");
#pragma unroll
      for (int j0 = 0; j0 < per_thread; j0 += Batch) {
        record32 raw[Batch];
#pragma unroll
        for (int j = 0; j < Batch; ++j) {
          const int i = tid + (j0 + j) * threads, c = i / pieces, d = (i % pieces) * 32;
          if (kinds[c] == cand_fp4) raw[j] = load_record32<true, (DIM >= 256)>(cand[c], DIM, d);
          else if (kinds[c] == cand_fp8) raw[j] = load_record32<false, (DIM >= 256)>(cand[c], DIM, d);
        }
#pragma unroll
        for (int j = 0; j < Batch; ++j) {
          const int i = tid + (j0 + j) * threads, c = i / pieces, d = (i % pieces) * 32;
          uint4* dst = reinterpret_cast<uint4*>(kvt + c * ld + d);
          const auto to_tile = [dst](int i, uint4 v) { dst[i] = v; };
          switch (kinds[c]) {
            case cand_fp8: dequant_record32<false>(raw[j], to_tile); break;
            case cand_fp4: dequant_record32<true>(raw[j], to_tile); break;
            case cand_fresh: fresh_row32(reinterpret_cast<const float*>(cand[c]), d, to_tile); break;
            default:
              for (int q = 0; q < 4; ++q) to_tile(q, make_uint4(0, 0, 0, 0));
          }
        }
      }
    }
    __syncthreads();

    // this warp's share of S = Q K^T (its dims, all 64 candidates), half the candidates at a time
    for (int half = 0; half < 2; ++half) {
      float s[4][4] = {};
      for (int ks = 0; ks < ksteps; ++ks) {
        const int k0 = d_warp + ks * 16 + tig * 2;
        for (int nt = 0; nt < 4; ++nt) {
          const uint16_t* krow = kvt + (half * 32 + nt * 8 + gid) * ld + k0;
          const uint32_t b0 = ld32(krow), b1 = ld32(krow + 8);
          for (int term = 0; term < terms; ++term) mma_bf16(s[nt], qf[ks][term], b0, b1);
        }
      }
      float* sw = st + warp * heads_per_block * ld_s;
      for (int nt = 0; nt < 4; ++nt)
        for (int hh = 0; hh < 2; ++hh)  // rows gid and gid + 8, two adjacent candidates each
          *reinterpret_cast<float2*>(sw + (gid + hh * 8) * ld_s + half * 32 + nt * 8 + tig * 2) =
              make_float2(s[nt][2 * hh], s[nt][2 * hh + 1]);
    }
    __syncthreads();

    {  // online softmax: threads_per_head threads per head (adjacent lanes), cands_per_thread each
      const int h = tid / threads_per_head, part = tid % threads_per_head, c0 = part * cands_per_thread;
      static_assert(cands_per_thread % 4 == 0, "whole 16-byte loads of scores");
      float sc[cands_per_thread] = {};
      for (int w = 0; w < WARPS; ++w) {  // the warps' shares in warp order
        const float* row = st + (w * heads_per_block + h) * ld_s + c0;
        for (int i = 0; i < cands_per_thread; i += 4) {
          const float4 a = *reinterpret_cast<const float4*>(row + i);
          sc[i] += a.x, sc[i + 1] += a.y, sc[i + 2] += a.z, sc[i + 3] += a.w;
        }
      }
      float mx = neg_inf;
      for (int i = 0; i < cands_per_thread; ++i) {
        sc[i] = kinds[c0 + i] != cand_none ? sc[i] * p.scale : neg_inf;
        mx = fmaxf(mx, sc[i]);
      }
      for (int off = 1; off < threads_per_head; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
      const float m_old = m_run[h], m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int i = 0; i < cands_per_thread; i += 2) {
        const float e0 = m_new == neg_inf ? 0.0f : expf(sc[i] - m_new);
        const float e1 = m_new == neg_inf ? 0.0f : expf(sc[i + 1] - m_new);
        sum += e0 + e1;
        uint32_t t[terms];
        split_terms(e0, e1, t);
        for (int term = 0; term < terms; ++term)
          *reinterpret_cast<uint32_t*>(pt + (term * heads_per_block + h) * ld_p + c0 + i) = t[term];
      }
      for (int off = 1; off < threads_per_head; off <<= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
      __syncwarp();  // every lane of the head has read m_run[h] before its lane 0 writes it
      if (part == 0) {
        const float a = m_new == neg_inf ? 1.0f : expf(m_old - m_new);
        alpha[h] = a;
        l_run[h] = l_run[h] * a + sum;
        m_run[h] = m_new;
      }
    }
    __syncthreads();

    // O = O alpha + P V over this warp's dims
    const float a_top = alpha[gid], a_bottom = alpha[gid + 8];
    for (int t = 0; t < tiles; ++t) o[t][0] *= a_top, o[t][1] *= a_top, o[t][2] *= a_bottom, o[t][3] *= a_bottom;
    for (int ks = 0; ks < chunk / 16; ++ks) {
      const int k0 = ks * 16 + tig * 2;
      uint32_t pa[terms][4];
      for (int term = 0; term < terms; ++term) {
        const uint16_t* p0r = pt + (term * heads_per_block + gid) * ld_p + k0;
        pa[term][0] = ld32(p0r), pa[term][1] = ld32(p0r + 8 * ld_p), pa[term][2] = ld32(p0r + 8),
        pa[term][3] = ld32(p0r + 8 * ld_p + 8);
      }
      const int mi = lane >> 3, rr = lane & 7;
      for (int np = 0; np < tiles / 2; ++np) {
        const int d0 = d_warp + np * 16;
        uint32_t b[4];
        ldmatrix_x4_trans(b, kvt + (ks * 16 + (mi & 1) * 8 + rr) * ld + d0 + (mi >> 1) * 8);
        for (int term = 0; term < terms; ++term) {
          mma_bf16(o[2 * np], pa[term], b[0], b[1]);
          mma_bf16(o[2 * np + 1], pa[term], b[2], b[3]);
        }
      }
    }
  }
  __syncthreads();

  for (int half = 0; half < 2; ++half) {
    const int h = gid + half * 8;
    if (h0 + h >= p.heads) continue;
    const float m = m_run[h], l = l_run[h];
    const float inv = 1.0f / (l + (m == neg_inf ? 1.0f : expf(p.sink[h0 + h] - m)));
    for (int t = 0; t < tiles; ++t) {
      const int d = d_warp + t * 8 + tig * 2;
      const float v0 = o[t][half * 2], v1 = o[t][half * 2 + 1];
      if (splits == 1) {
        *reinterpret_cast<float2*>(p.out + (std::size_t(r) * p.heads + h0 + h) * DIM + d) = make_float2(v0 * inv, v1 * inv);
      } else {
        const std::size_t at = (std::size_t(r) * splits + split) * p.heads + h0 + h;
        *reinterpret_cast<float2*>(part_o + at * DIM + d) = make_float2(v0, v1);
      }
    }
  }
  if (splits > 1 && tid < heads_per_block && h0 + tid < p.heads) {
    const std::size_t at = (std::size_t(r) * splits + split) * p.heads + h0 + tid;
    part_ml[at * 2] = m_run[tid];
    part_ml[at * 2 + 1] = l_run[tid];
  }
}

constexpr int max_splits = 32;

/// grid (rows, heads): out = sum_s O_s e^(m_s - M) / (e^(sink - M) + sum_s l_s e^(m_s - M)),
/// rotated back by RoPE when rope_dim > 0 (rope_cs: each row's cos, then sin); blocks (r, 0)
/// also store row r's ring record when rs has them.
__global__ void combine_kernel(const float* part_o, const float* part_ml, int splits, int heads, int dim,
                               const float* sink, float* out, const float* rope_cs, int rope_dim, ring_store rs) {
  cuda::detail::dependent_start();
  if (rs.rec && blockIdx.y == 0) rs.copy_row(blockIdx.x);
  __shared__ float weight[max_splits], ell[max_splits];
  __shared__ float inv_denom;
  __shared__ float rope_c[max_rope_half], rope_s[max_rope_half];
  const int r = blockIdx.x, h = blockIdx.y;
  const float* ml = part_ml + std::size_t(r) * splits * heads * 2;
  if (threadIdx.x < 32) {  // lane s holds split s (splits <= 32); the max is exact in any order
    const int s = threadIdx.x;
    const float m = s < splits ? ml[(std::size_t(s) * heads + h) * 2] : neg_inf;
    const float l = s < splits ? ml[(std::size_t(s) * heads + h) * 2 + 1] : 0.0f;  // loaded beside m
    float M = fmaxf(sink[h], m);
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (s < splits) {
      weight[s] = m == neg_inf ? 0.0f : expf(m - M);
      ell[s] = l;
    }
    __syncwarp();
    if (s == 0) {  // the denominator in split order
      float denom = expf(sink[h] - M);
      for (int t = 0; t < splits; ++t) denom += ell[t] * weight[t];
      inv_denom = 1.0f / denom;
    }
  } else if (rope_dim > 0) {
    load_rope(rope_cs, r, rope_dim, rope_c, rope_s, int(threadIdx.x) - 32, int(blockDim.x) - 32);
  }
  __syncthreads();
  // a pair of dimensions a thread; the loads of S splits issued together, then added in split
  // order (each value its own sum; a split of weight 0 is neither loaded nor added)
  constexpr int S = 16;
  const int pairs = dim / 2, rope_lo = dim - rope_dim;
  const float2* po = reinterpret_cast<const float2*>(part_o + (std::size_t(r) * splits * heads + h) * dim);
  const std::size_t split_stride = std::size_t(heads) * pairs;  // float2 from one split to the next
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
    float2 acc = {};
    for (int s0 = 0; s0 < splits; s0 += S) {
      float2 v[S];
#pragma unroll
      for (int i = 0; i < S; ++i) {
        const int s = s0 + i;
        v[i] = s < splits && weight[s] != 0.0f ? po[s * split_stride + j] : float2{};
      }
#pragma unroll
      for (int i = 0; i < S; ++i) {
        const int s = s0 + i;
        if (s >= splits) break;
        const float w = weight[s];
        if (w == 0.0f) continue;
        acc.x += w * v[i].x, acc.y += w * v[i].y;
      }
    }
    float o[2] = {acc.x * inv_denom, acc.y * inv_denom};
    if (rope_dim > 0 && 2 * j >= rope_lo) {  // inverse: sin negated
      const int i = j - rope_lo / 2;
      cuda::detail::rope_rotate(o[0], o[1], rope_c[i], -rope_s[i], o);
    }
    reinterpret_cast<float2*>(out + (std::size_t(r) * heads + h) * dim)[j] = make_float2(o[0], o[1]);
  }
}

/// grid (rows, ceil(heads / 8)): the inverse RoPE of out [rows, heads, dim] (rope_cs as above),
/// where no combine pass ran: cuda::rope's inverse with the same cos and sin (and the ring
/// store, as combine_kernel).
__global__ void rotate_back_kernel(float* out, int heads, int dim, const float* rope_cs, int rope_dim,
                                   ring_store rs) {
  cuda::detail::dependent_start();
  if (rs.rec && blockIdx.y == 0) rs.copy_row(blockIdx.x);
  __shared__ float rope_c[max_rope_half], rope_s[max_rope_half];
  const int r = blockIdx.x, h0 = blockIdx.y * 8, half = rope_dim / 2;
  load_rope(rope_cs, r, rope_dim, rope_c, rope_s);
  __syncthreads();
  for (int job = threadIdx.x; job < 8 * half; job += blockDim.x) {
    const int h = h0 + job / half, i = job % half;
    if (h >= heads) break;
    float* v = out + (std::size_t(r) * heads + h) * dim + (dim - rope_dim) + 2 * i;
    cuda::detail::rope_rotate(v[0], v[1], rope_c[i], -rope_s[i], v);
  }
}

template <int DIM>
void launch_attention(const sparse_attention_params& p, const kv_items& items, const float* rope_cs, int rope_dim) {
  using L = attn_smem<DIM>;
  cuda::detail::allow_dynamic_smem(reinterpret_cast<const void*>(attention_kernel<DIM>), int(L::bytes));
  if (rope_cs == nullptr) rope_dim = 0;
  CEDAR_CUDA_REQUIRE(rope_dim % 2 == 0 && rope_dim / 2 <= max_rope_half && rope_dim <= DIM,
                     "fused attention: rope_dim even, at most 128 and head_dim");
  const bool all_heads = !attention_rotates_queries(p);
  CEDAR_CUDA_REQUIRE(p.q_rope_cs == nullptr || (!all_heads && rope_dim > 0),
                     "fused attention: unrotated queries need the per-16-heads kernel and rope_cs");
  sparse_attention_params kp = p;
  kp.q_rope_dim = p.q_rope_cs ? rope_dim : 0;
  const int groups = (p.heads + heads_per_block - 1) / heads_per_block;
  const int max_chunks = (p.window + p.topk_k + chunk - 1) / chunk;
  // up to attention_split_rows rows, a row's candidates split as for the row alone (its bits
  // then do not depend on its batch); past it, the splits fill the device with the batch's blocks
  const long long split_rows = p.rows <= tuning_now().attention_split_rows ? 1 : p.rows;
  const long long blocks = split_rows * groups;
  const int want = int(std::min<long long>(max_splits, (2LL * num_sms() + blocks - 1) / blocks));
  const int splits = all_heads ? 1 : std::max(1, std::min(want, max_chunks));
  scratch<float> part_o(splits > 1 ? std::size_t(p.rows) * splits * p.heads * DIM : 0);
  scratch<float> part_ml(splits > 1 ? std::size_t(p.rows) * splits * p.heads * 2 : 0);
  if (all_heads) {
    attention_wg(p, items);
  } else {
    cuda::detail::launch_dependent(attention_kernel<DIM>, dim3(unsigned(p.rows), unsigned(groups), unsigned(splits)),
                                   dim3(attn_warps<DIM> * 32), L::bytes, kp, items, part_o.get(), part_ml.get());
  }
  ring_store rs;
  if (p.store_ring) {
    CEDAR_CUDA_REQUIRE(p.kv_records != nullptr && p.ring_record_bytes > 0,
                       "fused attention: store_ring needs kv_records");
    rs = {p.kv_records, p.ring_record_bytes, items, p.layer, p.window};
  }
  if (splits > 1) {
    cuda::detail::launch_dependent(combine_kernel, dim3(unsigned(p.rows), unsigned(p.heads)), dim3(256), 0,
                                   part_o.get(), part_ml.get(), splits, p.heads, DIM, p.sink, p.out, rope_cs, rope_dim,
                                   rs);
  } else if (rope_dim > 0) {
    cuda::detail::launch_dependent(rotate_back_kernel, dim3(unsigned(p.rows), unsigned((p.heads + 7) / 8)), dim3(256),
                                   0, p.out, p.heads, DIM, rope_cs, rope_dim, rs);
  } else if (rs.rec) {
    cuda::detail::launch_dependent(store_ring_kernel, dim3(unsigned(p.rows)), dim3(128), 0, rs);
  }
}

// ---- indexer scores ------------------------------------------------------------------------

constexpr int idx_keys = 256;        // keys per tile: 8 warps x 32
constexpr int idx_threads = 256;
constexpr int idx_warp_tiles = idx_keys / (idx_threads / 32) / 8;  // 8-key mma tiles per warp
constexpr int idx_max_heads = 32;

template <int DIM>
struct idx_smem {
  static constexpr int ld = DIM + 8;
  static constexpr std::size_t q = 0;
  static constexpr std::size_t keys = q + std::size_t(idx_max_heads) * ld * 2;
  static constexpr std::size_t w = keys + std::size_t(idx_keys) * ld * 2;
  static constexpr std::size_t ptr = w + idx_max_heads * 4;
  static constexpr std::size_t bytes = ptr + idx_keys * sizeof(void*);
};

/// grid (rows, ceil(num_keys / keys_per_block)); MT = 16-head tiles of q (heads <= 16 MT).
template <int DIM, int MT>
__global__ void __launch_bounds__(idx_threads) index_kernel(index_scores_params p, kv_items it, int keys_per_block) {
  cuda::detail::dependent_start();
  using L = idx_smem<DIM>;
  constexpr int ld = L::ld;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem + L::q);
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem + L::keys);
  float* ws = reinterpret_cast<float*>(smem + L::w);
  const uint8_t** ptr = reinterpret_cast<const uint8_t**>(smem + L::ptr);

  const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const int item = it.row_item[p.first_row + r];
  uint8_t* const* pages = it.pages + it.page_begin[item];
  const int64_t visible64 = (row_position(it, p.first_row + r, item) + 1) / p.ratio;
  const int visible = int(visible64 < p.num_keys ? visible64 : p.num_keys);
  const int first = blockIdx.y * keys_per_block, end = min(p.num_keys, first + keys_per_block);
  float* srow = p.scores + std::size_t(r) * p.num_keys;
  for (int j = max(first, visible) + tid; j < end; j += idx_threads) srow[j] = neg_inf;
  if (first >= visible) return;

  for (int i = tid; i < MT * 16 * DIM / 2; i += idx_threads) {
    const int h = i / (DIM / 2), d = (i % (DIM / 2)) * 2;
    float2 v = make_float2(0.0f, 0.0f);
    if (h < p.heads) v = *reinterpret_cast<const float2*>(p.q + (std::size_t(r) * p.heads + h) * DIM + d);
    *reinterpret_cast<uint32_t*>(qs + h * ld + d) = bf16x2(v.x, v.y);
  }
  for (int h = tid; h < MT * 16; h += idx_threads) ws[h] = h < p.heads ? p.w[std::size_t(r) * p.heads + h] : 0.0f;

  const int last = min(end, visible);
  for (int t0 = first; t0 < last; t0 += idx_keys) {
    __syncthreads();
    for (int i = tid; i < idx_keys; i += idx_threads) {
      const int64_t j = t0 + i;
      ptr[i] = j < last ? entry_record(pages, p.source, j, p.source.key_offset, p.source.key_bytes) : nullptr;
    }
    __syncthreads();
#pragma unroll 4
    for (int i = tid; i < idx_keys * (DIM / 8); i += idx_threads) {
      const int c = i / (DIM / 8), d = (i % (DIM / 8)) * 8;
      const uint8_t* rec = ptr[c];
      uint4 val = make_uint4(0, 0, 0, 0);
      if (rec) val = p.format == kv_format::fp8 ? fp8_record8(rec, DIM, d) : fp4_key8(rec, DIM, d);
      *reinterpret_cast<uint4*>(ks + c * ld + d) = val;
    }
    __syncthreads();

    float acc[MT][idx_warp_tiles][4] = {};
    for (int kstep = 0; kstep < DIM / 16; ++kstep) {
      const int k0 = kstep * 16 + tig * 2;
      uint32_t a[MT][4];
      for (int mt = 0; mt < MT; ++mt) {
        const uint16_t* q0 = qs + (mt * 16 + gid) * ld + k0;
        a[mt][0] = ld32(q0), a[mt][1] = ld32(q0 + 8 * ld), a[mt][2] = ld32(q0 + 8), a[mt][3] = ld32(q0 + 8 * ld + 8);
      }
      for (int nt = 0; nt < idx_warp_tiles; ++nt) {
        const uint16_t* krow = ks + (warp * idx_warp_tiles * 8 + nt * 8 + gid) * ld + k0;
        const uint32_t b0 = ld32(krow), b1 = ld32(krow + 8);
        for (int mt = 0; mt < MT; ++mt) mma_bf16(acc[mt][nt], a[mt], b0, b1);
      }
    }
    for (int nt = 0; nt < idx_warp_tiles; ++nt) {
      float s0 = 0.0f, s1 = 0.0f;
      for (int mt = 0; mt < MT; ++mt)
        for (int half = 0; half < 2; ++half) {
          const float wh = ws[mt * 16 + gid + half * 8];
          s0 += wh * fmaxf(acc[mt][nt][half * 2], 0.0f);
          s1 += wh * fmaxf(acc[mt][nt][half * 2 + 1], 0.0f);
        }
      for (int off = 4; off < 32; off <<= 1) {
        s0 += __shfl_xor_sync(0xFFFFFFFFu, s0, off);
        s1 += __shfl_xor_sync(0xFFFFFFFFu, s1, off);
      }
      const int j = t0 + warp * idx_warp_tiles * 8 + nt * 8 + tig * 2;
      if (gid == 0) {
        if (j < last) srow[j] = s0;
        if (j + 1 < last) srow[j + 1] = s1;
      }
    }
  }
}

template <int DIM, int MT>
void launch_index(const index_scores_params& p, const kv_items& items) {
  using L = idx_smem<DIM>;
  cuda::detail::allow_dynamic_smem(reinterpret_cast<const void*>(index_kernel<DIM, MT>), int(L::bytes));
  // 4 tiles per block (q loaded once per 1024 keys) when that still fills the GPU twice over
  const long long tiles = (long long)p.rows * ((p.num_keys + idx_keys - 1) / idx_keys);
  const int per_block = idx_keys * (tiles >= 8LL * num_sms() ? 4 : 1);
  cuda::detail::launch_dependent(index_kernel<DIM, MT>,
                                 dim3(unsigned(p.rows), unsigned((p.num_keys + per_block - 1) / per_block)),
                                 dim3(idx_threads), L::bytes, p, items, per_block);
}

// ---- small steps ----------------------------------------------------------------------------

__global__ void visible_kernel(kv_items it, int rows, int ratio, int32_t* out) {
  cuda::detail::dependent_start();
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  out[r] = int32_t((row_position(it, r, it.row_item[r]) + 1) / ratio);
}

/// Record r goes to entry first_entry + r of `pages`, or (pages_of given) to entry entry_of[r]
/// of the page table pages_of[r].
__global__ void store_entries_kernel(const uint8_t* rec, std::size_t rec_bytes, uint8_t* const* pages,
                                     int64_t first_entry, uint8_t* const* const* pages_of, const int64_t* entry_of,
                                     int entries_per_page, std::size_t offset) {
  cuda::detail::dependent_start();
  if (pages_of) pages = pages_of[blockIdx.x];
  const int64_t j = pages_of ? entry_of[blockIdx.x] : first_entry + blockIdx.x, page = j / entries_per_page;
  uint8_t* dst = pages[page] + offset + std::size_t(j - page * entries_per_page) * rec_bytes;
  const uint8_t* src = rec + std::size_t(blockIdx.x) * rec_bytes;
  for (std::size_t i = threadIdx.x; i < rec_bytes; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

int attention_rows_min() { return 64; }

bool attention_rotates_queries(const sparse_attention_params& p) {
  const bool all_heads = p.variant == attention_all_heads ||
                         (p.variant == attention_auto && p.rows >= attention_rows_min() && attention_wg_supports(p));
  return !all_heads;
}

bool attention_variant_available(const sparse_attention_params& p, int variant) {
  if (variant == attention_all_heads) return attention_wg_supports(p);
  return variant == attention_auto || variant == attention_per16;
}

bool supports(int dim, int index_dim) { return (dim == 512 || dim == 64) && (index_dim == 128 || index_dim == 32); }

void sparse_attention(const sparse_attention_params& p, const kv_items& items, const float* rope_cs, int rope_dim) {
  CEDAR_CUDA_REQUIRE(p.dim == 512 || p.dim == 64, "fused attention: head_dim 512 or 64");
  CEDAR_CUDA_REQUIRE(p.topk_k == 0 || p.topk != nullptr, "top-k list");
  if (p.rows <= 0 || p.heads <= 0) return;
  if (p.dim == 512) launch_attention<512>(p, items, rope_cs, rope_dim);
  else launch_attention<64>(p, items, rope_cs, rope_dim);
}

void index_scores(const index_scores_params& p, const kv_items& items) {
  CEDAR_CUDA_REQUIRE(p.dim == 128 || p.dim == 32, "fused indexer: index_head_dim 128 or 32");
  CEDAR_CUDA_REQUIRE(p.heads > 0 && p.heads <= idx_max_heads, "fused indexer: at most 32 heads");
  if (p.rows <= 0 || p.num_keys <= 0) return;
  const bool one = p.heads <= 16;
  if (p.dim == 128) one ? launch_index<128, 1>(p, items) : launch_index<128, 2>(p, items);
  else one ? launch_index<32, 1>(p, items) : launch_index<32, 2>(p, items);
}

void visible_entries(const kv_items& items, int rows, int ratio, int32_t* num_visible) {
  if (rows <= 0) return;
  cuda::detail::launch_dependent(visible_kernel, dim3(unsigned((rows + 255) / 256)), dim3(256), 0, items, rows, ratio,
                                 num_visible);
}

void store_entries(const uint8_t* rec, int m, std::size_t rec_bytes, uint8_t* const* pages, int64_t first_entry,
                   int entries_per_page, std::size_t offset) {
  if (m <= 0) return;
  cuda::detail::launch_dependent(store_entries_kernel, dim3(unsigned(m)), dim3(128), 0, rec, rec_bytes, pages,
                                 first_entry, nullptr, nullptr, entries_per_page, offset);
}

void store_entries_rows(const uint8_t* rec, int m, std::size_t rec_bytes, uint8_t* const* const* pages_of,
                        const int64_t* entry_of, int entries_per_page, std::size_t offset) {
  if (m <= 0) return;
  cuda::detail::launch_dependent(store_entries_kernel, dim3(unsigned(m)), dim3(128), 0, rec, rec_bytes, nullptr, 0,
                                 pages_of, entry_of, entries_per_page, offset);
}

}  // namespace cedar::cuda::fast
