// Token sampling from one row of logits: greedy, or temperature / top-k / top-p with a
// per-request seed. Stateless: the random draw depends only on (seed, token_idx), so a
// request preempted and resumed, or run on another shard, samples the same tokens.
// Plain C++, called by the shard after each forward call.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace cedar {

/// How one request picks its next token. temperature 0 = greedy (ties -> lowest id).
struct sampling_params {
  float temperature = 0.f;  ///< 0 = greedy; otherwise logits are divided by it
  int top_k = 0;            ///< keep the k most likely tokens; 0 = all
  float top_p = 1.f;        ///< keep the smallest set whose probability reaches top_p; 1 = all
  float min_p = 0.f;        ///< drop tokens less likely than min_p times the likeliest; 0 = off
  uint64_t seed = 0;        ///< with token_idx, fixes the random draw
  int logprobs = 0;         ///< return this many top alternatives (0 = none; the sampled token's is always given)
  /// Structured output: bit id set when token id may be sampled ([ceil(vocab / 64)] words;
  /// empty: every token). Built by the scheduler for each step (actors/output_grammar.hpp).
  std::vector<uint64_t> allowed;
  /// OpenAI's penalties over the completion so far: a token sampled c times before has
  /// c * frequency_penalty + presence_penalty (when c > 0) taken off its logit.
  float frequency_penalty = 0.f;
  float presence_penalty = 0.f;
  /// vLLM's repetition_penalty over the prompt and the completion so far: such a token's logit
  /// is divided by it when positive, multiplied by it otherwise. 1 = off; must be > 0.
  float repetition_penalty = 1.f;
  /// The completion's tokens so far and how often each came (the scheduler fills them for each
  /// step of a request with a penalty); parallel arrays.
  std::vector<int32_t> seen_ids;
  std::vector<int32_t> seen_counts;
  /// The distinct ids of the request's prompt, ascending (the scheduler fills them once, with a
  /// repetition penalty); with seen_ids, the tokens a repetition penalty reaches.
  std::vector<int32_t> prompt_ids;
  /// OpenAI's logit_bias: bias_values[i] is added to the logit of bias_ids[i] (parallel arrays).
  std::vector<int32_t> bias_ids;
  std::vector<float> bias_values;

  bool has_penalty() const {
    return frequency_penalty != 0.f || presence_penalty != 0.f || repetition_penalty != 1.f;
  }
  /// Whether only the host sampler draws this row: top logprobs, a mask, penalties or biases.
  bool host_only() const {
    return logprobs > 0 || !allowed.empty() || has_penalty() || !bias_ids.empty() || min_p > 0.f;
  }
};

/// Empty when valid, else a message naming the bad field.
std::string validate(const sampling_params& p, int vocab_size);

struct sampled_token {
  int32_t token_id = 0;
  float logprob = 0.f;                     ///< log-softmax of the raw logits at token_id
  std::vector<int32_t> top_ids;            ///< the `logprobs` most likely ids, best first
  std::vector<float> top_logprobs;         ///< their log-probabilities
};

/// The ids of the `keep` highest logits, highest first (ties: lowest id first). A whole row
/// (keep >= its size, as top-p needs) is radix-sorted: a few linear passes, not a comparison sort.
std::vector<int32_t> order_by_logit(std::span<const float> logits, std::size_t keep);

/// Samples from logits [vocab] fp32. token_idx = index of the token being generated within its
/// request (0 for the first completion token); it seeds the draw together with p.seed. With
/// p.allowed, only allowed tokens are drawn (the others' logits count as -inf); penalties and
/// biases move logits before the draw; logprob and the top alternatives stay those of the
/// model's own distribution.
sampled_token sample(std::span<const float> logits, const sampling_params& p, int64_t token_idx);

}  // namespace cedar
