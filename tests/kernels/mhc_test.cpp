// mHC: hc_mix against a double reference, Sinkhorn sums, the comb orientation (row j = input
// copy, column k = output copy), hc_collapse and hc_post.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/formats.hpp"
#include "kernels/ops.hpp"
#include "tests/kernels/op_reference.hpp"

using namespace cedar;

namespace {

constexpr int hc = 4;
constexpr int n_mix = hc * hc + 2 * hc;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

/// HCMix of one token in double, written straight from spec §2.2.
void hc_mix_reference(const float* X, int d, const float* fn, const float* scale,
                      const float* base, int iters, double eps, double norm_eps, double* pre,
                      double* post, double* comb) {
  const int n = hc * d;
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += double(X[i]) * X[i];
  const double inv = 1.0 / std::sqrt(ss / n + norm_eps);
  double mix[n_mix];
  for (int o = 0; o < n_mix; ++o) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) s += double(fn[std::size_t(o) * n + i]) * X[i];
    mix[o] = s * inv;
  }
  for (int j = 0; j < hc; ++j) {
    pre[j] = sigmoid(mix[j] * scale[0] + base[j]) + eps;
    post[j] = 2.0 * sigmoid(mix[hc + j] * scale[1] + base[hc + j]);
  }
  double c[hc][hc];
  for (int j = 0; j < hc; ++j) {
    double mx = -INFINITY, sum = 0.0;
    for (int k = 0; k < hc; ++k) mx = std::max(mx, mix[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k]);
    for (int k = 0; k < hc; ++k) sum += c[j][k] = std::exp(mix[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k] - mx);
    for (int k = 0; k < hc; ++k) c[j][k] = c[j][k] / sum + eps;
  }
  auto cols = [&] {
    for (int k = 0; k < hc; ++k) {
      double s = 0.0;
      for (int j = 0; j < hc; ++j) s += c[j][k];
      for (int j = 0; j < hc; ++j) c[j][k] /= s + eps;
    }
  };
  cols();
  for (int it = 1; it < iters; ++it) {
    for (int j = 0; j < hc; ++j) {
      double s = 0.0;
      for (int k = 0; k < hc; ++k) s += c[j][k];
      for (int k = 0; k < hc; ++k) c[j][k] /= s + eps;
    }
    cols();
  }
  for (int j = 0; j < hc; ++j)
    for (int k = 0; k < hc; ++k) comb[j * hc + k] = c[j][k];
}

}  // namespace

TEST_CASE("hc_mix matches the spec in double; comb is doubly stochastic after Sinkhorn") {
  std::mt19937_64 rng(41);
  const int m = 3, d = 96;
  const auto X = op_reference::random_floats(rng, std::size_t(m) * hc * d, -2.0f, 2.0f);
  const auto fn = op_reference::random_floats(rng, std::size_t(n_mix) * hc * d, -0.2f, 0.2f);
  const auto base = op_reference::random_floats(rng, n_mix, -2.0f, 2.0f);
  const float scale[3] = {0.7f, 1.3f, 0.9f};
  std::vector<float> pre(m * hc), post(m * hc), comb(m * hc * hc);
  cpu::hc_mix(X.data(), m, hc, d, fn.data(), scale, base.data(), 20, 1e-6f, 1e-20f, pre.data(),
              post.data(), comb.data());
  for (int r = 0; r < m; ++r) {
    double p[hc], q[hc], c[hc * hc];
    hc_mix_reference(X.data() + r * hc * d, d, fn.data(), scale, base.data(), 20, 1e-6, 1e-20, p, q, c);
    for (int j = 0; j < hc; ++j) {
      REQUIRE(pre[r * hc + j] == doctest::Approx(p[j]).epsilon(1e-5));
      REQUIRE(post[r * hc + j] == doctest::Approx(q[j]).epsilon(1e-5));
    }
    for (int i = 0; i < hc * hc; ++i) REQUIRE(comb[r * hc * hc + i] == doctest::Approx(c[i]).epsilon(1e-4));
    for (int a = 0; a < hc; ++a) {
      float row = 0.0f, col = 0.0f;
      for (int b = 0; b < hc; ++b) row += comb[r * hc * hc + a * hc + b], col += comb[r * hc * hc + b * hc + a];
      CHECK(row == doctest::Approx(1.0f).epsilon(1e-3));
      CHECK(col == doctest::Approx(1.0f).epsilon(1e-5));
    }
  }
}

