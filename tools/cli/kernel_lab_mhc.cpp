// The mHC boundary cases of `cedar kernel-lab` (kernel_lab.hpp): one sublayer boundary of the
// V4.1-Flash residual (hc = 4 copies of d = 5120, 20 Sinkhorn iterations: HCPost of the
// sublayer before, HCMix, collapse, RMSNorm) at 1, 2, 8, 64, 256 and 8192 rows. fast::hc_boundary in one
// launch (which it takes for one row; up to 8 here, to show why not more) and in two, against
// the exact CUDA ops (hc_post, hc_mix, hc_collapse, rmsnorm), each checked against the CPU ops
// on fresh random inputs; and the one launch with no Sinkhorn iteration (not checked): what the
// serial chain of 2 x 20 normalizations costs. Bytes are what a call must move: the HCMix
// weights, X read and written, f, the normalized input.
#ifdef CEDAR_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda/fast/layer_ops.hpp"
#include "kernels/ops.hpp"
#include "tools/cli/kernel_lab.hpp"

namespace cedar::lab {
namespace {

namespace fast = cuda::fast;

constexpr int hc = 4, dim = 5120, n_mix = hc * hc + 2 * hc, iters = 20;
constexpr float hc_eps = 1e-6f, eps = 1e-6f;

std::vector<float> uniform(std::mt19937_64& rng, std::size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

/// max |a - b| / max |b|.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, mx = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    err = std::max(err, double(std::fabs(a[i] - b[i])));
    mx = std::max(mx, double(std::fabs(b[i])));
  }
  return err / std::max(mx, 1e-30);
}

/// One boundary's inputs at m rows, with the CPU's outputs.
struct boundary_case {
  int m;
  std::vector<float> X, f, fn, scale, base, post0, comb0, cpre, norm_w;
  std::vector<float> X1, pre, post, comb, x;  // the CPU's

  boundary_case(int rows, std::mt19937_64& rng) : m(rows) {
    X = uniform(rng, std::size_t(m) * hc * dim, -1.0f, 1.0f);
    f = uniform(rng, std::size_t(m) * dim, -1.0f, 1.0f);
    fn = uniform(rng, std::size_t(n_mix) * hc * dim, -0.05f, 0.05f);
    scale = {0.7f, 0.9f, 1.1f};
    base = uniform(rng, n_mix, -0.5f, 0.5f);
    post0 = uniform(rng, std::size_t(m) * hc, 0.2f, 1.8f);
    comb0 = uniform(rng, std::size_t(m) * hc * hc, 0.0f, 0.5f);
    cpre = uniform(rng, std::size_t(m) * hc, 0.1f, 1.0f);
    norm_w = uniform(rng, dim, 0.5f, 1.5f);
    X1 = X, pre.resize(std::size_t(m) * hc), post.resize(pre.size()), comb.resize(std::size_t(m) * hc * hc);
    x.resize(std::size_t(m) * dim);
    cpu::hc_post(f.data(), X.data(), post0.data(), comb0.data(), m, hc, dim, X1.data());
    cpu::hc_mix(X1.data(), m, hc, dim, fn.data(), scale.data(), base.data(), iters, hc_eps, eps, pre.data(),
                post.data(), comb.data());
    cpu::hc_collapse(X1.data(), cpre.data(), m, hc, dim, x.data());
    cpu::rmsnorm(x.data(), m, dim, norm_w.data(), eps, x.data());
  }
};

/// The device buffers of one variant's run.
struct boundary_run {
  dbuf<float> X, f, fn, scale, base, post, comb, cpre, norm_w, pre, x;
  explicit boundary_run(const boundary_case& c)
      : X(c.X),
        f(c.f),
        fn(c.fn),
        scale(c.scale),
        base(c.base),
        post(c.post0),
        comb(c.comb0),
        cpre(c.cpre),
        norm_w(c.norm_w),
        pre(c.pre),
        x(c.x) {}
  void fast_call(int m, fast::hc_launches launches, int sinkhorn_iters) {
    const fast::hc_mix_params p{fn.p, scale.p, base.p, sinkhorn_iters, hc_eps, eps};
    fast::hc_boundary(X.p, m, hc, dim, f.p, post.p, comb.p, p, pre.p, cpre.p, norm_w.p, x.p, launches);
  }
  void exact_call(int m) {
    cuda::hc_post(f.p, X.p, post.p, comb.p, m, hc, dim, X.p);
    cuda::hc_mix(X.p, m, hc, dim, fn.p, scale.p, base.p, iters, hc_eps, eps, pre.p, post.p, comb.p);
    cuda::hc_collapse(X.p, cpre.p, m, hc, dim, x.p);
    cuda::rmsnorm(x.p, m, dim, norm_w.p, eps, x.p);
  }
  /// The largest error against the CPU over pre, post, comb and x; X must be bit-identical.
  double check(const boundary_case& c, bool& x_same) const {
    const auto hX = X.host();
    x_same = std::memcmp(hX.data(), c.X1.data(), hX.size() * sizeof(float)) == 0;
    return std::max({rel_err(pre.host(), c.pre), rel_err(post.host(), c.post), rel_err(comb.host(), c.comb),
                     rel_err(x.host(), c.x)});
  }
};

}  // namespace

