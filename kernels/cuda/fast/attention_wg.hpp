// The all-heads fused attention on Hopper's wgmma (attention_wg.cu), behind sparse_attention's
// dispatch (attention.cu). Plain C++ header; CUDA builds only.
#pragma once

#include "kernels/cuda/fast/attention.hpp"

namespace cedar::cuda::fast {

#ifdef CEDAR_HAVE_CUDA

/// True when attention_wg takes these shapes on this device (64 heads of 512).
bool attention_wg_supports(const sparse_attention_params& p);

/// One block per row over all heads; writes p.out for every row (no split, no rotation back, no
/// ring store: the caller's passes do those).
void attention_wg(const sparse_attention_params& p, const kv_items& items);

#endif  // CEDAR_HAVE_CUDA

}  // namespace cedar::cuda::fast
