// The ratio-2 and ratio-1 compressors against double-precision versions of spec §2.4, and
// the chunking contract: any split of a sequence into chunks (odd starts, one-token decode
// steps) gives the same latents, bit for bit, as one call over the whole sequence.
#include <doctest/doctest.h>

#include <cmath>

#include "kernels/ops.hpp"
#include "tests/kernels/op_reference.hpp"

using namespace cedar;
using namespace cedar::op_reference;

namespace {

constexpr float eps = 1e-20f;

void rmsnorm_reference(std::vector<double>& v, const std::vector<float>& w) {
  double ms = 0;
  for (double x : v) ms += x * x;
  const double inv = 1.0 / std::sqrt(ms / v.size() + eps);
  for (size_t c = 0; c < v.size(); ++c) v[c] = v[c] * inv * w[c];
}

struct compressor_case {
  int in = 64, d = 32, tokens = 11;
  std::mt19937_64 rng{21};
  std::vector<float> x = random_floats(rng, size_t(tokens) * in, -1, 1);
  owned_bf16 wkv = random_bf16(rng, d, in, 0.2f);
  owned_bf16 wgate = random_bf16(rng, d, in, 0.5f);
  std::vector<float> norm = random_floats(rng, d, 0.5f, 1.5f);
};

/// Runs the sequence in chunks of the given sizes (from position 0); returns all latents.
std::vector<float> run_chunks(const compressor_case& c, const std::vector<int>& sizes) {
  std::vector<float> tail(size_t(2) * c.d, 0.0f), all;
  int64_t pos = 0;
  for (int n : sizes) {
    std::vector<float> lat(size_t(n / 2 + 1) * c.d);
    const int got = cpu::compress_ratio2(c.x.data() + pos * c.in, n, pos, c.wkv.view,
                                         c.wgate.view, c.norm.data(), eps, tail.data(), lat.data());
    CHECK(got == int((pos + n) / 2 - pos / 2));  // odd positions (pair ends) in the chunk
    all.insert(all.end(), lat.begin(), lat.begin() + size_t(got) * c.d);
    pos += n;
  }
  return all;
}

}  // namespace

TEST_CASE("compress_ratio2 merges each pair with a per-channel softmax, then RMSNorm") {
  compressor_case c;
  const auto a = dense_linear(c.x.data(), c.tokens, dequant(c.wkv.view), c.d, c.in, false);
  const auto g = dense_linear(c.x.data(), c.tokens, dequant(c.wgate.view), c.d, c.in, false);
  const auto got = run_chunks(c, {c.tokens});
  REQUIRE(got.size() == size_t(c.tokens / 2) * c.d);
  for (int j = 0; j < c.tokens / 2; ++j) {
    std::vector<double> mixed(c.d);
    for (int ch = 0; ch < c.d; ++ch) {
      const double g0 = g[size_t(2 * j) * c.d + ch], g1 = g[size_t(2 * j + 1) * c.d + ch];
      const double p0 = std::exp(g0) / (std::exp(g0) + std::exp(g1));
      mixed[ch] = p0 * a[size_t(2 * j) * c.d + ch] + (1 - p0) * a[size_t(2 * j + 1) * c.d + ch];
    }
    rmsnorm_reference(mixed, c.norm);
    CHECK(rel_error(got.data() + size_t(j) * c.d, mixed.data(), c.d) < 1e-5);
  }
}

TEST_CASE("compress_ratio2 gives the same latents whatever the chunking") {
  compressor_case c;
  const auto whole = run_chunks(c, {c.tokens});
  CHECK(same_bits(run_chunks(c, {3, 4, 1, 3}).data(), whole.data(), whole.size()));
  CHECK(same_bits(run_chunks(c, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}).data(), whole.data(),
                  whole.size()));
  CHECK(same_bits(run_chunks(c, {2, 5, 2, 2}).data(), whole.data(), whole.size()));
}

TEST_CASE("compress_ratio1 normalizes each token's projection") {
  compressor_case c;
  std::vector<float> got(size_t(c.tokens) * c.d);
  cpu::compress_ratio1(c.x.data(), c.tokens, c.wkv.view, c.norm.data(), eps, got.data());
  const auto a = dense_linear(c.x.data(), c.tokens, dequant(c.wkv.view), c.d, c.in, false);
  for (int t = 0; t < c.tokens; ++t) {
    std::vector<double> v(a.begin() + size_t(t) * c.d, a.begin() + size_t(t + 1) * c.d);
    rmsnorm_reference(v, c.norm);
    CHECK(rel_error(got.data() + size_t(t) * c.d, v.data(), c.d) < 1e-5);
  }
  std::vector<float> one(c.d);
  cpu::compress_ratio1(c.x.data() + size_t(4) * c.in, 1, c.wkv.view, c.norm.data(), eps, one.data());
  CHECK(same_bits(one.data(), got.data() + size_t(4) * c.d, c.d));
}