std::vector<lab_case> run_mhc_cases(bool quick) {
  std::vector<lab_case> cases;
  std::mt19937_64 rng(2027);
  for (const int m : {1, 2, 8, 64, 256, 8192}) {  // 256: a large decode batch; 8192: a prefill chunk
    if (quick && (m == 2 || m == 8 || m == 8192)) continue;
    const boundary_case c(m, rng);
    lab_case base;
    base.op = "mhc", base.shape = "hc 4 x 5120", base.m = m, base.n = dim, base.k = hc;
    base.bytes = 4.0 * n_mix * hc * dim + 4.0 * m * (2.0 * hc * dim + 2.0 * dim);
    std::vector<float> first_x;  // the first fast variant's outputs, for the bit comparison
    const auto add_fast = [&](const char* name, fast::hc_launches launches, int sinkhorn_iters) {
      lab_case lc = base;
      lc.variant = name;
      {
        boundary_run r(c);
        r.fast_call(m, launches, sinkhorn_iters);
        if (sinkhorn_iters == iters) {
          bool x_same = false;
          lc.checked = true;
          lc.max_err_ratio = r.check(c, x_same);
          lc.pass = x_same && lc.max_err_ratio <= 1e-5;
          const auto x = r.x.host();
          if (first_x.empty()) first_x = x;
          lc.same_bits = std::memcmp(x.data(), first_x.data(), x.size() * sizeof(float)) == 0;
        }
      }
      boundary_run r(c);
      const auto call = [&](int) { r.fast_call(m, launches, sinkhorn_iters); };
      lc.eager_us = 1e3 * fast::time_ms(call, 3, 50);
      lc.time_us = 1e3 * fast::graph_time_ms(call, 50);
      cases.push_back(lc);
    };
    const bool one = m <= fast::hc_one_launch_capacity;  // hc_boundary takes it for one row only
    if (one) add_fast("one launch", fast::hc_launches::one, iters);
    add_fast("two launches", fast::hc_launches::two, iters);
    if (one) add_fast("one, 0 iters", fast::hc_launches::one, 0);
    lab_case ex = base;
    ex.variant = "exact";
    {
      boundary_run r(c);
      r.exact_call(m);
      bool x_same = false;
      ex.checked = true;
      ex.max_err_ratio = r.check(c, x_same);
      ex.pass = x_same && ex.max_err_ratio <= 1e-5;
      ex.same_bits = true;  // the CPU's bits, not the fast set's
    }
    boundary_run r(c);
    ex.eager_us = 1e3 * fast::time_ms([&](int) { r.exact_call(m); }, 2, 10);
    ex.time_us = 1e3 * fast::graph_time_ms([&](int) { r.exact_call(m); }, 10);
    cases.push_back(ex);
  }
  return cases;
}

}  // namespace cedar::lab

#endif  // CEDAR_HAVE_CUDA
