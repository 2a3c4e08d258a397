// CPU reference of the Engram block (spec §2.8): gather each token's hashed FP8 rows,
// project them to hc keys and one shared value, and add the gated value to every copy of
// the residual stream (rounded to bf16). Rows are independent; each is reduced in a fixed order.
#include <cmath>
#include <vector>

#include "kernels/cpu/op_check.hpp"
#include "kernels/formats.hpp"
#include "kernels/ops.hpp"
#include "kernels/parallel.hpp"

namespace cedar::cpu {
namespace {

/// Dequantizes table row `row` (E4M3 with one UE8M0 scale per 32) into out[head_dim].
void gather_row(const engram_weights& w, int64_t row, float* out) {
  const int hd = w.head_dim;
  const uint8_t* codes = w.table + row * hd;
  const uint8_t* scales = w.table_scale + row * (hd / 32);
  for (int i = 0; i < hd; ++i) {
    out[i] = fmt::e4m3_to_f32(codes[i]) * fmt::ue8m0_to_f32(scales[i / 32]);
  }
}

float mean_square(const float* v, int d) {
  float s = 0.0f;
  for (int i = 0; i < d; ++i) s += v[i] * v[i];
  return s / static_cast<float>(d);
}

/// X_h += gate * value, with gate from the normalized dot of X_h and key (spec §2.8).
void gate_copy(float* x /*[d]*/, const float* key /*[d]*/, const float* value /*[d]*/,
               const float* qw /*[d]*/, const float* kw /*[d]*/, int d, float eps) {
  float dot = 0.0f;
  for (int c = 0; c < d; ++c) dot += x[c] * (qw[c] * kw[c]) * key[c];
  dot = dot * (1.0f / std::sqrt(mean_square(x, d) + eps)) *
        (1.0f / std::sqrt(mean_square(key, d) + eps)) / std::sqrt(static_cast<float>(d));
  const float sign = dot > 0.0f ? 1.0f : (dot < 0.0f ? -1.0f : 0.0f);
  const float z = sign * std::sqrt(std::max(std::fabs(dot), 1e-6f));
  const float gate = 1.0f / (1.0f + std::exp(-z));
  for (int c = 0; c < d; ++c) x[c] = fmt::round_bf16(x[c] + gate * value[c]);
}

}  // namespace

void engram(float* X, int m, int hc, int d, const int64_t* rows, int rows_per_token,
            const engram_weights& w, float eps) {
  const int64_t flat = static_cast<int64_t>(rows_per_token) * w.head_dim;
  CEDAR_OP_CHECK(w.head_dim % 32 == 0, "head_dim is whole UE8M0 groups");
  CEDAR_OP_CHECK(w.wkv.in == flat && w.wkv.out == (hc + 1) * d, "wkv shape");
  std::vector<float> emb(static_cast<size_t>(m) * flat);
  for (int64_t i = 0; i < static_cast<int64_t>(m) * rows_per_token; ++i) {
    CEDAR_OP_CHECK(rows[i] >= 0 && rows[i] < w.num_rows, "Engram row id inside the table");
    gather_row(w, rows[i], emb.data() + i * w.head_dim);
  }
  std::vector<float> kv(static_cast<size_t>(m) * (hc + 1) * d);
  linear_fp8(emb.data(), m, w.wkv, kv.data());
  parallel_for(0, static_cast<int64_t>(m) * hc, [&](int64_t rh) {
    const int64_t r = rh / hc;
    const int h = static_cast<int>(rh % hc);
    const float* kv_r = kv.data() + r * (hc + 1) * d;
    gate_copy(X + rh * d, kv_r + static_cast<int64_t>(h) * d, kv_r + static_cast<int64_t>(hc) * d,
              w.q_weight + static_cast<int64_t>(h) * d, w.k_weight + static_cast<int64_t>(h) * d,
              d, eps);
  });
}

}  // namespace cedar::cpu
