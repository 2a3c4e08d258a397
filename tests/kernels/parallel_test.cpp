// parallel_for: every index exactly once, nested and concurrent calls complete.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "kernels/parallel.hpp"

using namespace cedar;

TEST_CASE("parallel_for visits every index exactly once") {
  for (int n : {0, 1, 5, 1000, 100003}) {
    std::vector<std::atomic<int>> hits(n);
    parallel_for(0, n, [&](int64_t i) { hits[i].fetch_add(1); });
    for (int i = 0; i < n; ++i) REQUIRE(hits[i].load() == 1);
  }
  CHECK(num_threads() >= 1);
}

TEST_CASE("parallel_for_chunks respects the grain and the range") {
  std::atomic<int64_t> covered{0};
  std::atomic<bool> ok{true};
  parallel_for_chunks(10, 1010, 7, [&](int64_t lo, int64_t hi) {
    if (lo < 10 || hi > 1010 || hi - lo > 7 || hi <= lo) ok = false;
    covered += hi - lo;
  });
  CHECK(ok.load());
  CHECK(covered.load() == 1000);
}

TEST_CASE("nested and concurrent parallel_for calls complete with every index once") {
  std::vector<std::atomic<int>> hits(64 * 64);
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&, t] {
      parallel_for(t * 16, t * 16 + 16, [&](int64_t i) {
        parallel_for(0, 64, [&](int64_t j) { hits[i * 64 + j].fetch_add(1); });
      });
    });
  for (auto& c : callers) c.join();
  for (auto& h : hits) REQUIRE(h.load() == 1);
}
