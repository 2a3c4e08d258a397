// Agent-session traces for `cedar bench`: the in-memory model of one recorded (or synthetic) coding
// session, and the reader for the public Weka JSON trace format (kv-cache-tester / AgentX).
// Plain data, no I/O beyond reading a file; used only on the bench's single thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cedar::bench {

/// One LLM request of an agent (main agent or subagent).
struct trace_request {
  double start_s = 0;                 ///< start time from the agent's first request, seconds
  int64_t num_input_tokens = 0;       ///< whole prompt: system + tools + all history
  int64_t num_output_tokens = 0;      ///< recorded output; replayed as max_tokens
  std::vector<int64_t> hash_ids;      ///< one id per full 64-token block, prefix-chained
  double think_time_s = 0;            ///< end of previous reply -> this request (0 on the first)
};

/// A subagent launched by the main agent. It starts when main request `after_request_idx`
/// finishes (-1: at session start); a gating subagent must finish before main request
/// `after_request_idx + 1` is sent, a background one gates nothing.
struct subagent_trace {
  std::string agent_id;
  std::string type;                   ///< "Explore", "general-purpose", ...
  bool background = false;            ///< `async_launched` upstream
  int after_request_idx = -1;
  std::vector<trace_request> requests;
};

/// One session: the main agent's requests in order, and its subagents.
struct session_trace {
  std::string id;
  int block_size = 64;
  int64_t system_tokens = 0;          ///< system prompt + tool definitions at the start of the prompt
  std::vector<trace_request> requests;
  std::vector<subagent_trace> subagents;
};

/// Reads one trace file; on failure returns false and sets `error`.
bool read_trace_file(const std::string& path, session_trace& out, std::string& error);

/// Reads FILE, or every *.json in DIR (sorted by name), skipping README-like non-trace files.
bool read_traces(const std::string& file_or_dir, std::vector<session_trace>& out,
                 std::string& error);

/// Parses a trace from JSON text (the Weka format); the reader behind read_trace_file.
bool parse_trace(const std::string& json, session_trace& out, std::string& error);

/// Shrinks every request by `factor` (0 < factor <= 1): token counts are scaled and each
/// hash_ids list is cut to the blocks the smaller prompt still covers, which keeps the prefix
/// chains (a cut of a shared prefix is still shared). Output tokens stay >= 1.
void scale_trace(session_trace& trace, double factor);

/// Drops the main agent's requests from the first one whose input + output exceeds
/// `max_context_tokens`, and the subagents launched after the cut (a replayer stops there).
void cap_context(session_trace& trace, int64_t max_context_tokens);

/// Token-weighted fraction of hash blocks already seen earlier in the session, main agent and
/// subagents in start order: the hit rate of an unlimited private prefix cache.
double theoretical_prefix_reuse(const session_trace& trace);

}  // namespace cedar::bench
