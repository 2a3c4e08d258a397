// Greedy and seeded temperature / top-k / top-p sampling (see sampler.hpp).
#include "actors/sampler.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "kernels/sampling_order.hpp"

namespace cedar {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Uniform in [0, 1) from (seed, token_idx).
double uniform01(uint64_t seed, int64_t token_idx) {
  const uint64_t r = splitmix64(splitmix64(seed) ^ uint64_t(token_idx));
  return double(r >> 11) * (1.0 / 9007199254740992.0);
}

/// A key whose ascending order is the logits' descending order (NaN aside); -0 and +0, equal
/// logits, get one key.
uint32_t descending_key(float logit) {
  const uint32_t bits = std::bit_cast<uint32_t>(logit == 0.f ? 0.f : logit);
  const uint32_t ascending = bits & 0x80000000u ? ~bits : bits | 0x80000000u;
  return ~ascending;
}

/// Every id by descending logit, ties in id order: a stable LSD radix sort (three 11-bit digits)
/// of the keys, starting from index order.
std::vector<int32_t> radix_order(std::span<const float> logits) {
  const std::size_t n = logits.size();
  std::vector<uint32_t> keys(n), keys_tmp(n);
  std::vector<int32_t> ids(n), ids_tmp(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = descending_key(logits[i]), ids[i] = int32_t(i);
  constexpr int digit_bits = 11;
  constexpr uint32_t buckets = 1u << digit_bits;
  for (int shift = 0; shift < 32; shift += digit_bits) {
    std::vector<std::size_t> start(buckets + 1, 0);
    for (uint32_t k : keys) ++start[((k >> shift) & (buckets - 1)) + 1];
    if (std::any_of(start.begin() + 1, start.end(), [&](std::size_t c) { return c == n; })) continue;  // one digit
    for (uint32_t b = 0; b < buckets; ++b) start[b + 1] += start[b];
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t to = start[(keys[i] >> shift) & (buckets - 1)]++;
      keys_tmp[to] = keys[i], ids_tmp[to] = ids[i];
    }
    keys.swap(keys_tmp), ids.swap(ids_tmp);
  }
  return ids;
}

double log_sum_exp(std::span<const float> logits) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  const double s = sampling_order::sum(logits.size(), [&](std::size_t i) { return std::exp(double(logits[i]) - mx); });
  return mx + std::log(s);
}

/// Softmax of logit / temperature, then the min-p and top-p cuts and the draw, every sum in
/// sampling_order's blocked order. With neither top-k nor top-p the draw walks the ids in index
/// order (no sort: any fixed order draws from the same distribution); otherwise best first.
int32_t pick_random(std::span<const float> logits, const sampling_params& p, int64_t token_idx) {
  std::vector<int32_t> ids;  // empty: index order
  if (p.top_k > 0 || p.top_p < 1.f)
    ids = order_by_logit(logits, p.top_k > 0 ? std::size_t(p.top_k) : logits.size());
  const auto id = [&](std::size_t i) { return ids.empty() ? int32_t(i) : ids[i]; };
  const std::size_t k = ids.empty() ? logits.size() : ids.size();
  // in double: a tiny temperature overflows a float quotient to inf, and inf - inf is NaN
  const double t = p.temperature;
  const double mx = *std::max_element(logits.begin(), logits.end()) / t;
  std::vector<double> prob(k);
  for (std::size_t i = 0; i < k; ++i) prob[i] = std::exp(logits[id(i)] / t - mx);
  // min_p: the likeliest token's term is 1, so the cut is a fixed threshold on the terms
  if (p.min_p > 0.f)
    for (double& x : prob)
      if (x < double(p.min_p)) x = 0;
  const auto term = [&](std::size_t i) { return prob[i]; };
  double total = sampling_order::sum(k, term);
  std::size_t n = k;
  if (p.top_p < 1.f) {
    n = std::min(k, sampling_order::find(k, [&](std::size_t i) { return prob[i] / total; },
                                         [&](double cum) { return cum >= p.top_p; }) + 1);
    total = sampling_order::sum(n, term);
  }
  const double u = uniform01(p.seed, token_idx) * total;
  const std::size_t i = sampling_order::find(n, term, [&](double cum) { return cum > u; });
  return id(std::min(i, n - 1));
}

}  // namespace

std::vector<int32_t> order_by_logit(std::span<const float> logits, std::size_t keep) {
  keep = std::min(keep, logits.size());
  if (keep == logits.size() && keep > 1) return radix_order(logits);
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), better);
  ids.resize(keep);
  return ids;
}

