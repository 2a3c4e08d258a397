// Synthetic agent sessions with the statistics of the AgentX corpus (median 43 turns, heavy-tailed
// input growth, >95% prefix reuse, 44% of sessions spawning subagents with a median of 4), for
// benchmarks without trace files. Deterministic for a given seed.
#pragma once

#include <cstdint>
#include <vector>

#include "tools/bench/trace.hpp"

namespace cedar::bench {

/// Shape of the generated sessions; every distribution is log-normal (median, sigma of the log).
struct synth_params {
  double median_turns = 43, turns_sigma = 0.8;
  int min_turns = 2, max_turns = 500;
  int64_t system_tokens = 15000;          ///< system prompt + tool definitions
  double median_first_user_tokens = 6000, first_user_sigma = 1.2;
  double median_tool_result_tokens = 1700, tool_result_sigma = 1.3;  ///< new input per turn
  double median_output_tokens = 444, output_sigma = 1.0;
  int64_t max_output_tokens = 16000;
  double median_think_s = 10, think_sigma = 2.2, max_think_s = 3600;
  double pullback_prob = 0.015;           ///< per turn: history compacted to 20-60%
  int64_t max_context_tokens = 990000;    ///< a session ends before a request over this
  double subagent_session_share = 0.44;
  double median_subagents = 4, subagents_sigma = 0.6;
  double background_subagent_share = 0.05;
  double median_subagent_turns = 8, subagent_turns_sigma = 0.7;
};

/// One session; `seed` fully determines it.
session_trace synthesize_session(const synth_params& params, uint64_t seed);

/// `num_sessions` sessions named synthetic_0000, ... from seeds derived from `seed`.
std::vector<session_trace> synthesize(int num_sessions, uint64_t seed,
                                      const synth_params& params = {});

}  // namespace cedar::bench
