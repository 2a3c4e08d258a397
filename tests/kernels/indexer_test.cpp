// index_scores against a double-precision sum of weighted ReLU dots (invisible keys -inf,
// batch invariant), and candidate_blocks against a full stable sort of block maxima.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/ops.hpp"
#include "tests/kernels/op_reference.hpp"

using namespace cedar;
using namespace cedar::op_reference;

namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

/// Blocks sorted by (newest-entry block first, then max score descending, then index); the
/// first `keep` whose max is finite (or that is the forced block) are kept.
std::vector<uint8_t> blocks_reference(const float* s, int n, int block, int keep, int visible) {
  const int nb = (n + block - 1) / block;
  std::vector<float> mx(nb, neg_inf);
  for (int j = 0; j < n; ++j) mx[j / block] = std::max(mx[j / block], s[j]);
  const int forced = visible > 0 ? (visible - 1) / block : -1;
  std::vector<int> order(nb);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    if ((a == forced) != (b == forced)) return a == forced;
    return mx[a] > mx[b];
  });
  std::vector<uint8_t> mask(nb, 0);
  int kept = 0;
  for (int b : order)
    if (kept < keep && (b == forced || mx[b] != neg_inf)) mask[b] = 1, ++kept;
  return mask;
}

}  // namespace

TEST_CASE("index_scores sums w_h * relu(q_h . k_j) and hides keys beyond num_visible") {
  std::mt19937_64 rng(41);
  const int m = 4, heads = 3, dim = 32, keys = 20;
  auto q = random_floats(rng, size_t(m) * heads * dim, -1, 1);
  auto w = random_floats(rng, size_t(m) * heads, -1, 1);
  auto k = random_floats(rng, size_t(keys) * dim, -1, 1);
  std::vector<int32_t> visible = {20, 7, 0, 13};
  std::vector<float> got(size_t(m) * keys);
  cpu::index_scores(q.data(), w.data(), m, heads, dim, k.data(), keys, visible.data(), got.data());
  for (int r = 0; r < m; ++r)
    for (int j = 0; j < keys; ++j) {
      const float g = got[size_t(r) * keys + j];
      if (j >= visible[r]) {
        CHECK(g == neg_inf);
        continue;
      }
      double ref = 0;
      for (int h = 0; h < heads; ++h) {
        double d = 0;
        for (int i = 0; i < dim; ++i)
          d += double(q[(size_t(r) * heads + h) * dim + i]) * k[size_t(j) * dim + i];
        ref += w[size_t(r) * heads + h] * std::max(d, 0.0);
      }
      CHECK(g == doctest::Approx(ref).epsilon(1e-5));
    }
  std::vector<float> one(keys);
  cpu::index_scores(q.data() + size_t(3) * heads * dim, w.data() + size_t(3) * heads, 1, heads,
                    dim, k.data(), keys, visible.data() + 3, one.data());
  CHECK(same_bits(one.data(), got.data() + size_t(3) * keys, keys));
}

TEST_CASE("candidate_blocks keeps the newest entry's block and the best others, ties to the lowest") {
  std::mt19937_64 rng(42);
  const int m = 30, n = 45, block = 4, keep = 3;
  const int nb = (n + block - 1) / block;
  std::vector<float> s(size_t(m) * n);
  std::vector<int32_t> visible(m);
  for (int r = 0; r < m; ++r) {
    visible[r] = int(rng() % (n + 1));
    for (int j = 0; j < n; ++j)
      s[size_t(r) * n + j] = j < visible[r] ? float(rng() % 4) : neg_inf;  // many tied maxima
  }
  // Row 0: the newest block has the lowest score and must still be kept.
  visible[0] = n;
  for (int j = 0; j < n; ++j) s[j] = j >= 44 ? -5.0f : 1.0f;
  std::vector<uint8_t> got(size_t(m) * nb);
  cpu::candidate_blocks(s.data(), m, n, block, keep, visible.data(), got.data());
  for (int r = 0; r < m; ++r) {
    const auto ref = blocks_reference(s.data() + size_t(r) * n, n, block, keep, visible[r]);
    CHECK(std::equal(ref.begin(), ref.end(), got.begin() + size_t(r) * nb));
  }
  CHECK(got[size_t(nb - 1)] == 1);  // row 0's newest block
  CHECK(got[0] == 1);
  CHECK(got[1] == 1);  // the two lowest tied blocks fill the rest
  CHECK(got[2] == 0);
}
