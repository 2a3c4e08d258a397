// Device helpers shared by the fused attention kernels (attention.cu: 16 heads a block, any
// head_dim; attention_wg.cu: all 64 heads of a row on Hopper's wgmma): reading KV records (FP8,
// FP4, the call's fresh rows) and turning them into exact bf16, a row's candidate slots (its
// window, then its top-k entries), and the split of fp32 values into bf16 terms.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fast/attention.hpp"
#include "kernels/cuda/fast/mma.cuh"

namespace cedar::cuda::fast::attn {

using cuda::detail::e4m3x2_to_f32;

constexpr float neg_inf = -__builtin_huge_valf();

/// Two floats as bf16 (round to nearest), the first in the low half.
__device__ __forceinline__ uint32_t bf16x2(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float e4m3_value(uint8_t code) { return e4m3x2_to_f32(code).x; }

/// 8 e4m3 codes (bytes of lo, then hi) times s, as 8 bf16 (exact: at most 4 significant bits
/// times a power of two, or 2 bits times an e4m3 scale).
__device__ __forceinline__ uint4 dequant8(uint32_t lo, uint32_t hi, float s) {
  const float2 a = e4m3x2_to_f32(lo), b = e4m3x2_to_f32(lo >> 16);
  const float2 c = e4m3x2_to_f32(hi), d = e4m3x2_to_f32(hi >> 16);
  return make_uint4(bf16x2(a.x * s, a.y * s), bf16x2(b.x * s, b.y * s), bf16x2(c.x * s, c.y * s),
                    bf16x2(d.x * s, d.y * s));
}

/// 4 bytes of a record (records of small dims, 66 or 17 bytes, are not 4-byte aligned).
__device__ __forceinline__ uint32_t load_u32(const uint8_t* p) {
  if ((reinterpret_cast<uintptr_t>(p) & 3) == 0) return *reinterpret_cast<const uint32_t*>(p);
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

/// 16 bytes of a record: one vector load when aligned (the real dims' records are), else words.
__device__ __forceinline__ uint4 load_u128(const uint8_t* p) {
  if ((reinterpret_cast<uintptr_t>(p) & 15) == 0) return *reinterpret_cast<const uint4*>(p);
  return make_uint4(load_u32(p), load_u32(p + 4), load_u32(p + 8), load_u32(p + 12));
}

/// 32 values of a candidate, as loaded (codes and scale codes), before the dequantization.
struct record32 {
  uint4 a, b;      // FP8: codes 0..15 and 16..31; FP4: a holds the 32 packed E2M1 values
  uint32_t scale;  // FP8: the UE8M0 code; FP4: the E4M3 codes of values 0..15 (low byte) and 16..31
};

/// Values d .. d+31 of an FP8 (codes [dim], a UE8M0 scale per 32) or FP4 (packed E2M1 [dim / 2],
/// an E4M3 scale per 16) record. Loads only: the conversion waits for the data. Aligned: the
/// codes are 16-byte aligned (head_dim 512: records of 528 and 288 bytes), so plain vector
/// loads, with no branch on the address.
template <bool FP4, bool Aligned = false>
__device__ __forceinline__ record32 load_record32(const uint8_t* rec, int dim, int d) {
  const auto u128 = [](const uint8_t* q) {
    if constexpr (Aligned) return *reinterpret_cast<const uint4*>(q);
    else return load_u128(q);
  };
  record32 r;
  if constexpr (FP4) {
    r.a = u128(rec + d / 2), r.b = make_uint4(0, 0, 0, 0);
    // both scale bytes in one load (aligned: records of dim / 2 + dim / 16 bytes, an even count
    // for dims that are multiples of 32, and d / 16 even); two byte loads joined here would make
    // the thread wait for them now instead of at the conversion
    r.scale = *reinterpret_cast<const uint16_t*>(rec + dim / 2 + d / 16);
  } else {
    r.a = u128(rec + d), r.b = u128(rec + d + 16);
    r.scale = rec[dim + d / 32];
  }
  return r;
}

/// The 32 values of load_record32 as bf16 (exact), 8 at a time to out(i, values of d + 8i ..
/// d + 8i + 7) (shared memory), each stored as soon as it is converted.
template <bool FP4, class Out>
__device__ __forceinline__ void dequant_record32(const record32& r, Out&& out) {
  if constexpr (FP4) {
    const float s0 = e4m3_value(uint8_t(r.scale)), s1 = e4m3_value(uint8_t(r.scale >> 8));
    const uint32_t w[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint2 e = detail::e2m1x8_to_e4m3(w[i]);
      out(i, dequant8(e.x, e.y, i < 2 ? s0 : s1));
    }
  } else {
    const float s = cuda::detail::ue8m0_to_f32(uint8_t(r.scale));
    out(0, dequant8(r.a.x, r.a.y, s)), out(1, dequant8(r.a.z, r.a.w, s));
    out(2, dequant8(r.b.x, r.b.y, s)), out(3, dequant8(r.b.z, r.b.w, s));
  }
}

__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a < b ? b : a; }

__device__ __forceinline__ int64_t row_position(const kv_items& it, int r, int item) {
  return it.first_pos[item] + (r - it.row_begin[item]);
}

/// Entry j's record (at offset + in_page * bytes of its page) through an item's page table.
__device__ __forceinline__ const uint8_t* entry_record(uint8_t* const* pages, const kv_source_view& s, int64_t j,
                                                       std::size_t offset, std::size_t bytes) {
  const int64_t page = j / s.entries_per_page, in_page = j - page * s.entries_per_page;
  return pages[page] + offset + std::size_t(in_page) * bytes;
}

enum cand_kind : int { cand_none = 0, cand_fp8 = 1, cand_fp4 = 2, cand_fresh = 3 };

/// A row's candidate slots: its window positions max(floor, pos - W + 1) .. pos (older than
/// the item's first row from its ring, the others from this call's rows), then its top-k list.
struct row_candidates {
  int item, rb, nw, nc;  ///< item, its first batch row, window slots, all slots
  int64_t p0, lo;        ///< the item's first position, the lowest window position
  uint8_t* const* pages;  ///< the item's page table
  const uint8_t* ring;    ///< the item's ring

  __device__ __forceinline__ row_candidates(const sparse_attention_params& p, const kv_items& it, int r) {
    item = it.row_item[r];
    p0 = it.first_pos[item], rb = it.row_begin[item];
    pages = it.pages + it.page_begin[item], ring = it.rings[item];
    const int64_t pos = row_position(it, r, item);
    lo = max64(it.window_floor[item], pos - (p.window - 1));
    nw = int(max64(0, pos - lo + 1));
    nc = nw + p.topk_k;
  }

  /// Slot v's top-k entry (one load; -1 for window slots, past the end and empty entries).
  __device__ __forceinline__ int32_t entry(const sparse_attention_params& p, int r, int v) const {
    return v >= nw && v < nc ? p.topk[std::size_t(r) * p.topk_k + (v - nw)] : -1;
  }

  /// Slot v's record (or this call's fp32 row, cand_fresh) and kind, given entry(p, r, v) = j
  /// (at most one load: the page table's).
  template <int DIM>
  __device__ __forceinline__ int record(const sparse_attention_params& p, const kv_items& it, int v, int32_t j,
                                        const uint8_t*& ptr) const {
    ptr = nullptr;
    if (v < nw) {
      const int64_t ps = lo + v;
      if (ps < p0) {
        ptr = ring + (std::size_t(p.layer) * p.window + std::size_t(ps % p.window)) * p.ring_record_bytes;
        return cand_fp8;
      }
      if (p.kv_records != nullptr) {  // this call's own rows, packed
        ptr = p.kv_records + (std::size_t(rb) + std::size_t(ps - p0)) * p.ring_record_bytes;
        return cand_fp8;
      }
      ptr = reinterpret_cast<const uint8_t*>(p.kv + (std::size_t(rb) + std::size_t(ps - p0)) * DIM);
      return cand_fresh;
    }
    if (j < 0) return cand_none;
    ptr = entry_record(pages, p.source, j, p.source.latent_offset, p.source.latent_bytes);
    return p.format == kv_format::fp8 ? cand_fp8 : cand_fp4;
  }

  /// Slot v of row r: record and kind.
  template <int DIM>
  __device__ __forceinline__ int pick(const sparse_attention_params& p, const kv_items& it, int r, int v,
                                      const uint8_t*& ptr) const {
    return record<DIM>(p, it, v, entry(p, r, v), ptr);
  }
};

/// bf16 terms of q and of the softmax weights: hi = bf16(a), lo = bf16(a - hi) (the residual is
/// exact in fp32), so 2^-18 of each value is left over.
constexpr int terms = 2;

/// (a, b) as `terms` bf16 pairs, hi first.
__device__ __forceinline__ void split_terms(float a, float b, uint32_t t[terms]) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  t[0] = *reinterpret_cast<const uint32_t*>(&h);
  t[1] = bf16x2(a - hf.x, b - hf.y);
}

/// 32 values of a fresh fp32 row (d .. d + 31, on the FP8 grid: exact in bf16) to out as in
/// dequant_record32.
template <class Out>
__device__ __forceinline__ void fresh_row32(const float* row, int d, Out&& out) {
  const float4* src = reinterpret_cast<const float4*>(row + d);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float4 a = src[2 * q], b = src[2 * q + 1];
    out(q, make_uint4(bf16x2(a.x, a.y), bf16x2(a.z, a.w), bf16x2(b.x, b.y), bf16x2(b.z, b.w)));
  }
}

}  // namespace cedar::cuda::fast::attn
