// The fast kernel set's second stream (side_stream.cu): a stream of the calling thread's current
// device with the events that order it against the current stream.
#pragma once

#include <cuda_runtime.h>

namespace cedar::cuda::fast::detail {

/// The prefill experts dequantize the next expert's weights on it while the current stream runs
/// this expert's GEMM (start, ready, done); side_begin / side_end / side_wait (fast_ops.hpp) run
/// a branch of work on it (fork, join).
struct side_lane {
  int device = -1;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, ready[2] = {}, done[2] = {};
  cudaEvent_t fork = nullptr, join = nullptr;
};

/// The calling thread's lane on its current device (made at the first use; a thread drives one
/// device at a time).
side_lane& side_lane_now();

}  // namespace cedar::cuda::fast::detail
