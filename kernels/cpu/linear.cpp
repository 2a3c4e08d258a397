// CPU reference linear layers (ops.hpp): FP8 and FP4 weights with FP8 activations, bf16 and
// fp32 weights. Each output element is computed by one thread in one fixed order (dot_order in
// dot.hpp), independent of m, so the ops are batch-invariant and deterministic.
//
// Exactness: fake-quantized activations (e4m3 * 2^k) and dequantized weights (e4m3 or e2m1
// times a power-of-two scale) have at most 4 significant bits, so every product x*w is exact
// in fp32 (barring underflow below 2^-126) and equals xq*wq*sx*sw of the spec formula; only the
// order of the fp32 sums is a choice, and it is the one written down in dot_order.
#include <algorithm>
#include <vector>

#include "kernels/cpu/dot.hpp"
#include "kernels/cpu/op_check.hpp"
#include "kernels/formats.hpp"
#include "kernels/ops.hpp"
#include "kernels/parallel.hpp"

namespace cedar::cpu {

namespace {

/// Output rows decoded per tile: one dot_tile call shares each x load among them.
constexpr int tile_rows = 4;
/// Activation rows per pass over the weight: bounds the x rows a tile streams through (128 rows
/// of 5120 fp32 = 2.6 MB) at the price of decoding the weight once per pass.
constexpr int block_rows = 128;

/// Runs y = W x over tiles of output rows. decode(n, buf) returns row n of W as fp32 [in]:
/// decoded into buf, or a pointer straight into an fp32 weight.
template <class Decode>
void gemm(const float* x /*[m, in]*/, int m, int out, int in, Decode decode,
          float* y /*[m, out]*/) {
  const int num_tiles = (out + tile_rows - 1) / tile_rows;
  for (int r0 = 0; r0 < m; r0 += block_rows) {
    const int rows_x = std::min(block_rows, m - r0);
    parallel_for_chunks(0, num_tiles, 0, [&](int64_t lo, int64_t hi) {
      thread_local std::vector<float> buf;
      buf.resize(std::size_t(tile_rows) * in);
      for (int64_t t = lo; t < hi; ++t) {
        const int n0 = int(t) * tile_rows;
        const int rows_w = std::min(tile_rows, out - n0);
        const float* w[tile_rows];
        for (int i = 0; i < rows_w; ++i) w[i] = decode(n0 + i, buf.data() + std::size_t(i) * in);
        dot_tile(x + std::size_t(r0) * in, rows_x, in, w, rows_w, y + std::size_t(r0) * out + n0, out);
      }
    });
  }
}

/// x with every row FP8-fake-quantized per 32 (the activation side of the FP8/FP4 GEMMs).
std::vector<float> fake_quant_rows(const float* x, int m, int in) {
  std::vector<float> xq(x, x + std::size_t(m) * in);
  parallel_for(0, m, [&](int64_t r) { fmt::fake_quant_fp8(xq.data() + r * in, in); });
  return xq;
}

}  // namespace

void linear_fp8(const float* x, int m, const fp8_weight& w, float* y) {
  CEDAR_OP_CHECK(w.in % 32 == 0, "linear_fp8: in is a multiple of 32");
  const std::vector<float> xq = fake_quant_rows(x, m, w.in);
  const int blocks = w.in / 32;
  gemm(xq.data(), m, w.out, w.in, [&](int n, float* dst) {
    decode_fp8_row(w.data + std::size_t(n) * w.in, w.scale + std::size_t(n / 32) * blocks, w.in, dst);
    return static_cast<const float*>(dst);
  }, y);
}

void linear_fp4(const float* x, int m, const fp4_weight& w, float* y) {
  CEDAR_OP_CHECK(w.in % 32 == 0, "linear_fp4: in is a multiple of 32");
  const std::vector<float> xq = fake_quant_rows(x, m, w.in);
  const int blocks = w.in / 32;
  gemm(xq.data(), m, w.out, w.in, [&](int n, float* dst) {
    decode_fp4_row(w.data + std::size_t(n) * (w.in / 2), w.scale + std::size_t(n) * blocks, w.in, dst);
    return static_cast<const float*>(dst);
  }, y);
}

void linear_bf16(const float* x, int m, const bf16_weight& w, float* y) {
  gemm(x, m, w.out, w.in, [&](int n, float* dst) {
    decode_bf16_row(w.data + std::size_t(n) * w.in, w.in, dst);
    return static_cast<const float*>(dst);
  }, y);
}

void linear_f32(const float* x, int m, const float* w, int out, int in, float* y) {
  gemm(x, m, out, in, [&](int n, float*) { return w + std::size_t(n) * in; }, y);
}

}  // namespace cedar::cpu
