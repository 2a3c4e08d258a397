// Synthetic sessions: the AgentX statistics over many sessions, and the block-id rules of the
// real traces (one id per full block, prefix-chained, subagents apart from the main agent).
#include <doctest/doctest.h>

#include <random>
#include <set>
#include <unordered_set>

#include "tools/bench/stats.hpp"
#include "tools/bench/synth.hpp"

using namespace cedar::bench;

TEST_CASE("synthetic sessions have the corpus statistics") {
  // Sessions are made one at a time from derived seeds (a full session holds megabytes of ids).
  std::mt19937_64 seeds(42);
  std::vector<double> turns, inputs, subagent_counts;
  double num_blocks = 0, num_reused = 0;
  int num_sessions = 3000, num_with_subagents = 0;
  for (int i = 0; i < num_sessions; ++i) {
    session_trace s = synthesize_session({}, seeds());
    turns.push_back(double(s.requests.size()));
    for (auto& r : s.requests) inputs.push_back(double(r.num_input_tokens));
    if (!s.subagents.empty()) {
      ++num_with_subagents;
      subagent_counts.push_back(double(s.subagents.size()));
    }
    if (i >= 300) continue;  // the token-weighted reuse settles on fewer sessions
    double blocks = 0;
    for (auto& r : s.requests) blocks += double(r.hash_ids.size());
    for (auto& sub : s.subagents)
      for (auto& r : sub.requests) blocks += double(r.hash_ids.size());
    num_reused += theoretical_prefix_reuse(s) * blocks;
    num_blocks += blocks;
  }
  CHECK(*percentile(turns, 50) == doctest::Approx(43).epsilon(0.1));
  CHECK(num_reused / num_blocks > 0.95);
  CHECK(double(num_with_subagents) / num_sessions == doctest::Approx(0.44).epsilon(0.08));
  CHECK(*percentile(subagent_counts, 50) == doctest::Approx(4).epsilon(0.26));
  // Heavy-tailed inputs: the median near 142K and p90 far above it.
  CHECK(*percentile(inputs, 50) == doctest::Approx(142000).epsilon(0.25));
  CHECK(*percentile(inputs, 90) > 2 * *percentile(inputs, 50));
}

TEST_CASE("synthetic block ids follow the trace rules") {
  int num_bad_counts = 0, num_rematches = 0, num_shared_with_main = 0, num_bad_parents = 0;
  for (auto& s : synthesize(40, 3)) {
    std::set<int64_t> main_ids;
    const trace_request* prev = nullptr;
    for (auto& r : s.requests) {
      num_bad_counts += int64_t(r.hash_ids.size()) != r.num_input_tokens / 64;
      main_ids.insert(r.hash_ids.begin(), r.hash_ids.end());
      if (prev) {
        // Once two prompts differ, no later block matches again.
        size_t common = 0;
        while (common < prev->hash_ids.size() && common < r.hash_ids.size() &&
               prev->hash_ids[common] == r.hash_ids[common])
          ++common;
        std::unordered_set<int64_t> before(prev->hash_ids.begin(), prev->hash_ids.end());
        for (size_t i = common; i < r.hash_ids.size(); ++i) num_rematches += before.count(r.hash_ids[i]);
      }
      prev = &r;
    }
    for (auto& sub : s.subagents) {
      num_bad_parents += sub.after_request_idx >= int(s.requests.size());
      for (auto& r : sub.requests)
        for (int64_t id : r.hash_ids) num_shared_with_main += main_ids.count(id);
    }
  }
  CHECK(num_bad_counts == 0);
  CHECK(num_rematches == 0);
  CHECK(num_shared_with_main == 0);
  CHECK(num_bad_parents == 0);
}

TEST_CASE("synthesis is deterministic per seed") {
  auto a = synthesize(5, 9), b = synthesize(5, 9), c = synthesize(5, 10);
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].requests.size() == b[i].requests.size());
    CHECK(a[i].requests.back().hash_ids == b[i].requests.back().hash_ids);
  }
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i) differs |= a[i].requests.size() != c[i].requests.size();
  CHECK(differs);
}
