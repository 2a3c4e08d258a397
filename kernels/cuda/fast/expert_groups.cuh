// The routed slots grouped by expert inside one block: moe_route's top-k launch does it at up to
// 8 rows (fast_ops.hpp, expert_plan), writing what experts_fast.cu's group_kernel writes with a
// block per expert, so that moe_ffn needs no grouping launch of its own.
#pragma once

#include "kernels/cuda/fast/fast_ops.hpp"

namespace cedar::cuda::fast::detail {

/// Most experts a grouping block takes (its shared counts).
inline constexpr int group_block_max_experts = 1024;

/// One block's grouping, in two parts: load() reads what no kernel writes (the experts' weight
/// pointers, into this thread's registers, and which experts are present, into shared memory) and
/// may run before the block's dependency wait; group() runs after the slots' experts are in
/// sel_s (shared, [slots]) and a __syncthreads. Threads = blockDim.x (a multiple of 32, at
/// least slots); experts <= group_block_max_experts and at most Threads * MaxPer.
template <int Threads, int MaxPer>
struct block_grouping {
  static_assert(Threads % 32 == 0 && Threads * MaxPer >= group_block_max_experts, "every expert has a thread");
  struct shared_part {
    int cnt[group_block_max_experts];       ///< slots an expert, then its first place
    bool present[group_block_max_experts];  ///< a w1 in the table (else its slots go nowhere)
    int warp_sums[Threads / 32];
  };
  expert_group g1[MaxPer], g3[MaxPer], g2[MaxPer];  ///< this thread's experts, num_slots unset
  int per = 0, e0 = 0, num_experts = 0;

  /// Every thread; a __syncthreads must come between it and group().
  __device__ void load(const cpu::expert_weights* table, int experts, shared_part& sh) {
    num_experts = experts;
    per = (experts + Threads - 1) / Threads, e0 = per * int(threadIdx.x);
#pragma unroll
    for (int i = 0; i < MaxPer; ++i) {
      const int e = e0 + i;
      if (i >= per || e >= experts) break;
      const cpu::expert_weights& w = table[e];
      g1[i] = {w.w1.data, w.w1.scale, 0, 0}, g3[i] = {w.w3.data, w.w3.scale, 0, 0}, g2[i] = {w.w2.data, w.w2.scale, 0, 0};
      sh.present[e] = w.w1.data != nullptr;
      sh.cnt[e] = 0;
    }
  }

  /// Every thread: a's arrays as group_kernel writes them: an expert's slots in ascending slot
  /// order from the sum of the counts of the experts before it; the groups compacted (the
  /// experts with slots first, in expert order, then the others in expert order); slots of no
  /// expert here (a negative id, or no w1) get slot_pos -1.
  __device__ void group(const int* sel_s, int slots, int topk, const plan_arrays& a, shared_part& sh) {
    const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    int mine = -1;  // this thread's slot's expert, when the slot has one here
    if (tid < slots) {
      mine = sel_s[tid];
      if (mine >= 0 && mine < num_experts && sh.present[mine]) atomicAdd(&sh.cnt[mine], 1);
      else mine = -1;
    }
    __syncthreads();
    // this thread's experts: slots (low 16 bits; slots <= Threads) and experts with slots (above),
    // summed, then scanned over the block
    constexpr int used_one = 1 << 16;
    int c[MaxPer], local = 0;
#pragma unroll
    for (int i = 0; i < MaxPer; ++i) {
      c[i] = i < per && e0 + i < num_experts ? sh.cnt[e0 + i] : 0;
      local += c[i] + (c[i] > 0 ? used_one : 0);
    }
    int incl = local;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) sh.warp_sums[warp] = incl;
    __syncthreads();
    int run = incl - local, all = 0;  // run: the experts before this thread's
#pragma unroll
    for (int w = 0; w < Threads / 32; ++w) {
      if (w < warp) run += sh.warp_sums[w];
      all += sh.warp_sums[w];
    }
    const int used = all / used_one;
#pragma unroll
    for (int i = 0; i < MaxPer; ++i) {
      const int e = e0 + i;
      if (i >= per || e >= num_experts) break;
      const int off = run % used_one, used_before = run / used_one;
      a.counts[e] = c[i];
      const int at = c[i] > 0 ? used_before : used + (e - used_before);  // the empty ones after
      a.g1[at] = {g1[i].w, g1[i].scale, off, c[i]};
      a.g3[at] = {g3[i].w, g3[i].scale, off, c[i]};
      a.g2[at] = {g2[i].w, g2[i].scale, off, c[i]};
      sh.cnt[e] = off;  // expert e's count is read by this thread only, which has read it
      run += c[i] + (c[i] > 0 ? used_one : 0);
    }
    if (tid == 0) *a.total = all % used_one;
    __syncthreads();
    if (tid < slots) {
      if (mine < 0) {
        a.slot_pos[tid] = -1;
      } else {
        int p = sh.cnt[mine];  // the expert's first place, then one for each earlier slot of it
        for (int s = 0; s < tid; ++s) p += sel_s[s] == mine;
        a.slot_src[p] = tid, a.slot_row[p] = tid / topk, a.iota[p] = p, a.slot_pos[tid] = p;
      }
    }
  }
};

}  // namespace cedar::cuda::fast::detail
