// The MoE sublayer (spec §2.7): sqrt-softplus routing with a selection-only bias, the routed
// experts and the shared expert summed in fp32, the sum rounded to bf16 as the reference
// stores it. Row-independent, so a row's output does not depend on the batch.
#include <vector>

#include "kernels/formats.hpp"
#include "kernels/model/forward_pass.hpp"
#include "kernels/model/shard_forward.hpp"

namespace cedar::model_detail {

void moe_sublayer(const layer_context& c, const float* y, int n, float* out) {
  if (c.shard) return sharded_moe_sublayer(c, y, n, out);
  const model_args& a = c.args;
  const ffn_weights& w = c.w.ffn;
  const int k = a.num_experts_per_tok;
  std::vector<int32_t> sel(std::size_t(n) * k);  // [n, topk] expert ids
  std::vector<float> weights(std::size_t(n) * k);  // [n, topk] routing weights
  cpu::moe_route(y, n, w.gate, w.gate_bias.data(), k, float(a.routed_scaling_factor), sel.data(),
                 weights.data());
  cpu::moe_ffn(y, n, a.hidden_size, sel.data(), weights.data(), k, w.experts.data(),
               int(w.experts.size()), a.n_shared_experts > 0 ? &w.shared : nullptr,
               float(a.swiglu_limit), out);
  for (std::size_t i = 0; i < std::size_t(n) * a.hidden_size; ++i) out[i] = fmt::round_bf16(out[i]);
}

}  // namespace cedar::model_detail
