// RoPE: the YaRN frequency table of the real config, the rotation against a double
// complex-multiply reference, untouched non-rope dims, and inverse(rope(x)) == x.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/ops.hpp"
#include "tests/kernels/op_reference.hpp"

using namespace cedar;

namespace {

cpu::rope_params compressed_layer_params() {
  cpu::rope_params p;
  p.rope_dim = 64;
  p.theta = 160000.0;
  p.yarn = true;
  return p;
}

}  // namespace

TEST_CASE("rope frequencies: plain theta table, and YaRN with low 15 / high 25 for the real config") {
  cpu::rope_params plain;
  std::vector<double> f(32);
  cpu::rope_frequencies(plain, f.data());
  CHECK(f[0] == 1.0);
  CHECK(f[1] == doctest::Approx(std::pow(10000.0, -2.0 / 64)).epsilon(1e-15));
  CHECK(f[31] == doctest::Approx(std::pow(10000.0, -62.0 / 64)).epsilon(1e-15));

  const auto p = compressed_layer_params();
  std::vector<double> y(32);
  cpu::rope_frequencies(p, y.data());
  for (int i = 0; i < 32; ++i) {
    const double base = std::pow(160000.0, -2.0 * i / 64);
    if (i <= 15) CHECK(y[i] == doctest::Approx(base).epsilon(1e-14));
    if (i >= 25) CHECK(y[i] == doctest::Approx(base / 16).epsilon(1e-14));
    if (i > 15 && i < 25) {
      // strictly between the kept and the divided frequency, moving linearly in i
      const double t = (i - 15) / 10.0;
      CHECK(y[i] == doctest::Approx(base * (1 - t) + base / 16 * t).epsilon(1e-14));
      CHECK(y[i] < base);
      CHECK(y[i] > base / 16);
    }
  }
}

TEST_CASE("rope rotates adjacent pairs of the last rope_dim dims; inverse undoes it") {
  std::mt19937_64 rng(31);
  const int m = 4, heads = 3, head_dim = 96;
  auto p = compressed_layer_params();
  const int32_t positions[m] = {0, 1, 777, 1000000};
  const auto x = op_reference::random_floats(rng, std::size_t(m) * heads * head_dim, -2.0f, 2.0f);
  auto y = x;
  cpu::rope(y.data(), m, heads, head_dim, positions, p, false);
  std::vector<double> freqs(32);
  cpu::rope_frequencies(p, freqs.data());
  for (int r = 0; r < m; ++r)
    for (int h = 0; h < heads; ++h) {
      const std::size_t row = (std::size_t(r) * heads + h) * head_dim;
      const int nope = head_dim - p.rope_dim;
      REQUIRE(std::memcmp(&y[row], &x[row], nope * sizeof(float)) == 0);
      for (int i = 0; i < 32; ++i) {
        const double angle = double(positions[r]) * freqs[i];
        const double a = x[row + nope + 2 * i], b = x[row + nope + 2 * i + 1];
        REQUIRE(y[row + nope + 2 * i] == doctest::Approx(a * std::cos(angle) - b * std::sin(angle)).epsilon(1e-5));
        REQUIRE(y[row + nope + 2 * i + 1] == doctest::Approx(a * std::sin(angle) + b * std::cos(angle)).epsilon(1e-5));
      }
    }
  // position 0 is the identity, bit for bit
  CHECK(std::memcmp(y.data(), x.data(), heads * head_dim * sizeof(float)) == 0);

  auto z = y;
  cpu::rope(z.data(), m, heads, head_dim, positions, p, true);
  for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(z[i] == doctest::Approx(x[i]).epsilon(1e-5).scale(1.0));
}
