// The routed slots grouped by expert inside one block: moe_route's top-k launch does it at up to
// 8 rows (fast_ops.hpp, expert_plan), writing what experts_fast.cu's group_kernel writes with a
// block per expert, so that moe_ffn needs no grouping launch of its own.
#pragma once

#include "kernels/cuda/fast/fast_ops.hpp"

namespace cedar::cuda::fast::detail {

/// Most experts a grouping block takes (its shared counts).
inline constexpr int group_block_max_experts = 1024;

/// Called by every thread of the block, after a __syncthreads that follows the last write of
/// sel [slots] (global memory). slots <= blockDim.x, num_experts <= group_block_max_experts,
/// blockDim.x a multiple of 32. cnt: shared [num_experts]; warp_sums: shared [blockDim.x / 32].
/// Writes a's arrays as group_kernel does: an expert's slots in ascending slot order from the
/// sum of the counts of the experts before it; the groups compacted (the experts with slots
/// first, in expert order, then the others in expert order); slots of no expert here (a
/// negative id, or a null w1 in table) get slot_pos -1.
__device__ inline void group_slots_block(const int32_t* sel, int slots, int topk, const cpu::expert_weights* table,
                                         int num_experts, const plan_arrays& a, int* cnt, int* warp_sums) {
  const int tid = int(threadIdx.x), threads = int(blockDim.x), lane = tid & 31, warp = tid >> 5;
  const auto valid = [&](int e) { return e >= 0 && e < num_experts && table[e].w1.data != nullptr; };
  for (int e = tid; e < num_experts; e += threads) cnt[e] = 0;
  __syncthreads();
  int mine = -1;  // this thread's slot's expert, when the slot has one here
  if (tid < slots) {
    mine = sel[tid];
    if (valid(mine)) atomicAdd(&cnt[mine], 1);
    else mine = -1;
  }
  __syncthreads();
  // each thread's run of `per` experts: slots (low 16 bits) and experts with slots (above),
  // summed, then scanned over the block; slots <= blockDim.x keeps the low part under 2^16
  constexpr int used_one = 1 << 16;
  const int per = (num_experts + threads - 1) / threads, e0 = per * tid;
  int local = 0;
  for (int i = 0; i < per && e0 + i < num_experts; ++i) {
    const int c = cnt[e0 + i];
    local += c + (c > 0 ? used_one : 0);
  }
  int incl = local;
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  int run = incl - local, all = 0;  // run: the experts before this thread's run
  for (int w = 0; w < threads / 32; ++w) {
    if (w < warp) run += warp_sums[w];
    all += warp_sums[w];
  }
  const int used = all / used_one;
  for (int i = 0; i < per && e0 + i < num_experts; ++i) {
    const int e = e0 + i, c = cnt[e], off = run % used_one, used_before = run / used_one;
    a.counts[e] = c;
    const cpu::expert_weights& w = table[e];
    const int at = c > 0 ? used_before : used + (e - used_before);  // the empty ones after
    a.g1[at] = {w.w1.data, w.w1.scale, off, c};
    a.g3[at] = {w.w3.data, w.w3.scale, off, c};
    a.g2[at] = {w.w2.data, w.w2.scale, off, c};
    cnt[e] = off;  // only this thread reads expert e's count, and it has
    run += c + (c > 0 ? used_one : 0);
  }
  if (tid == 0) *a.total = all % used_one;
  __syncthreads();
  if (tid < slots) {
    if (mine < 0) {
      a.slot_pos[tid] = -1;
    } else {
      int p = cnt[mine];  // the expert's first place, then one for each earlier slot of it
      for (int s = 0; s < tid; ++s) p += sel[s] == mine;
      a.slot_src[p] = tid, a.slot_row[p] = tid / topk, a.iota[p] = p, a.slot_pos[tid] = p;
    }
  }
}

}  // namespace cedar::cuda::fast::detail
