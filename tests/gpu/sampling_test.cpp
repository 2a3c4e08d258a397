// The device sampler (cuda::sample_rows) against the runtime's host sampler (actors/sampler.cpp):
// the same token for greedy, temperature, top-k, top-p and their mix over many seeds, on rows
// with exact ties; log-probabilities within 1e-6 (exp and log of doubles may differ in the
// last ulp between the device and the host libm).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "actors/sampler.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "tests/gpu/gpu_test_util.hpp"

using namespace cedar;
using namespace cedar::gpu_test;

TEST_CASE("gpu sampling: the host sampler's tokens for every rule") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(110);
  // CEDAR_GPU_TEST_QUICK (tools/gpu_sanitize.sh): at the full vocabulary one rule (temperature,
  // top-k and top-p together) at one position, as the one-thread draw walks every logit and runs
  // 10-100x slower under compute-sanitizer; vocabulary 1000 still runs every rule.
  const bool quick = std::getenv("CEDAR_GPU_TEST_QUICK") != nullptr;
  for (const int vocab : {1000, 129280}) {
    const int rows = 8;
    auto logits = op_reference::random_floats(rng, std::size_t(rows) * vocab, -4.0f, 4.0f);
    // ties: row 1 has many equal top logits; row 2 quantized to a coarse grid; -0 and +0 in row 3
    for (int j = 0; j < vocab; j += 3) logits[std::size_t(1) * vocab + j] = 4.5f;
    for (int j = 0; j < vocab; ++j) logits[std::size_t(2) * vocab + j] = std::round(logits[std::size_t(2) * vocab + j]);
    for (int j = 0; j < vocab; j += 2) logits[std::size_t(3) * vocab + j] = j % 4 ? 0.0f : -0.0f;
    dev<float> dl(logits);
    const sampling_params rules[] = {{.temperature = 0.f, .seed = 1},
                                     {.temperature = 0.7f, .seed = 2},
                                     {.temperature = 1.0f, .top_k = 50, .seed = 3},
                                     {.temperature = 1.3f, .top_p = 0.9f, .seed = 4},
                                     {.temperature = 0.8f, .top_k = 40, .top_p = 0.5f, .seed = 5},
                                     {.temperature = 2.0f, .top_k = 1, .seed = 6}};
    int same = 0, total = 0;
    double worst_lp = 0;
    for (const sampling_params& rule : rules)
      for (int64_t token_idx : {0, 1, 17}) {
        if (quick && vocab > 1000 && (&rule != &rules[4] || token_idx != 17)) continue;
        std::vector<cuda::sample_request> req(rows);
        for (int r = 0; r < rows; ++r)
          req[r] = {rule.temperature, rule.top_k, rule.top_p, rule.seed + uint64_t(r), token_idx};
        dev<int32_t> dt(rows);
        dev<float> dlp(rows);
        cuda::sample_rows(dl.get(), rows, vocab, req.data(), dt.get(), dlp.get());
        const auto t = dt.host();
        const auto lp = dlp.host();
        for (int r = 0; r < rows; ++r) {
          sampling_params p = rule;
          p.seed = rule.seed + uint64_t(r);
          const sampled_token s =
              sample(std::span<const float>(logits).subspan(std::size_t(r) * vocab, vocab), p, token_idx);
          same += s.token_id == t[r];
          ++total;
          if (s.token_id == t[r]) worst_lp = std::max(worst_lp, double(std::fabs(s.logprob - lp[r])));
        }
      }
    std::printf("  sample_rows vocab %6d: %d/%d tokens equal the host sampler's, logprob max |diff| %.2e\n",
                vocab, same, total, worst_lp);
    CHECK(same == total);
    CHECK(worst_lp <= 1e-6);
  }
}
