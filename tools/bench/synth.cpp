// Synthetic session generator: grows one prefix-chained block list per agent turn by turn.
#include "tools/bench/synth.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

namespace cedar::bench {
namespace {

constexpr int kBlockTokens = 64;

struct generator {
  std::mt19937_64 rng;
  int64_t next_hash_id = 1;

  double lognormal(double median, double sigma) {
    return std::lognormal_distribution<double>(std::log(median), sigma)(rng);
  }
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }
  bool chance(double p) { return uniform(0, 1) < p; }

  /// Extends `ids` with fresh ids until it covers `num_tokens` (full blocks only).
  void grow_chain(std::vector<int64_t>& ids, int64_t num_tokens) {
    while (int64_t(ids.size()) < num_tokens / kBlockTokens) ids.push_back(next_hash_id++);
  }
  double think_s(const synth_params& p) {
    return std::min(p.max_think_s, std::round(lognormal(p.median_think_s, p.think_sigma)));
  }
  int64_t output_tokens(const synth_params& p, double median) {
    return std::clamp<int64_t>(std::llround(lognormal(median, p.output_sigma)), 1,
                               p.max_output_tokens);
  }
};

/// Adds the main agent's turns, stopping before the first request over the context limit.
void main_agent(generator& g, const synth_params& p, session_trace& s) {
  int num_turns = std::clamp(int(std::lround(g.lognormal(p.median_turns, p.turns_sigma))),
                             p.min_turns, p.max_turns);
  std::vector<int64_t> chain;
  int64_t num_tokens = p.system_tokens +
                       std::llround(g.lognormal(p.median_first_user_tokens, p.first_user_sigma));
  for (int turn = 0; turn < num_turns; ++turn) {
    if (turn > 0) {
      const auto& prev = s.requests.back();
      num_tokens += prev.num_output_tokens +
                    std::llround(g.lognormal(p.median_tool_result_tokens, p.tool_result_sigma));
      if (g.chance(p.pullback_prob)) {
        num_tokens = std::llround(double(num_tokens) * g.uniform(0.2, 0.6));
        chain.resize(std::min<size_t>(chain.size(), size_t(num_tokens / kBlockTokens)));
        num_tokens += 2000;  // the compaction summary
      }
    }
    trace_request r;
    r.num_output_tokens = g.output_tokens(p, p.median_output_tokens);
    if (num_tokens + r.num_output_tokens > p.max_context_tokens) break;
    g.grow_chain(chain, num_tokens);
    r.num_input_tokens = num_tokens;
    r.hash_ids = chain;
    r.think_time_s = turn == 0 ? 0 : g.think_s(p);
    s.requests.push_back(std::move(r));
  }
}

/// Subagents in parallel groups of 1-3 after random main turns. All subagents of a session share
/// an opening of 63 blocks, those of one type about 150; their blocks never match the main agent's.
void subagents(generator& g, const synth_params& p, session_trace& s) {
  static const char* kTypes[] = {"Explore", "general-purpose", "Plan"};
  int num_left = std::max(1, int(std::lround(g.lognormal(p.median_subagents, p.subagents_sigma))));
  std::vector<int64_t> common;
  g.grow_chain(common, 63 * kBlockTokens);
  std::vector<std::vector<int64_t>> by_type(3, common);
  for (auto& ids : by_type) g.grow_chain(ids, 150 * kBlockTokens);
  int num_main = int(s.requests.size());
  int agent_no = 1;
  while (num_left > 0 && num_main > 1) {
    int after = int(g.uniform(0, num_main - 1));
    int group = std::min(num_left, 1 + int(g.uniform(0, 3)));
    for (int k = 0; k < group; ++k, --num_left) {
      subagent_trace sub;
      char name[16];
      std::snprintf(name, sizeof name, "agent_%03d", agent_no++);
      sub.agent_id = name;
      int type_idx = int(g.uniform(0, 3));
      sub.type = kTypes[type_idx];
      sub.background = g.chance(p.background_subagent_share);
      sub.after_request_idx = after;
      std::vector<int64_t> chain = by_type[type_idx];
      int64_t num_tokens = int64_t(chain.size()) * kBlockTokens +
                           std::llround(g.lognormal(800, 0.8));  // the task prompt
      int num_turns = std::max(1, int(std::lround(
                                      g.lognormal(p.median_subagent_turns, p.subagent_turns_sigma))));
      for (int turn = 0; turn < num_turns; ++turn) {
        if (turn > 0)
          num_tokens += sub.requests.back().num_output_tokens +
                        std::llround(g.lognormal(p.median_tool_result_tokens / 2, p.tool_result_sigma));
        if (num_tokens > p.max_context_tokens / 2) break;
        trace_request r;
        g.grow_chain(chain, num_tokens);
        r.num_input_tokens = num_tokens;
        r.num_output_tokens = g.output_tokens(p, p.median_output_tokens / 2);
        r.hash_ids = chain;
        r.think_time_s = turn == 0 ? 0 : std::min(30.0, g.think_s(p) / 4);
        sub.requests.push_back(std::move(r));
      }
      if (!sub.requests.empty()) s.subagents.push_back(std::move(sub));
    }
  }
}

/// Fills in start times from think times and a nominal service time, for display only.
void nominal_start_times(session_trace& s) {
  double t = 0;
  for (auto& r : s.requests) {
    t += r.think_time_s;
    r.start_s = t;
    t += 2.0 + double(r.num_output_tokens) / 50.0;
  }
}

}  // namespace

session_trace synthesize_session(const synth_params& params, uint64_t seed) {
  generator g{std::mt19937_64(seed)};
  session_trace s;
  s.system_tokens = params.system_tokens;
  main_agent(g, params, s);
  if (g.chance(params.subagent_session_share)) subagents(g, params, s);
  nominal_start_times(s);
  return s;
}

std::vector<session_trace> synthesize(int num_sessions, uint64_t seed, const synth_params& params) {
  std::vector<session_trace> out;
  std::mt19937_64 seeds(seed);
  for (int i = 0; i < num_sessions; ++i) {
    out.push_back(synthesize_session(params, seeds()));
    char name[32];
    std::snprintf(name, sizeof name, "synthetic_%04d", i);
    out.back().id = name;
  }
  return out;
}

}  // namespace cedar::bench
