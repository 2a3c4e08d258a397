// Sampling on the device at the end of a forward call (gpu_model::forward_sample): the tokens
// the host sampler draws from the logits that gpu_model::forward returns for the same requests
// (greedy rows in one launch, the others by the device sampler), logprobs within 1e-5, and the
// KV advanced as forward advances it; the GPU shard's mixed batch (rows that need the host
// sampler next to rows drawn on the device). Also cuda::fast::greedy_rows on its own.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "actors/gpu_shard.hpp"
#include "actors/sampler.hpp"
#include "config/model_config.hpp"
#include "kernels/cuda/fast/layer_ops.hpp"
#include "kernels/cuda_model/gpu_model.hpp"
#include "kernels/model/random_weights.hpp"
#include "tests/gpu/gpu_test_util.hpp"

using namespace cedar;
using namespace cedar::gpu_test;

TEST_CASE("fast greedy_rows: argmax (ties to the lowest id) and its log-softmax") {
  if (!have_gpu()) return;
  std::mt19937_64 rng(501);
  const int m = 9, vocab = 129280;
  auto logits = activations(rng, m, vocab);
  logits[size_t(3) * vocab + 77] = logits[size_t(3) * vocab + 5000] = 1e3f;  // a tie
  dev<float> d(logits);
  dev<int32_t> tok(m);
  dev<float> lp(m);
  cuda::fast::greedy_rows(d.get(), m, vocab, tok.get(), lp.get());
  const auto t = tok.host();
  const auto l = lp.host();
  for (int r = 0; r < m; ++r) {
    const auto s = sample(std::span<const float>(logits).subspan(size_t(r) * vocab, vocab), {}, 0);
    CHECK(t[r] == s.token_id);
    CHECK(std::abs(l[r] - s.logprob) <= 1e-5f * std::max(1.0f, std::abs(s.logprob)));
  }
  CHECK(t[3] == 77);
}

TEST_CASE("gpu model: forward_sample draws the host sampler's tokens from forward's logits") {
  if (!have_gpu()) return;
  std::string error;
  const auto args = load_model_args("micro", &error);
  REQUIRE_MESSAGE(args.has_value(), error);
  const auto weights = std::make_shared<tensor_map>(make_random_weights(*args, 77));
  for (const gpu_kernels kernels : {gpu_kernels::exact, gpu_kernels::fast}) {
    gpu_model m(*args, weights, kv_dtype::fp4, {}, kernels);
    gpu_kv_arena arena(m.layout(), 0.02);
    const std::vector<std::vector<int32_t>> prompts = {{5, 9, 13, 200, 7}, {42, 43}, {1000, 3, 3, 3, 3, 3, 3, 9}};
    const std::vector<sampling_params> params = {
        {}, {.temperature = 0.8f, .top_p = 0.9f, .seed = 7}, {.temperature = 1.3f, .top_k = 20, .seed = 11}};
    // reference: forward's logits, sampled on the host
    std::vector<sampled_token> expect;
    std::vector<float> logits;
    {
      std::vector<request_kv> kvs;
      for (auto& p : prompts) kvs.push_back(*arena.allocate(64));
      std::vector<forward_item> batch(prompts.size());
      for (size_t i = 0; i < prompts.size(); ++i) batch[i].kv = &kvs[i], batch[i].tokens = prompts[i];
      m.forward(batch, logits);
      for (size_t i = 0; i < prompts.size(); ++i)
        expect.push_back(
            sample(std::span<const float>(logits).subspan(i * args->vocab_size, args->vocab_size), params[i], 3));
      for (auto& kv : kvs) arena.release(kv);
    }
    std::vector<request_kv> kvs;
    for (auto& p : prompts) kvs.push_back(*arena.allocate(64));
    std::vector<forward_item> batch(prompts.size());
    std::vector<cuda::sample_request> requests;
    for (size_t i = 0; i < prompts.size(); ++i) {
      batch[i].kv = &kvs[i], batch[i].tokens = prompts[i];
      requests.push_back({params[i].temperature, params[i].top_k, params[i].top_p, params[i].seed, 3});
    }
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    m.forward_sample(batch, requests, tokens, logprobs);
    REQUIRE(tokens.size() == prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      INFO("kernels " << (kernels == gpu_kernels::fast ? "fast" : "exact") << ", request " << i);
      CHECK(tokens[i] == expect[i].token_id);
      CHECK(std::abs(logprobs[i] - expect[i].logprob) <= 1e-5f * std::max(1.0f, std::abs(expect[i].logprob)));
      CHECK(kvs[i].num_tokens == int64_t(prompts[i].size()));
    }
    for (auto& kv : kvs) arena.release(kv);
  }
}

