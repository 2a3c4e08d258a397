// The rank-aware pieces of the forward pass (see shard_plan.hpp), called from the attention
// and MoE sublayers when a layer_context carries a shard_view. Internal to kernels/model.
#pragma once

#include <vector>

#include "kernels/model/forward_pass.hpp"
#include "kernels/model/shard_plan.hpp"
#include "kernels/weights.hpp"

namespace cedar::model_detail {

/// Rows of w for query heads [h0, h0 + nh) of head_dim dh each (a view; dh % 32 == 0).
fp8_weight head_rows(const fp8_weight& w, int h0, int nh, int dh);

/// o [n, s.num_heads(), dh] (this rank's heads) becomes [n, all heads, dh]: the ranks' head
/// blocks gathered in rank order (= head order).
void gather_heads(const shard_view& s, std::vector<float>& o, int n, int dh);

/// The MoE sublayer of a rank (TP or DEP, size > 1): same contract and same bits as
/// moe_sublayer on one rank. y and out may be null when n == 0 (a DEP rank with no rows
/// still serves its experts to the others).
void sharded_moe_sublayer(const layer_context& c, const float* y /*[n, dim]*/, int n,
                          float* out /*[n, dim]*/);

}  // namespace cedar::model_detail
