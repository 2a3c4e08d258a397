// RMSNorm and the embedding lookup against plain loops.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/formats.hpp"
#include "kernels/ops.hpp"
#include "tests/kernels/op_reference.hpp"

using namespace cedar;

TEST_CASE("rmsnorm matches a double reference and may run in place") {
  std::mt19937_64 rng(21);
  const int m = 5, d = 300;
  auto x = op_reference::random_floats(rng, std::size_t(m) * d, -6.0f, 6.0f);
  const auto w = op_reference::random_floats(rng, d, -2.0f, 2.0f);
  std::vector<float> y(x.size());
  cpu::rmsnorm(x.data(), m, d, w.data(), 1e-6f, y.data());
  for (int r = 0; r < m; ++r) {
    double ss = 0.0;
    for (int i = 0; i < d; ++i) ss += double(x[r * d + i]) * x[r * d + i];
    const double inv = 1.0 / std::sqrt(ss / d + 1e-6);
    for (int i = 0; i < d; ++i) {
      const double want = x[r * d + i] * inv * w[i];
      REQUIRE(std::fabs(y[r * d + i] - want) <= 1e-5 * std::fabs(want) + 1e-7);
    }
  }
  cpu::rmsnorm(x.data(), m, d, w.data(), 1e-6f, x.data());
  CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
}

TEST_CASE("rmsnorm with the model's eps 1e-20 normalizes small rows to unit RMS") {
  std::vector<float> x(64, 1e-6f), w(64, 1.0f), y(64);
  cpu::rmsnorm(x.data(), 1, 64, w.data(), 1e-20f, y.data());
  for (float v : y) CHECK(v == doctest::Approx(1.0f).epsilon(1e-5));
}

TEST_CASE("embed returns the bf16 rows of the tokens") {
  std::mt19937_64 rng(22);
  const auto table = op_reference::random_bf16(rng, 50, 40, 0.5f);
  const int32_t tokens[3] = {7, 0, 49};
  std::vector<float> out(3 * 40);
  cpu::embed(tokens, 3, table.view, out.data());
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 40; ++i)
      REQUIRE(out[r * 40 + i] == fmt::bf16_to_f32(table.data[tokens[r] * 40 + i]));
}
