// CPU reference RMSNorm (ops.hpp): y = (x * rsqrt(mean(x^2) + eps)) * w in fp32, the
// sum of squares in dot_order (dot.hpp), one row per thread.
#include "kernels/cpu/dot.hpp"
#include "kernels/ops.hpp"
#include "kernels/parallel.hpp"

#include <cmath>
#include <cstddef>

namespace cedar::cpu {

void rmsnorm(const float* x, int m, int d, const float* w, float eps, float* y) {
  parallel_for(0, m, [&](int64_t r) {
    const float* xr = x + std::size_t(r) * d;
    float* yr = y + std::size_t(r) * d;
    const float mean_sq = dot(xr, xr, d) / float(d);
    const float inv_rms = 1.0f / std::sqrt(mean_sq + eps);
    for (int i = 0; i < d; ++i) yr[i] = (xr[i] * inv_rms) * w[i];
  });
}

}  // namespace cedar::cpu
