// The GPU model's activation estimate (gpu_model.hpp, gpu_step_reserve_bytes): plain
// arithmetic on the model's shapes, built with or without CUDA.
#include <algorithm>

#include "kernels/cuda_model/gpu_model.hpp"

namespace cedar {

int64_t gpu_step_reserve_bytes(const model_args& a, int step_tokens) {
  const int64_t D = a.hidden_size, hc = a.hc_mult, heads = a.num_attention_heads, hd = a.head_dim,
                ql = a.q_lora_rank, inter = a.moe_intermediate_size, k = a.num_experts_per_tok;
  // per row, fp32: the residual and its copies, q and o (and their parts), the projections, the
  // sublayer buffers; the routed experts' rows: bf16 x, fp32 gate and up, bf16 h, fp32 down
  const int64_t per_row = 4 * (3 * hc * D + 3 * heads * hd + ql + 2 * hd + 4 * D) + k * (2 * D + 10 * inter + 4 * D);
  // the prefill path dequantizes one weight at a time into bf16 (wq_b, wo_b), the experts two
  // (w1 + w3 of the expert being multiplied and of the next, dequantized beside it)
  const int64_t largest_weight =
      std::max({heads * hd * ql, D * int64_t(a.o_groups) * a.o_lora_rank, 2 * (2 * inter * D)});
  return int64_t(step_tokens) * per_row * 3 / 2 + 2 * largest_weight + (int64_t(256) << 20);
}

}  // namespace cedar
