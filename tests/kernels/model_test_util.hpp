// Test helpers for the model forward pass: a request that owns its KV memory (pages, SWA
// ring, compressor tails) and token history, and one-call wrappers around model::forward.
// Test-only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "kernels/model/model.hpp"

namespace cedar::test {

/// One request's KV memory and history, as a kv_pool would hand it to the model.
struct test_request {
  std::vector<std::vector<uint8_t>> page_mem;
  std::vector<uint8_t> ring;
  std::vector<float> tails;
  request_kv kv;
  std::vector<int32_t> history;

  test_request(const kv_layout& layout, int64_t max_tokens) {
    const int64_t num_pages = max_tokens / layout.page_tokens + 1;
    page_mem.assign(num_pages, std::vector<uint8_t>(layout.page_bytes, 0));
    for (auto& p : page_mem) kv.pages.push_back(p.data());
    ring.assign(layout.ring_bytes(), 0);
    tails.assign(layout.tail_floats(), 0.0f);
    kv.swa_ring = ring.data();
    kv.tails = tails.data();
  }
  test_request(const test_request&) = delete;

  /// The item that runs `tokens` next.
  forward_item item(std::span<const int32_t> tokens, logits_mode mode = logits_mode::last) {
    forward_item it;
    it.kv = &kv;
    it.history = history;
    it.tokens = tokens;
    it.logits = mode;
    return it;
  }
};

/// Runs tokens through the request in one call and returns the logits asked for.
inline std::vector<float> run(const model& m, test_request& r, std::span<const int32_t> tokens,
                              logits_mode mode = logits_mode::last, int64_t truncate_below = -1,
                              forward_stats* stats = nullptr) {
  forward_item it = r.item(tokens, mode);
  it.truncate_below = truncate_below;
  std::vector<float> logits;
  m.forward(std::span<forward_item>(&it, 1), logits, stats);
  r.history.insert(r.history.end(), tokens.begin(), tokens.end());
  return logits;
}

inline std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(3, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

inline float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  float m = 0.0f;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

inline std::size_t argmax(std::span<const float> v) {
  return std::size_t(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace cedar::test