std::string validate(const sampling_params& p, int vocab_size) {
  if (!(p.temperature >= 0.f) || !std::isfinite(p.temperature)) return "temperature must be a finite number >= 0";
  if (p.top_k < 0) return "top_k must be >= 0";
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) return "top_p must be in (0, 1]";
  if (!(p.min_p >= 0.f && p.min_p <= 1.f)) return "min_p must be in [0, 1]";
  if (p.logprobs < 0 || p.logprobs > 20 || p.logprobs > vocab_size) return "logprobs must be in [0, 20]";
  if (!(std::abs(p.frequency_penalty) <= 2.f) || !(std::abs(p.presence_penalty) <= 2.f))
    return "frequency_penalty and presence_penalty must be in [-2, 2]";
  if (!(p.repetition_penalty > 0.f) || !std::isfinite(p.repetition_penalty))
    return "repetition_penalty must be a finite number > 0";
  for (std::size_t i = 0; i < p.prompt_ids.size(); ++i)
    if (p.prompt_ids[i] < 0 || p.prompt_ids[i] >= vocab_size || (i > 0 && p.prompt_ids[i] <= p.prompt_ids[i - 1]))
      return "prompt_ids must be distinct vocabulary ids in ascending order";
  if (p.seen_ids.size() != p.seen_counts.size()) return "seen_ids and seen_counts must be the same length";
  for (int32_t id : p.seen_ids)
    if (id < 0 || id >= vocab_size) return "a seen token id is outside the vocabulary";
  if (p.bias_ids.size() != p.bias_values.size()) return "bias_ids and bias_values must be the same length";
  for (std::size_t i = 0; i < p.bias_ids.size(); ++i) {
    if (p.bias_ids[i] < 0 || p.bias_ids[i] >= vocab_size)
      return "logit_bias names token " + std::to_string(p.bias_ids[i]) + ", outside the vocabulary";
    if (!(std::abs(p.bias_values[i]) <= 100.f)) return "logit_bias values must be in [-100, 100]";
  }
  if (!p.allowed.empty() && p.allowed.size() != (std::size_t(vocab_size) + 63) / 64)
    return "the allowed-token mask must hold one bit per vocabulary token";
  return {};
}

sampled_token sample(std::span<const float> logits, const sampling_params& p, int64_t token_idx) {
  sampled_token out;
  std::vector<float> adjusted;
  std::span<const float> pick_from = logits;
  const bool penalized = p.has_penalty() && (!p.seen_ids.empty() || !p.prompt_ids.empty());
  if (!p.allowed.empty() || penalized || !p.bias_ids.empty()) {
    adjusted.assign(logits.begin(), logits.end());
    for (std::size_t i = 0; i < p.bias_ids.size(); ++i) adjusted[std::size_t(p.bias_ids[i])] += p.bias_values[i];
    if (p.repetition_penalty != 1.f) {  // vLLM's order: the bias, this, then the OpenAI penalties
      const auto repeat = [&](int32_t id) {
        float& v = adjusted[std::size_t(id)];
        v = v > 0.f ? v / p.repetition_penalty : v * p.repetition_penalty;
      };
      for (int32_t id : p.prompt_ids) repeat(id);
      for (int32_t id : p.seen_ids)
        if (!std::binary_search(p.prompt_ids.begin(), p.prompt_ids.end(), id)) repeat(id);
    }
    for (std::size_t i = 0; i < p.seen_ids.size() && p.has_penalty(); ++i)
      adjusted[std::size_t(p.seen_ids[i])] -=
          float(p.seen_counts[i]) * p.frequency_penalty + (p.seen_counts[i] > 0 ? p.presence_penalty : 0.f);
    if (!p.allowed.empty())
      for (std::size_t id = 0; id < adjusted.size(); ++id)
        if (!(p.allowed[id / 64] >> (id % 64) & 1)) adjusted[id] = -INFINITY;
    pick_from = adjusted;
  }
  out.token_id = p.temperature == 0.f ? order_by_logit(pick_from, 1)[0] : pick_random(pick_from, p, token_idx);
  const double lse = log_sum_exp(logits);
  out.logprob = float(logits[out.token_id] - lse);
  if (p.logprobs > 0) {
    out.top_ids = order_by_logit(logits, std::size_t(p.logprobs));
    for (int32_t id : out.top_ids) out.top_logprobs.push_back(float(logits[id] - lse));
  }
  return out;
}

}  // namespace cedar
