// The routed experts' grouped products at prefill on Hopper's wgmma (experts_wg.cu), behind
// moe_ffn (experts_fast.cu). Plain C++ header; CUDA builds only.
#pragma once

#include <cstdint>

#include "kernels/ops.hpp"

namespace cedar::cuda::fast::detail {

/// True when experts_wg takes these experts on this device: sm_90a, d and inter multiples of
/// 256, every weight's codes 16-byte and its scales 8-byte aligned.
bool experts_wg_supports(const cpu::expert_weights* experts, int num_experts, int d, int inter);

/// For every expert e and each of its counts[e] rows r of a (sorted by expert; expert e's rows
/// follow those of the experts before it): y[r, :n] = a[r, :k] W^T, W the expert's [w1; w3]
/// (which 0: n = 2 inter, k = d) or w2 (which 1: n = d, k = inter) from the device table, bf16
/// operands, fp32 sums. slots bounds the rows in all (sizes the launch); counts are read on the
/// device.
void experts_wg(const uint16_t* a, const int* counts, const cpu::expert_weights* table, int num_experts, int which,
                int n, int k, int slots, float* y, int ldy);

}  // namespace cedar::cuda::fast::detail
