// The routed experts' grouped products at prefill on Hopper's wgmma (experts_wg.cu), behind
// moe_ffn (experts_fast.cu). Plain C++ header; CUDA builds only.
#pragma once

#include <cstdint>

#include "kernels/ops.hpp"

namespace cedar::cuda::fast::detail {

/// Where experts_wg reads column p of its activations: each 64-column block holds its columns in
/// the order the weight's A fragments take them (a thread's 16 columns are one row's 8 code bytes,
/// a pair of columns per byte), column p = 16 l + 4 kk + 2 h + e at 16 kk + 8 h + 2 l + e. The
/// kernels that write the activations (fake_quant_bf16, the SwiGLU) store them so.
constexpr int wg_column(int p) {
  const int b = p & 63, l = b >> 4, kk = (b >> 2) & 3, h = (b >> 1) & 1, e = b & 1;
  return (p & ~63) | (16 * kk + 8 * h + 2 * l + e);
}

#ifdef __CUDACC__
/// Stores 8 bf16 values (a uint4) of columns 8 c8 .. 8 c8 + 7 of an activation row, in order or,
/// with wg_order, as pairs at their wg_column places.
__device__ __forceinline__ void store8(uint16_t* row, int c8, uint4 q, bool wg_order) {
  if (!wg_order) {
    reinterpret_cast<uint4*>(row)[c8] = q;
    return;
  }
  uint32_t* pairs = reinterpret_cast<uint32_t*>(row);
  const uint32_t v[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) pairs[wg_column(8 * c8 + 2 * i) / 2] = v[i];
}
#endif

/// True when experts_wg takes these experts on this device: sm_90a, d and inter multiples of
/// 128, every weight's codes 16-byte and its scales 4-byte aligned.
bool experts_wg_supports(const cpu::expert_weights* experts, int num_experts, int d, int inter);

/// The token tiles experts_wg takes (tile_tokens, tuning::expert_wg_tile).
constexpr int wg_tile_tokens[] = {16, 32, 64, 128, 256};
constexpr bool is_wg_tile(int tokens) {
  for (int t : wg_tile_tokens)
    if (t == tokens) return true;
  return false;
}

/// For every expert e and each of its counts[e] rows r of a (sorted by expert; expert e's rows
/// follow those of the experts before it; columns in wg_column's order, `slots` rows allocated):
/// y[r, :n] = a[r, :k] W^T, W the expert's [w1; w3]
/// (which 0: n = 2 inter, k = d) or w2 (which 1: n = d, k = inter) from the device table, bf16
/// operands, fp32 sums. Counts are read on the device. A block takes tile_tokens of an expert's
/// rows (16, 32, 64, 128 or 256; 0: by the rows an expert has on average, slots / num_experts).
/// A row's sums do not depend on the tile.
void experts_wg(const uint16_t* a, const int* counts, const cpu::expert_weights* table, int num_experts, int which,
                int n, int k, int slots, float* y, int ldy, int tile_tokens = 0);

}  // namespace cedar::cuda::fast::detail
