// The NCCL collectives on one GPU (a one-rank group): each collective's device result against
// what the interface promises for one rank (sums and gathers of one rank are its own data,
// all-to-all is a copy), with the counts exchanged through the device. With two or more GPUs,
// a group of every device (a thread a rank) against the interface's results for that many
// ranks; integer-valued data, so a sum is exact in any order NCCL adds in.
#include <doctest/doctest.h>

#ifdef CEDAR_HAVE_NCCL
#include <cuda_runtime.h>

#include <random>
#include <string>
#include <thread>
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

namespace {

/// Rank r's checks of every collective in a group of n (one GPU each); failures as text.
std::vector<std::string> rank_checks(const cedar::nccl_group_id& id, int r, int n) {
  using namespace cedar;
  std::vector<std::string> bad;
  const auto expect = [&](bool ok, const std::string& what) {
    if (!ok) bad.push_back("rank " + std::to_string(r) + ": " + what);
  };
  if (cudaSetDevice(r) != cudaSuccess) return {"rank " + std::to_string(r) + ": cudaSetDevice"};
  auto comm = make_nccl_communicator(id, r, n, r);
  expect(comm->rank() == r && comm->size() == n, "rank and size");
  constexpr std::size_t count = 1000;
  const auto value = [](int rank, std::size_t i) { return float(rank * 1000 + int(i % 997)); };
  std::vector<float> mine(count), sum(count, 0.0f);
  for (std::size_t i = 0; i < count; ++i) {
    mine[i] = value(r, i);
    for (int p = 0; p < n; ++p) sum[i] += value(p, i);
  }
  device_buffer a(mine);
  comm->all_reduce_sum(a.ptr, count);
  expect(a.read() == sum, "all_reduce_sum");

  device_buffer b(mine), gathered(std::vector<float>(count * n, -1.0f));
  comm->all_gather(b.ptr, count, gathered.ptr);
  std::vector<float> all(count * n);
  for (int p = 0; p < n; ++p)
    for (std::size_t i = 0; i < count; ++i) all[p * count + i] = value(p, i);
  expect(gathered.read() == all, "all_gather");

  // send[p * count + i] = value(r, p * count + i): rank r keeps the sum of every rank's slice r
  std::vector<float> send(count * n), slice(count, 0.0f);
  for (std::size_t j = 0; j < send.size(); ++j) send[j] = value(r, j);
  for (std::size_t i = 0; i < count; ++i)
    for (int p = 0; p < n; ++p) slice[i] += value(p, r * count + i);
  device_buffer s(send), scattered(std::vector<float>(count, -1.0f));
  comm->reduce_scatter_sum(s.ptr, count, scattered.ptr);
  expect(scattered.read() == slice, "reduce_scatter_sum");

  device_buffer c(mine);
  comm->broadcast(c.ptr, count, 0);
  std::vector<float> root(count);
  for (std::size_t i = 0; i < count; ++i) root[i] = value(0, i);
  expect(c.read() == root, "broadcast from rank 0");

  // rank r sends 100 + 10 r + p values to rank p, value r * 10000 + p * 100 + j
  std::vector<std::size_t> send_counts(n), recv_counts(n, 0);
  std::vector<float> out;
  for (int p = 0; p < n; ++p) {
    send_counts[p] = std::size_t(100 + 10 * r + p);
    for (std::size_t j = 0; j < send_counts[p]; ++j) out.push_back(float(r * 10000 + p * 100) + float(j));
  }
  comm->exchange_counts(send_counts.data(), recv_counts.data());
  std::vector<float> want;
  for (int p = 0; p < n; ++p) {
    expect(recv_counts[p] == std::size_t(100 + 10 * p + r), "exchange_counts from rank " + std::to_string(p));
    for (std::size_t j = 0; j < std::size_t(100 + 10 * p + r); ++j) want.push_back(float(p * 10000 + r * 100) + float(j));
  }
  device_buffer sent(out), received(std::vector<float>(want.size(), -1.0f));
  comm->all_to_all(sent.ptr, send_counts.data(), received.ptr, recv_counts.data());
  expect(received.read() == want, "all_to_all");
  return bad;
}

}  // namespace

TEST_CASE("nccl: a group of every device, a thread a rank (two or more GPUs)") {
  using namespace cedar;
  if (!cedar::gpu_test::have_gpu()) return;
  int n = 0;
  REQUIRE(cudaGetDeviceCount(&n) == cudaSuccess);
  if (n < 2) {
    MESSAGE("one device: the multi-rank group needs two or more");
    return;
  }
  const nccl_group_id id = nccl_make_group_id();
  std::vector<std::vector<std::string>> failures(n);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      try {
        failures[r] = rank_checks(id, r, n);
      } catch (const std::exception& e) {
        failures[r] = {"rank " + std::to_string(r) + " threw: " + e.what()};
      }
    });
  for (std::thread& t : ranks) t.join();
  std::size_t total = 0;
  for (const auto& f : failures)
    for (const std::string& what : f) {
      ++total;
      FAIL_CHECK(what);
    }
  MESSAGE((std::to_string(n) + " ranks: every collective checked, " + std::to_string(total) + " failures"));
  CHECK(total == 0);
}
#endif
