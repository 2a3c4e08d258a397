// In-process collectives: every rank's result against a plain sequential computation over all
// ranks' inputs (sums in rank order, so equality is exact), run on real threads; and the
// failure paths a runtime relies on: an aborted group wakes a blocked rank, a missing peer
// times out, the NCCL entry points say why they are missing in a build without NCCL.
#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "kernels/collectives/inproc.hpp"
#include "kernels/collectives/nccl.hpp"

namespace cedar::test {
namespace {

/// Runs body(comm) on one thread per rank of a fresh group; returns after all finished.
void on_ranks(int n, const std::function<void(communicator&)>& body) {
  auto g = inproc_group::make(n, std::chrono::seconds(10));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, c = std::shared_ptr<communicator>(g->join(r))] { body(*c); });
  for (auto& t : threads) t.join();
}

std::vector<float> random_floats(std::size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST_CASE("all-reduce, all-gather, reduce-scatter and broadcast equal the sequential result") {
  for (int n : {1, 2, 3, 4}) {
    const std::size_t count = 1000;
    std::vector<std::vector<float>> in(n);
    for (int r = 0; r < n; ++r) in[r] = random_floats(count * n, 17 + r);
    std::vector<float> sum = in[0];
    for (int r = 1; r < n; ++r)
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += in[r][i];

    std::vector<std::vector<float>> reduced(n), gathered(n), scattered(n), broadcasted(n);
    on_ranks(n, [&](communicator& c) {
      const int r = c.rank();
      reduced[r] = in[r];
      for (int rep = 0; rep < 3; ++rep) {  // repeated calls reuse the group
        reduced[r] = in[r];
        c.all_reduce_sum(reduced[r].data(), reduced[r].size());
      }
      gathered[r].resize(count * n);
      c.all_gather(in[r].data(), count, gathered[r].data());
      scattered[r].resize(count);
      c.reduce_scatter_sum(in[r].data(), count, scattered[r].data());
      broadcasted[r] = in[r];
      c.broadcast(broadcasted[r].data(), count, n - 1);
    });
    for (int r = 0; r < n; ++r) {
      CHECK(reduced[r] == sum);
      for (int p = 0; p < n; ++p)
        CHECK(std::equal(in[p].begin(), in[p].begin() + count, gathered[r].begin() + p * count));
      CHECK(std::equal(scattered[r].begin(), scattered[r].end(), sum.begin() + r * count));
      CHECK(std::equal(broadcasted[r].begin(), broadcasted[r].begin() + count, in[n - 1].begin()));
    }
  }
}

TEST_CASE("all-to-all delivers each rank's variable-size pieces in rank order") {
  const int n = 3;
  // counts[s][d]: values rank s sends to rank d (some zero); value = 1000*s + 100*d + i.
  std::mt19937 rng(5);
  std::vector<std::vector<std::size_t>> counts(n, std::vector<std::size_t>(n));
  for (auto& row : counts)
    for (auto& c : row) c = rng() % 4;
  std::vector<std::vector<float>> received(n);
  std::vector<std::vector<std::size_t>> recv_counts(n);
  on_ranks(n, [&](communicator& c) {
    const int s = c.rank();
    std::vector<float> send;
    for (int d = 0; d < n; ++d)
      for (std::size_t i = 0; i < counts[s][d]; ++i) send.push_back(float(1000 * s + 100 * d + int(i)));
    recv_counts[s].resize(n);
    c.exchange_counts(counts[s].data(), recv_counts[s].data());
    std::size_t total = 0;
    for (auto x : recv_counts[s]) total += x;
    received[s].resize(total);
    c.all_to_all(send.data(), counts[s].data(), received[s].data(), recv_counts[s].data());
  });
  for (int d = 0; d < n; ++d) {
    std::vector<float> expect;
    for (int s = 0; s < n; ++s) {
      CHECK(recv_counts[d][s] == counts[s][d]);
      for (std::size_t i = 0; i < counts[s][d]; ++i) expect.push_back(float(1000 * s + 100 * d + int(i)));
    }
    CHECK(received[d] == expect);
  }
}

TEST_CASE("an aborted group wakes a blocked rank and fails every later collective") {
  auto g = inproc_group::make(2, std::chrono::seconds(30));
  auto c0 = g->join(0);
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread waiter([&] {
    std::vector<float> v(4, 1.0f);
    try {
      c0->all_reduce_sum(v.data(), v.size());  // rank 1 never comes
    } catch (const collective_error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  g->abort("shard 1 died");
  waiter.join();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(error.find("shard 1 died") != std::string::npos);
  float x = 0;
  CHECK_THROWS_AS(c0->broadcast(&x, 1, 0), collective_error);
}

TEST_CASE("a peer that never arrives times the collective out") {
  auto g = inproc_group::make(2, std::chrono::milliseconds(100));
  auto c0 = g->join(0);
  float x = 1.0f;
  CHECK_THROWS_AS(c0->all_reduce_sum(&x, 1), collective_error);
  CHECK(g->aborted());
}

#ifndef CEDAR_HAVE_NCCL
TEST_CASE("a build without NCCL says so instead of failing obscurely") {
  CHECK_FALSE(nccl_available());
  CHECK_THROWS_WITH_AS(nccl_make_group_id(), doctest::Contains("without NCCL"), collective_error);
}
#endif

}  // namespace
}  // namespace cedar::test