TEST_CASE("gpu shard: rows needing the host sampler (top logprobs, a mask) are drawn there, the rest on the device") {
  if (!have_gpu()) return;
  std::string error;
  const auto args = load_model_args("micro", &error);
  REQUIRE_MESSAGE(args.has_value(), error);
  const auto weights = std::make_shared<tensor_map>(make_random_weights(*args, 78));
  auto model =
      std::make_shared<const gpu_model>(*args, weights, kv_dtype::fp4, upload_progress_fn{}, gpu_kernels::fast);
  gpu_step_model shard_model(model, false);
  gpu_kv_arena arena(model->layout(), 0.02);
  const std::vector<std::vector<int32_t>> prompts = {{5, 9, 13}, {42, 43}, {1000, 3, 9}, {7, 7}, {300}};
  std::vector<sampling_params> params(5);
  params[1] = {0.8f, 0, 0.9f, 7};  // sampled on the device
  params[2].logprobs = 3;          // greedy with top alternatives: host
  params[3] = {1.1f, 0, 1.f, 5};   // sampled, and a mask that bans what greedy would pick: host
  params[4].logprobs = 2, params[4].temperature = 0.7f, params[4].seed = 9;
  const std::vector<int64_t> token_idx(prompts.size(), 4);
  std::vector<float> logits;  // the reference: every row's logits on the host
  {
    std::vector<request_kv> kvs;
    for (std::size_t i = 0; i < prompts.size(); ++i) kvs.push_back(*arena.allocate(64));
    std::vector<forward_item> batch(prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) batch[i].kv = &kvs[i], batch[i].tokens = prompts[i];
    model->forward(batch, logits);
    for (auto& kv : kvs) arena.release(kv);
  }
  const std::size_t vocab = std::size_t(args->vocab_size);
  const auto row = [&](std::size_t i) { return std::span<const float>(logits).subspan(i * vocab, vocab); };
  params[3].allowed.assign((vocab + 63) / 64, ~uint64_t{0});
  const int32_t banned = sample(row(3), {}, 0).token_id;
  params[3].allowed[std::size_t(banned) / 64] &= ~(uint64_t{1} << (banned % 64));
  std::vector<request_kv> kvs;
  for (std::size_t i = 0; i < prompts.size(); ++i) kvs.push_back(*arena.allocate(64));
  std::vector<forward_item> batch(prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) batch[i].kv = &kvs[i], batch[i].tokens = prompts[i];
  const std::vector<sampled_token> got = shard_model.forward_sample(batch, params, token_idx);
  REQUIRE(got.size() == prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    const sampled_token want = sample(row(i), params[i], token_idx[i]);
    CHECK(got[i].token_id == want.token_id);
    CHECK(std::abs(got[i].logprob - want.logprob) <= 1e-5f * std::max(1.0f, std::abs(want.logprob)));
    CHECK(got[i].top_ids == want.top_ids);
  }
  CHECK(got[3].token_id != banned);
  CHECK(got[2].top_ids.size() == 3);
  for (auto& kv : kvs) arena.release(kv);
}
