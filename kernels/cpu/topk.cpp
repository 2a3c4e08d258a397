// CPU reference of the indexer's top-k (spec §2.5 step 7): per row, the k highest scores,
// ties broken towards the lowest index, -inf (invisible) and NaN entries never chosen,
// returned in ascending index order and padded with -1. Exactly deterministic.
#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/cpu/op_check.hpp"
#include "kernels/cpu/topk_row.hpp"
#include "kernels/ops.hpp"
#include "kernels/parallel.hpp"

namespace cedar::cpu {
namespace detail {

void topk_row(const float* s /*[n]*/, int n, int k, int32_t* out /*[k]*/) {
  std::vector<int32_t> cand;
  cand.reserve(n);
  for (int j = 0; j < n; ++j) {
    if (s[j] > -std::numeric_limits<float>::infinity()) cand.push_back(j);  // drops -inf, NaN
  }
  // A total order (score descending, then index ascending), so the chosen set is unique.
  const auto better = [s](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); };
  const int take = std::min<int>(k, static_cast<int>(cand.size()));
  if (take < static_cast<int>(cand.size())) {
    std::nth_element(cand.begin(), cand.begin() + take, cand.end(), better);
  }
  std::sort(cand.begin(), cand.begin() + take);
  for (int i = 0; i < k; ++i) out[i] = i < take ? cand[i] : -1;
}

}  // namespace detail

void topk_indices(const float* scores, int m, int n, int k, int32_t* out) {
  CEDAR_OP_CHECK(k >= 0 && n >= 0, "sizes are non-negative");
  parallel_for(0, m, [&](int64_t r) {
    detail::topk_row(scores + r * n, n, k, out + r * k);
  });
}

}  // namespace cedar::cpu
