// topk_indices against a full stable sort, with ties built on purpose (the lowest index must
// win), -inf entries that must never be chosen, and rows with fewer finite entries than k.
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "kernels/ops.hpp"
#include "tests/kernels/op_reference.hpp"

using namespace cedar;

namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

/// Stable sort by score descending keeps equal scores in index order; drop -inf, take k,
/// re-sort ascending, pad with -1.
std::vector<int32_t> topk_reference(const float* s, int n, int k) {
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [s](int a, int b) { return s[a] > s[b]; });
  std::vector<int32_t> out;
  for (int32_t j : order)
    if (s[j] != neg_inf && int(out.size()) < k) out.push_back(j);
  std::sort(out.begin(), out.end());
  out.resize(k, -1);
  return out;
}

}  // namespace

TEST_CASE("topk_indices equals a full stable sort, ties to the lowest index") {
  std::mt19937_64 rng(31);
  const int m = 40, n = 97, k = 16;
  std::vector<float> s(size_t(m) * n);
  for (int r = 0; r < m; ++r)
    for (int j = 0; j < n; ++j) {
      // Few distinct values, so many rows have exact ties across the cut; some -inf.
      const uint64_t v = rng() % 9;
      s[size_t(r) * n + j] = v == 0 ? neg_inf : float(v % (r % 5 + 2)) * 0.25f;
    }
  for (int j = 5; j < n; ++j) s[size_t(3) * n + j] = neg_inf;  // row 3: at most 5 finite
  std::vector<int32_t> got(size_t(m) * k);
  cpu::topk_indices(s.data(), m, n, k, got.data());
  for (int r = 0; r < m; ++r) {
    const auto ref = topk_reference(s.data() + size_t(r) * n, n, k);
    CHECK(std::equal(ref.begin(), ref.end(), got.begin() + size_t(r) * k));
  }
  CHECK(got[size_t(3) * k + 5] == -1);
}

TEST_CASE("topk_indices: all-equal scores pick the first k; all -inf picks nothing") {
  const int n = 10, k = 4;
  std::vector<float> s(size_t(2) * n, 1.0f);
  std::fill(s.begin() + n, s.end(), neg_inf);
  std::vector<int32_t> got(size_t(2) * k);
  cpu::topk_indices(s.data(), 2, n, k, got.data());
  CHECK(got == std::vector<int32_t>{0, 1, 2, 3, -1, -1, -1, -1});
}
