// CPU reference of the KV compressors (spec §2.4). Ratio 2 merges the tokens of each pair
// (2j, 2j+1), numbered by absolute position, with a per-channel softmax over the pair's gate
// values; a pair cut by the end of a chunk parks its even token in the caller's `tail`.
// Ratio 1 normalizes each token's projection. Outputs are raw (pre-RoPE) fp32 latents.
#include <cmath>
#include <vector>

#include "kernels/cpu/op_check.hpp"
#include "kernels/ops.hpp"

namespace cedar::cpu {
namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

/// latent[c] = sigmoid(g0 - g1)[c] * a0[c] + sigmoid(g1 - g0)[c] * a1[c] (the pair softmax).
void merge_pair(const float* a0, const float* g0, const float* a1, const float* g1, int d,
                float* latent /*[d]*/) {
  for (int c = 0; c < d; ++c) {
    latent[c] = sigmoid(g0[c] - g1[c]) * a0[c] + sigmoid(g1[c] - g0[c]) * a1[c];
  }
}

}  // namespace

int compress_ratio2(const float* x, int m, int64_t first_pos, const bf16_weight& wkv,
                    const bf16_weight& wgate, const float* norm, float eps, float* tail,
                    float* latents) {
  CEDAR_OP_CHECK(wkv.out == wgate.out && wkv.in == wgate.in, "wkv and wgate shapes agree");
  CEDAR_OP_CHECK(first_pos >= 0 && m >= 0, "positions are non-negative");
  if (m == 0) return 0;
  const int d = wkv.out;
  std::vector<float> a(static_cast<size_t>(m) * d), g(static_cast<size_t>(m) * d);
  linear_bf16(x, m, wkv, a.data());
  linear_bf16(x, m, wgate, g.data());

  int num_latents = 0;
  for (int t = 0; t < m; ++t) {
    const int64_t pos = first_pos + t;
    const float* a_t = a.data() + static_cast<int64_t>(t) * d;
    const float* g_t = g.data() + static_cast<int64_t>(t) * d;
    if (pos % 2 == 0) {
      if (t == m - 1) {  // the pair completes in a later call
        std::copy(a_t, a_t + d, tail);
        std::copy(g_t, g_t + d, tail + d);
      }
      continue;
    }
    const float* a_prev = t > 0 ? a_t - d : tail;
    const float* g_prev = t > 0 ? g_t - d : tail + d;
    merge_pair(a_prev, g_prev, a_t, g_t, d, latents + static_cast<int64_t>(num_latents) * d);
    ++num_latents;
  }
  rmsnorm(latents, num_latents, d, norm, eps, latents);
  return num_latents;
}

void compress_ratio1(const float* x, int m, const bf16_weight& wkv, const float* norm,
                     float eps, float* latents) {
  linear_bf16(x, m, wkv, latents);
  rmsnorm(latents, m, wkv.out, norm, eps, latents);
}

}  // namespace cedar::cpu
