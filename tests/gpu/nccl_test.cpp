// The NCCL collectives on one GPU (a one-rank group): each collective's device result against
// what the interface promises for one rank (sums and gathers of one rank are its own data,
// all-to-all is a copy), with the counts exchanged through the device. Multi-GPU runs of the
// same body come with a multi-GPU machine.
#include <doctest/doctest.h>

#ifdef CEDAR_HAVE_NCCL
#include <cuda_runtime.h>

#include <random>
#include <vector>

#include "kernels/collectives/nccl.hpp"
#include "tests/gpu/gpu_test_util.hpp"

namespace {

struct device_buffer {
  float* ptr = nullptr;
  std::size_t n = 0;
  explicit device_buffer(const std::vector<float>& host) : n(host.size()) {
    REQUIRE(cudaMalloc(&ptr, n * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemcpy(ptr, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~device_buffer() { cudaFree(ptr); }
  std::vector<float> read() const {
    std::vector<float> h(n);
    REQUIRE(cudaMemcpy(h.data(), ptr, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
};

}  // namespace

TEST_CASE("nccl: a one-rank group's collectives on the device") {
  using namespace cedar;
  if (!cedar::gpu_test::have_gpu()) return;
  REQUIRE(nccl_available());
  auto comm = make_nccl_communicator(nccl_make_group_id(), 0, 1, 0);
  CHECK(comm->rank() == 0);
  CHECK(comm->size() == 1);
  std::mt19937 rng(3);
  std::normal_distribution<float> d;
  std::vector<float> host(1000);
  for (float& x : host) x = d(rng);

  device_buffer a(host);
  comm->all_reduce_sum(a.ptr, a.n);
  CHECK(a.read() == host);

  device_buffer gathered(std::vector<float>(host.size(), -1.0f)), scattered(std::vector<float>(host.size(), -1.0f));
  comm->all_gather(a.ptr, a.n, gathered.ptr);
  CHECK(gathered.read() == host);
  comm->reduce_scatter_sum(a.ptr, a.n, scattered.ptr);
  CHECK(scattered.read() == host);
  comm->broadcast(a.ptr, a.n, 0);
  CHECK(a.read() == host);

  const std::size_t send_counts[1] = {700};
  std::size_t recv_counts[1] = {0};
  comm->exchange_counts(send_counts, recv_counts);
  CHECK(recv_counts[0] == 700u);
  device_buffer received(std::vector<float>(700, -1.0f));
  comm->all_to_all(a.ptr, send_counts, received.ptr, recv_counts);
  CHECK(received.read() == std::vector<float>(host.begin(), host.begin() + 700));
}
#endif
