// CPU reference mHC (manifold-constrained hyper-connections, spec §2.2): HCMix computes the
// pre / post / comb mixing weights of one sublayer from the 4-copy residual stream, hc_collapse
// forms the sublayer input, hc_post writes the sublayer output back into the copies. fp32.
//
// Orientation of comb: mix[2hc:] is read row-major as C[j][k] (j = row, k = column). The
// reference HCPost is y = post[k]·f + sum(comb[..., j, k, None] * residual[..., j, None, :],
// dim=j), i.e. X'[k] = post[k]·f + Σ_j C[j,k]·X[j]: the first axis is the input copy j, the last
// axis the output copy k. So comb[j][k] here is that C unchanged, and "softmax along the last
// axis" normalizes, for each input copy j, its weights over the output copies k.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cpu/dot.hpp"
#include "kernels/cpu/op_check.hpp"
#include "kernels/formats.hpp"
#include "kernels/ops.hpp"
#include "kernels/parallel.hpp"

namespace cedar::cpu {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

/// C[j][k] /= (sum over k of row j + eps), for every row j.
void normalize_rows(float* c, int hc, float eps) {
  for (int j = 0; j < hc; ++j) {
    float sum = 0.0f;
    for (int k = 0; k < hc; ++k) sum += c[j * hc + k];
    for (int k = 0; k < hc; ++k) c[j * hc + k] /= sum + eps;
  }
}

/// C[j][k] /= (sum over j of column k + eps), for every column k.
void normalize_columns(float* c, int hc, float eps) {
  for (int k = 0; k < hc; ++k) {
    float sum = 0.0f;
    for (int j = 0; j < hc; ++j) sum += c[j * hc + k];
    for (int j = 0; j < hc; ++j) c[j * hc + k] /= sum + eps;
  }
}

/// comb from its logits: softmax over k, + eps, column normalization, then
/// (iters - 1) rounds of row and column normalization (Sinkhorn).
void sinkhorn(float* c /*[hc, hc], logits in, weights out*/, int hc, int iters, float eps) {
  for (int j = 0; j < hc; ++j) {
    float* row = c + j * hc;
    const float mx = *std::max_element(row, row + hc);
    float sum = 0.0f;
    for (int k = 0; k < hc; ++k) sum += row[k] = std::exp(row[k] - mx);
    for (int k = 0; k < hc; ++k) row[k] = row[k] / sum + eps;
  }
  normalize_columns(c, hc, eps);
  for (int it = 1; it < iters; ++it) {
    normalize_rows(c, hc, eps);
    normalize_columns(c, hc, eps);
  }
}

}  // namespace

void hc_mix(const float* X, int m, int hc, int d, const float* fn, const float* scale,
            const float* base, int sinkhorn_iters, float hc_eps, float norm_eps, float* pre,
            float* post, float* comb) {
  const int n_mix = hc * hc + 2 * hc;
  const int n_in = hc * d;
  std::vector<float> mix(std::size_t(m) * n_mix);
  linear_f32(X, m, fn, n_mix, n_in, mix.data());
  parallel_for(0, m, [&](int64_t r) {
    const float* v = X + std::size_t(r) * n_in;
    const float inv_rms = 1.0f / std::sqrt(dot(v, v, n_in) / float(n_in) + norm_eps);
    float* mr = mix.data() + std::size_t(r) * n_mix;
    for (int i = 0; i < n_mix; ++i) mr[i] *= inv_rms;
    for (int j = 0; j < hc; ++j) {
      pre[r * hc + j] = sigmoid(mr[j] * scale[0] + base[j]) + hc_eps;
      post[r * hc + j] = 2.0f * sigmoid(mr[hc + j] * scale[1] + base[hc + j]);
    }
    float* c = comb + std::size_t(r) * hc * hc;
    for (int i = 0; i < hc * hc; ++i) c[i] = mr[2 * hc + i] * scale[2] + base[2 * hc + i];
    sinkhorn(c, hc, sinkhorn_iters, hc_eps);
  });
}

void hc_collapse(const float* X, const float* pre, int m, int hc, int d, float* out) {
  parallel_for(0, m, [&](int64_t r) {
    const float* xr = X + std::size_t(r) * hc * d;
    float* o = out + std::size_t(r) * d;
    for (int i = 0; i < d; ++i) {
      float s = 0.0f;
      for (int j = 0; j < hc; ++j) s += pre[r * hc + j] * xr[std::size_t(j) * d + i];
      o[i] = s;
    }
  });
}

// X'[k] = round_bf16(post[k]·f + Σ_j C[j,k]·X[j]), the sum over j ascending. Each element of
// a row reads all hc copies before any of them is written, so X_out may alias X.
void hc_post(const float* f, const float* X, const float* post, const float* comb, int m, int hc,
             int d, float* X_out) {
  constexpr int max_hc = 16;
  CEDAR_OP_CHECK(hc <= max_hc, "hc_post: hc <= 16");
  parallel_for(0, m, [&](int64_t r) {
    const float* xr = X + std::size_t(r) * hc * d;
    float* yr = X_out + std::size_t(r) * hc * d;
    const float* c = comb + std::size_t(r) * hc * hc;
    const float* pr = post + std::size_t(r) * hc;
    const float* fr = f + std::size_t(r) * d;
    float in[max_hc];
    for (int i = 0; i < d; ++i) {
      for (int j = 0; j < hc; ++j) in[j] = xr[std::size_t(j) * d + i];
      for (int k = 0; k < hc; ++k) {
        float s = 0.0f;
        for (int j = 0; j < hc; ++j) s += c[j * hc + k] * in[j];
        yr[std::size_t(k) * d + i] = fmt::round_bf16(pr[k] * fr[i] + s);
      }
    }
  });
}

}  // namespace cedar::cpu
