// The CPU linear layers against plain double loops over the fully dequantized weight, with an
// fp32 summation error bound; and batch invariance (a row's bits do not depend on m).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/dot.hpp"
#include "kernels/formats.hpp"
#include "kernels/ops.hpp"
#include "tests/kernels/op_reference.hpp"

using namespace cedar;

namespace {

/// Checks y [m, out] against x [m, in] times w [out, in] (both fp32 values taken as exact),
/// allowing the rounding of an fp32 sum of depth (in/32 + 5 + in%32) over sum |x*w|.
void check_against_reference(const std::vector<float>& x, int m, const std::vector<float>& w,
                             int out, int in, const std::vector<float>& y) {
  const double depth = in / 32 + 5 + in % 32;
  for (int r = 0; r < m; ++r)
    for (int n = 0; n < out; ++n) {
      double sum = 0.0, sum_abs = 0.0;
      for (int k = 0; k < in; ++k) {
        const double p = double(x[std::size_t(r) * in + k]) * w[std::size_t(n) * in + k];
        sum += p;
        sum_abs += std::fabs(p);
      }
      const double tol = 2.0 * depth * std::ldexp(1.0, -24) * sum_abs;
      REQUIRE(std::fabs(y[std::size_t(r) * out + n] - sum) <= tol);
    }
}

std::vector<float> fake_quant_rows(std::vector<float> x, int in) {
  for (std::size_t r = 0; r < x.size() / in; ++r) fmt::fake_quant_fp8(x.data() + r * in, in);
  return x;
}

/// Runs op on all m rows at once and on each row alone; the bits must agree.
template <class Op>
void check_batch_invariant(const std::vector<float>& x, int m, int in, int out, Op op) {
  std::vector<float> all(std::size_t(m) * out), one(out);
  op(x.data(), m, all.data());
  for (int r = 0; r < m; ++r) {
    op(x.data() + std::size_t(r) * in, 1, one.data());
    REQUIRE(std::memcmp(one.data(), all.data() + std::size_t(r) * out, out * sizeof(float)) == 0);
  }
}

std::vector<float> activations(int m, int in, std::mt19937_64& rng) {
  auto x = op_reference::random_floats(rng, std::size_t(m) * in, -2.0f, 2.0f);
  // groups of very different magnitude, so the per-32 activation scales differ
  for (std::size_t i = 0; i < x.size(); ++i) x[i] *= std::ldexp(1.0f, int(i / 32 % 7) - 3);
  return x;
}

}  // namespace

TEST_CASE("linear_fp8 equals the block-scaled FP8 formula on random weights") {
  std::mt19937_64 rng(11);
  const int m = 7, out = 70, in = 256;  // out not a multiple of 32: a partial scale tile
  const auto w = op_reference::random_fp8(rng, out, in);
  const auto x = activations(m, in, rng);
  std::vector<float> y(std::size_t(m) * out);
  cpu::linear_fp8(x.data(), m, w.view, y.data());
  check_against_reference(fake_quant_rows(x, in), m, op_reference::dequant(w.view), out, in, y);
  check_batch_invariant(x, m, in, out,
                        [&](const float* xs, int rows, float* ys) { cpu::linear_fp8(xs, rows, w.view, ys); });
}

TEST_CASE("linear_fp8 does not change its input and quantizes the activation") {
  std::mt19937_64 rng(12);
  const int out = 32, in = 64;
  const auto w = op_reference::random_fp8(rng, out, in);
  auto x = activations(1, in, rng);
  x[3] = 0.1234567f;  // not on the FP8 grid of its group
  const auto x_before = x;
  std::vector<float> y(out);
  cpu::linear_fp8(x.data(), 1, w.view, y.data());
  CHECK(std::memcmp(x.data(), x_before.data(), in * sizeof(float)) == 0);
  check_against_reference(fake_quant_rows(x, in), 1, op_reference::dequant(w.view), out, in, y);
}

TEST_CASE("linear_fp4 (W4A8) equals the formula on random weights") {
  std::mt19937_64 rng(13);
  const int m = 7, out = 45, in = 320;
  const auto w = op_reference::random_fp4(rng, out, in);
  const auto x = activations(m, in, rng);
  std::vector<float> y(std::size_t(m) * out);
  cpu::linear_fp4(x.data(), m, w.view, y.data());
  check_against_reference(fake_quant_rows(x, in), m, op_reference::dequant(w.view), out, in, y);
  check_batch_invariant(x, m, in, out,
                        [&](const float* xs, int rows, float* ys) { cpu::linear_fp4(xs, rows, w.view, ys); });
}

