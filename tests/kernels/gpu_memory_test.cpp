// The GPU activation estimate that sizes a GPU shard's KV (kernels/cuda_model/gpu_model.hpp,
// gpu_step_reserve_bytes): it must cover the buffers a step of N rows holds at once, grow with
// N, and leave most of an H200 to the KV at the default GPU step.
#include <doctest/doctest.h>

#include <string>

#include "config/engine_options.hpp"
#include "config/model_config.hpp"
#include "kernels/cuda_model/gpu_model.hpp"

using namespace cedar;

TEST_CASE("gpu_step_reserve_bytes covers a step's row buffers and grows with the step") {
  for (const char* preset : {"micro", "tiny", "bench-40L-E64", "deepseek-v4.1-flash"}) {
    std::string error;
    const auto args = load_model_args(preset, &error);
    REQUIRE_MESSAGE(args.has_value(), error);
    const model_args& a = *args;
    for (const int n : {1, 512, engine_options::gpu_step_tokens}) {
      // held together during the routed experts of a step: the fp32 residual [n, hc, dim], q or
      // o [n, heads, head_dim] fp32, and per routed slot the fp32 gate|up [2 inter] and down [dim]
      const int64_t held = int64_t(n) * 4 *
                           (int64_t(a.hc_mult) * a.hidden_size + int64_t(a.num_attention_heads) * a.head_dim +
                            int64_t(a.num_experts_per_tok) * (2 * a.moe_intermediate_size + a.hidden_size));
      CHECK_MESSAGE(gpu_step_reserve_bytes(a, n) > held, preset, " n=", n);
      CHECK(gpu_step_reserve_bytes(a, 2 * n) > gpu_step_reserve_bytes(a, n));
    }
  }
  // the default GPU step of the benchmark model keeps under a sixth of an H200 (141 GB) for
  // activations: the rest of what the weights leave is KV
  std::string error;
  const auto bench = load_model_args("bench-40L-E64", &error);
  REQUIRE(bench.has_value());
  CHECK(gpu_step_reserve_bytes(*bench, engine_options::gpu_step_tokens) < int64_t(141) * 1000 * 1000 * 1000 / 6);
}
