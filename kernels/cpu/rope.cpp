// CPU reference rotary embedding (ops.hpp, spec §2.3): GPT-J adjacent pairs on the last
// rope_dim values of each head, with the YaRN frequency blend of the compressed layers.
// Frequencies, angles, cos and sin are computed in double and rounded once to fp32; the
// rotation itself is the fp32 complex multiply (a + ib)(c + is).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/ops.hpp"
#include "kernels/parallel.hpp"

namespace cedar::cpu {

namespace {

/// The YaRN correction dimension of r rotations: the (fractional) pair index whose
/// wavelength fits r times into the original context.
double correction_dim(const rope_params& p, double rotations) {
  const double pi = 3.14159265358979323846;
  return p.rope_dim * std::log(double(p.original_max_pos) / (rotations * 2.0 * pi)) /
         (2.0 * std::log(p.theta));
}

}  // namespace

// YaRN, as in DeepSeek's precompute_freqs_cis: low = max(floor(c(beta_fast)), 0),
// high = min(ceil(c(beta_slow)), rope_dim - 1) (high += 0.001 when equal), and
// ramp(i) = clamp((i - low) / (high - low), 0, 1) over the pair index i. The blend is
// freq_i / factor * ramp(i) + freq_i * (1 - ramp(i)): pairs i <= low keep their frequency
// (high-frequency, many rotations), pairs i >= high are divided by the factor, and pairs in
// between are interpolated linearly. For the real config (rope_dim 64, theta 160000,
// original 65536, betas 32 and 1): low = 15, high = 25.
void rope_frequencies(const rope_params& p, double* freqs) {
  const int half = p.rope_dim / 2;
  for (int i = 0; i < half; ++i) freqs[i] = std::pow(p.theta, -2.0 * i / p.rope_dim);
  if (!p.yarn) return;
  const double low = std::max(std::floor(correction_dim(p, p.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(p, p.beta_slow)), double(p.rope_dim - 1));
  if (high == low) high += 0.001;
  for (int i = 0; i < half; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    freqs[i] = freqs[i] / p.yarn_factor * ramp + freqs[i] * (1.0 - ramp);
  }
}

void rope(float* x, int m, int num_heads, int head_dim, const int32_t* positions,
          const rope_params& p, bool inverse) {
  const int half = p.rope_dim / 2;
  std::vector<double> freqs(half);
  rope_frequencies(p, freqs.data());
  parallel_for(0, m, [&](int64_t r) {
    thread_local std::vector<float> cos_sin;
    cos_sin.resize(2 * half);
    for (int i = 0; i < half; ++i) {
      const double angle = double(positions[r]) * freqs[i];
      cos_sin[2 * i] = float(std::cos(angle));
      cos_sin[2 * i + 1] = inverse ? -float(std::sin(angle)) : float(std::sin(angle));
    }
    for (int h = 0; h < num_heads; ++h) {
      float* v = x + (std::size_t(r) * num_heads + h) * head_dim + (head_dim - p.rope_dim);
      for (int i = 0; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
        v[2 * i] = a * c - b * s;
        v[2 * i + 1] = a * s + b * c;
      }
    }
  });
}

}  // namespace cedar::cpu