TEST_CASE("linear_bf16 and linear_f32 match plain loops, including a length that is not a multiple of 32") {
  std::mt19937_64 rng(14);
  for (int in : {100, 256}) {
    const int m = 7, out = 33;
    const auto w = op_reference::random_bf16(rng, out, in, 0.5f);
    const auto x = activations(m, in, rng);
    std::vector<float> y(std::size_t(m) * out);
    cpu::linear_bf16(x.data(), m, w.view, y.data());
    check_against_reference(x, m, op_reference::dequant(w.view), out, in, y);
    check_batch_invariant(x, m, in, out,
                          [&](const float* xs, int rows, float* ys) { cpu::linear_bf16(xs, rows, w.view, ys); });

    const auto wf = op_reference::random_floats(rng, std::size_t(out) * in, -2.0f, 2.0f);
    cpu::linear_f32(x.data(), m, wf.data(), out, in, y.data());
    check_against_reference(x, m, wf, out, in, y);
    check_batch_invariant(x, m, in, out, [&](const float* xs, int rows, float* ys) {
      cpu::linear_f32(xs, rows, wf.data(), out, in, ys);
    });
  }
}

TEST_CASE("linear_fp8 over more rows than one activation block stays batch-invariant") {
  std::mt19937_64 rng(16);
  const int m = 300, out = 40, in = 96;  // 300 rows: three passes over the weight
  const auto w = op_reference::random_fp8(rng, out, in);
  const auto x = activations(m, in, rng);
  std::vector<float> y(std::size_t(m) * out);
  cpu::linear_fp8(x.data(), m, w.view, y.data());
  check_against_reference(fake_quant_rows(x, in), m, op_reference::dequant(w.view), out, in, y);
  check_batch_invariant(x, m, in, out,
                        [&](const float* xs, int rows, float* ys) { cpu::linear_fp8(xs, rows, w.view, ys); });
}

TEST_CASE("linear_fp8 gives the same bits on repeated runs over many output rows") {
  std::mt19937_64 rng(15);
  const int m = 3, out = 1000, in = 512;
  const auto w = op_reference::random_fp8(rng, out, in);
  const auto x = activations(m, in, rng);
  std::vector<float> a(std::size_t(m) * out), b(a.size());
  cpu::linear_fp8(x.data(), m, w.view, a.data());
  cpu::linear_fp8(x.data(), m, w.view, b.data());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  check_against_reference(fake_quant_rows(x, in), m, op_reference::dequant(w.view), out, in, a);
}

TEST_CASE("row decoders give the scalar codecs' values for every code") {
  // every non-NaN e4m3 code (254 of them, padded to 256 with zeros) under two scales
  std::vector<uint8_t> codes(256, 0);
  for (int c = 0, i = 0; c < 256; ++c)
    if ((c & 0x7F) != 0x7F) codes[i++] = uint8_t(c);
  const uint8_t scales[8] = {127, 100, 150, 1, 127, 130, 127, 127};
  std::vector<float> got(256);
  cpu::decode_fp8_row(codes.data(), scales, 256, got.data());
  for (int k = 0; k < 256; ++k) {
    const float want = fmt::e4m3_to_f32(codes[k]) * fmt::ue8m0_to_f32(scales[k / 32]);
    REQUIRE(std::memcmp(&got[k], &want, 4) == 0);
  }
  // every packed e2m1 byte
  std::vector<uint8_t> packed(256);
  for (int b = 0; b < 256; ++b) packed[b] = uint8_t(b);
  std::vector<float> got4(512);
  const uint8_t scales4[16] = {127, 120, 131, 127, 126, 127, 127, 127, 127, 127, 127, 127, 127, 127, 127, 140};
  cpu::decode_fp4_row(packed.data(), scales4, 512, got4.data());
  for (int k = 0; k < 512; ++k) {
    const uint8_t code = k % 2 == 0 ? (packed[k / 2] & 0xF) : (packed[k / 2] >> 4);
    const float want = fmt::e2m1_to_f32(code) * fmt::ue8m0_to_f32(scales4[k / 32]);
    REQUIRE(std::memcmp(&got4[k], &want, 4) == 0);
  }
  // bf16, with a length that leaves a scalar tail
  std::vector<uint16_t> bits(37);
  for (int i = 0; i < 37; ++i) bits[i] = uint16_t(0x3F80 + 977 * i);
  std::vector<float> gotb(37);
  cpu::decode_bf16_row(bits.data(), 37, gotb.data());
  for (int i = 0; i < 37; ++i) {
    const float want = fmt::bf16_to_f32(bits[i]);
    REQUIRE(std::memcmp(&gotb[i], &want, 4) == 0);
  }
}
