// The single-row top-k shared by topk_indices and candidate_blocks (kernels/cpu/topk.cpp),
// callable from inside a parallel loop.
#pragma once

#include <cstdint>

namespace cedar::cpu::detail {

/// out[0..k) = the k best entries of s (score descending, ties to the lowest index; -inf and
/// NaN never chosen), written in ascending index order, then -1 padding.
void topk_row(const float* s /*[n]*/, int n, int k, int32_t* out /*[k]*/);

}  // namespace cedar::cpu::detail
