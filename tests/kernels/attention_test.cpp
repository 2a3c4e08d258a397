// sparse_attention and grouped_output against slow double-precision versions written from
// the spec's formulas, plus batch invariance (a row's bits do not depend on the batch).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "kernels/ops.hpp"
#include "tests/kernels/op_reference.hpp"

using namespace cedar;
using namespace cedar::op_reference;

namespace {

/// o = (sum_c exp(s_c - mx) v_c) / (exp(sink - mx) + sum_c exp(s_c - mx)), mx over s and sink.
std::vector<double> attention_reference(const std::vector<float>& q, int m, int heads, int dim,
                                        const std::vector<float>& kv,
                                        const std::vector<int32_t>& idx, int num_idx,
                                        const std::vector<float>& sink, float scale) {
  std::vector<double> out(static_cast<size_t>(m) * heads * dim, 0.0);
  for (int r = 0; r < m; ++r)
    for (int h = 0; h < heads; ++h) {
      const float* qh = &q[(static_cast<size_t>(r) * heads + h) * dim];
      std::vector<double> s;
      std::vector<int> rows;
      for (int c = 0; c < num_idx; ++c) {
        const int j = idx[static_cast<size_t>(r) * num_idx + c];
        if (j < 0) continue;
        double d = 0;
        for (int i = 0; i < dim; ++i) d += double(qh[i]) * kv[static_cast<size_t>(j) * dim + i];
        s.push_back(d * scale);
        rows.push_back(j);
      }
      double mx = sink[h];
      for (double v : s) mx = std::max(mx, v);
      double denom = std::exp(double(sink[h]) - mx);
      for (double v : s) denom += std::exp(v - mx);
      double* o = &out[(static_cast<size_t>(r) * heads + h) * dim];
      for (size_t c = 0; c < s.size(); ++c)
        for (int i = 0; i < dim; ++i)
          o[i] += std::exp(s[c] - mx) / denom * kv[static_cast<size_t>(rows[c]) * dim + i];
    }
  return out;
}

}  // namespace

TEST_CASE("sparse_attention matches the sink softmax formula and skips empty slots") {
  std::mt19937_64 rng(11);
  const int m = 5, heads = 4, dim = 64, num_kv = 40, num_idx = 24;
  const float scale = 1.0f / std::sqrt(float(dim));
  auto q = random_floats(rng, size_t(m) * heads * dim, -2, 2);
  auto kv = random_floats(rng, size_t(num_kv) * dim, -2, 2);
  std::vector<int32_t> idx(size_t(m) * num_idx);
  for (auto& j : idx) j = rng() % 4 == 0 ? -1 : int32_t(rng() % num_kv);
  for (int c = 0; c < num_idx; ++c) idx[size_t(2) * num_idx + c] = -1;  // row 2: nothing to see
  // One head's sink dominates, one is negligible.
  std::vector<float> sink = {0.5f, 30.0f, -30.0f, -1.0f};

  std::vector<float> out(size_t(m) * heads * dim);
  cpu::sparse_attention(q.data(), m, heads, dim, kv.data(), idx.data(), num_idx, sink.data(),
                        scale, out.data());
  auto ref = attention_reference(q, m, heads, dim, kv, idx, num_idx, sink, scale);
  CHECK(rel_error(out.data(), ref.data(), out.size()) < 1e-5);
  for (int i = 0; i < heads * dim; ++i) CHECK(out[size_t(2) * heads * dim + i] == 0.0f);

  SUBCASE("a row's result does not depend on the other rows") {
    for (int r = 0; r < m; ++r) {
      std::vector<float> one(size_t(heads) * dim);
      cpu::sparse_attention(q.data() + size_t(r) * heads * dim, 1, heads, dim, kv.data(),
                            idx.data() + size_t(r) * num_idx, num_idx, sink.data(), scale,
                            one.data());
      CHECK(same_bits(one.data(), out.data() + size_t(r) * heads * dim, one.size()));
    }
  }
}

TEST_CASE("grouped_output applies wo_a block-diagonally per group, then the FP8 wo_b") {
  std::mt19937_64 rng(12);
  const int m = 3, groups = 2, heads_per_group = 2, dim = 64, rank = 32, d_out = 96;
  const int group_in = heads_per_group * dim;
  auto o = random_floats(rng, size_t(m) * groups * group_in, -1, 1);
  auto wo_a = random_bf16(rng, groups * rank, group_in, 0.1f);
  auto wo_b = random_fp8(rng, d_out, groups * rank);

  std::vector<float> out(size_t(m) * d_out);
  cpu::grouped_output(o.data(), m, groups, wo_a.view, wo_b.view, out.data());

  // u[r, g*rank + i] = sum_k wo_a[g*rank + i, k] * o[r, g*group_in + k]: group g sees only its heads.
  const auto a = dequant(wo_a.view);
  std::vector<float> u(size_t(m) * groups * rank);
  for (int r = 0; r < m; ++r)
    for (int g = 0; g < groups; ++g)
      for (int i = 0; i < rank; ++i) {
        double s = 0;
        for (int k = 0; k < group_in; ++k)
          s += double(a[size_t(g * rank + i) * group_in + k]) *
               o[(size_t(r) * groups + g) * group_in + k];
        u[(size_t(r) * groups + g) * rank + i] = float(s);
      }
  auto ref = dense_linear(u.data(), m, dequant(wo_b.view), d_out, groups * rank, true);
  CHECK(rel_error(out.data(), ref.data(), out.size()) < 5e-3);

  std::vector<float> one(d_out);
  cpu::grouped_output(o.data() + size_t(m - 1) * groups * group_in, 1, groups, wo_a.view,
                      wo_b.view, one.data());
  CHECK(same_bits(one.data(), out.data() + size_t(m - 1) * d_out, d_out));
}
