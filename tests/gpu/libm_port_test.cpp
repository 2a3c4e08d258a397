// The device exp and log1p (kernels/cuda/expf_port.hpp) against this machine's C library on
// every 7th float: the ports must give the library's bits (they run the same operations on the
// device, built without fused multiply-adds). Runs on the host; needs no GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/expf_port.hpp"

TEST_CASE("expf and log1pf ports give the C library's bits") {
  int64_t exp_bad = 0, log1p_bad = 0, n = 0;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 7) {
    float x;
    const uint32_t v = uint32_t(u);
    std::memcpy(&x, &v, 4);
    const float e = std::exp(x), l = std::log1p(x);
    const float pe = cedar::libm_port::expf(x), pl = cedar::libm_port::log1pf(x);
    exp_bad += std::memcmp(&e, &pe, 4) != 0 && !(std::isnan(e) && std::isnan(pe));
    log1p_bad += std::memcmp(&l, &pl, 4) != 0 && !(std::isnan(l) && std::isnan(pl));
    ++n;
  }
  MESSAGE("libm ports over ", n, " floats: exp mismatches ", exp_bad, ", log1p mismatches ", log1p_bad);
  CHECK(exp_bad == 0);
  CHECK(log1p_bad == 0);
}