TEST_CASE("hc_mix is batch-invariant: a token's bits do not depend on the other tokens") {
  std::mt19937_64 rng(43);
  const int m = 5, d = 64;
  const auto X = op_reference::random_floats(rng, std::size_t(m) * hc * d, -2.0f, 2.0f);
  const auto fn = op_reference::random_floats(rng, std::size_t(n_mix) * hc * d, -0.2f, 0.2f);
  const auto base = op_reference::random_floats(rng, n_mix, -2.0f, 2.0f);
  const float scale[3] = {1.0f, 1.0f, 1.0f};
  std::vector<float> pre(m * hc), post(m * hc), comb(m * hc * hc);
  cpu::hc_mix(X.data(), m, hc, d, fn.data(), scale, base.data(), 20, 1e-6f, 1e-20f, pre.data(),
              post.data(), comb.data());
  for (int r = 0; r < m; ++r) {
    float p1[hc], q1[hc], c1[hc * hc];
    cpu::hc_mix(X.data() + r * hc * d, 1, hc, d, fn.data(), scale, base.data(), 20, 1e-6f, 1e-20f,
                p1, q1, c1);
    CHECK(std::memcmp(p1, &pre[r * hc], sizeof p1) == 0);
    CHECK(std::memcmp(q1, &post[r * hc], sizeof q1) == 0);
    CHECK(std::memcmp(c1, &comb[r * hc * hc], sizeof c1) == 0);
  }
}

TEST_CASE("hc_mix reads the comb logits row-major: logit j*hc+k is the weight of copy j in copy k") {
  const int d = 32;
  std::vector<float> X(hc * d, 1.0f), fn(std::size_t(n_mix) * hc * d, 0.0f), base(n_mix, 0.0f);
  for (int j = 0; j < hc; ++j) base[2 * hc + j * hc + (j + 1) % hc] = 30.0f;  // copy j -> copy j+1
  const float scale[3] = {1.0f, 1.0f, 1.0f};
  std::vector<float> pre(hc), post(hc), comb(hc * hc);
  cpu::hc_mix(X.data(), 1, hc, d, fn.data(), scale, base.data(), 20, 1e-6f, 1e-20f, pre.data(),
              post.data(), comb.data());
  for (int j = 0; j < hc; ++j)
    for (int k = 0; k < hc; ++k) CHECK(comb[j * hc + k] == doctest::Approx(k == (j + 1) % hc ? 1.0 : 0.0).epsilon(1e-4).scale(1.0));
  for (int j = 0; j < hc; ++j) {
    CHECK(pre[j] == doctest::Approx(0.5 + 1e-6));
    CHECK(post[j] == doctest::Approx(1.0));
  }
}

TEST_CASE("hc_collapse and hc_post follow X'[k] = bf16(post[k] f + sum_j C[j,k] X[j])") {
  std::mt19937_64 rng(42);
  const int m = 2, d = 50;
  const auto X = op_reference::random_floats(rng, std::size_t(m) * hc * d, -2.0f, 2.0f);
  const auto f = op_reference::random_floats(rng, std::size_t(m) * d, -2.0f, 2.0f);
  const auto pre = op_reference::random_floats(rng, m * hc, -2.0f, 2.0f);
  const auto post = op_reference::random_floats(rng, m * hc, -2.0f, 2.0f);
  const auto comb = op_reference::random_floats(rng, m * hc * hc, -2.0f, 2.0f);

  std::vector<float> collapsed(std::size_t(m) * d);
  cpu::hc_collapse(X.data(), pre.data(), m, hc, d, collapsed.data());
  std::vector<float> out(X.size());
  cpu::hc_post(f.data(), X.data(), post.data(), comb.data(), m, hc, d, out.data());
  for (int r = 0; r < m; ++r)
    for (int i = 0; i < d; ++i) {
      double s = 0.0;
      for (int j = 0; j < hc; ++j) s += double(pre[r * hc + j]) * X[(r * hc + j) * d + i];
      REQUIRE(collapsed[r * d + i] == doctest::Approx(s).epsilon(1e-5).scale(1.0));
      for (int k = 0; k < hc; ++k) {
        double want = double(post[r * hc + k]) * f[r * d + i];
        for (int j = 0; j < hc; ++j) want += double(comb[r * hc * hc + j * hc + k]) * X[(r * hc + j) * d + i];
        const float got = out[(r * hc + k) * d + i];
        REQUIRE(got == fmt::round_bf16(got));  // stored as bf16
        REQUIRE(std::fabs(got - want) <= std::ldexp(std::fabs(want), -8) + 1e-5);
      }
    }

  // a permutation comb with post = 0 moves copy j to copy j+1, exactly (values are bf16 already)
  std::vector<float> Xb(X.size());
  for (std::size_t i = 0; i < X.size(); ++i) Xb[i] = fmt::round_bf16(X[i]);
  std::vector<float> perm(m * hc * hc, 0.0f), zero(m * hc, 0.0f);
  for (int r = 0; r < m; ++r)
    for (int j = 0; j < hc; ++j) perm[r * hc * hc + j * hc + (j + 1) % hc] = 1.0f;
  auto moved = Xb;
  cpu::hc_post(f.data(), moved.data(), zero.data(), perm.data(), m, hc, d, moved.data());  // in place
  for (int r = 0; r < m; ++r)
    for (int j = 0; j < hc; ++j)
      REQUIRE(std::memcmp(&moved[(r * hc + (j + 1) % hc) * d], &Xb[(r * hc + j) * d], d * sizeof(float)) == 0);
}
