// The fast kernel set's second stream (side_lane.cuh) and its branches (fast_ops.hpp).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/side_lane.cuh"

namespace cedar::cuda::fast {
namespace detail {

side_lane& side_lane_now() {
  thread_local side_lane lane;
  int dev = 0;
  CEDAR_CUDA_CHECK(cudaGetDevice(&dev));
  if (lane.device != dev) {
    lane = side_lane{};
    CEDAR_CUDA_CHECK(cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking));
    for (cudaEvent_t* e : {&lane.start, &lane.ready[0], &lane.ready[1], &lane.done[0], &lane.done[1], &lane.fork,
                           &lane.join})
      CEDAR_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    lane.device = dev;
  }
  return lane;
}

namespace {
thread_local void* branch_from = nullptr;  ///< the stream side_begin left (valid while in a branch)
thread_local bool in_branch = false;
thread_local bool unjoined = false;  ///< side work ended but not yet waited for
}  // namespace

}  // namespace detail

void side_begin() {
  CEDAR_CUDA_REQUIRE(!detail::in_branch, "side_begin: already in a side branch");
  detail::side_lane& lane = detail::side_lane_now();
  CEDAR_CUDA_CHECK(cudaEventRecord(lane.fork, cuda::detail::stream()));
  CEDAR_CUDA_CHECK(cudaStreamWaitEvent(lane.stream, lane.fork, 0));
  detail::branch_from = cuda::current_stream();
  detail::in_branch = true;
  cuda::set_stream(lane.stream);
}

void side_end() {
  CEDAR_CUDA_REQUIRE(detail::in_branch, "side_end: not in a side branch");
  detail::side_lane& lane = detail::side_lane_now();
  CEDAR_CUDA_CHECK(cudaEventRecord(lane.join, lane.stream));
  cuda::set_stream(detail::branch_from);
  detail::in_branch = false;
  detail::unjoined = true;
}

void side_wait() {
  CEDAR_CUDA_REQUIRE(!detail::in_branch, "side_wait: still in the side branch");
  CEDAR_CUDA_CHECK(cudaStreamWaitEvent(cuda::detail::stream(), detail::side_lane_now().join, 0));
  detail::unjoined = false;
}

bool side_pending() { return detail::unjoined; }

}  // namespace cedar::cuda::fast
