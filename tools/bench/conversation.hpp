// The growing prompt of one agent (main agent or subagent) in one replayed session: turns a
// trace's token counts and hash blocks into chat messages, keeping earlier messages byte-identical
// so that a server's prefix cache sees the reuse the trace records. Owned by one session lane.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/bench/trace.hpp"

namespace cedar::bench {

struct message {
  std::string role;     ///< "system", "user" or "assistant"
  std::string content;
  int64_t num_tokens;   ///< estimate (filler words), or the server's count for replies
};

/// What changed for the next request.
struct turn_input {
  size_t first_new_idx = 0;  ///< messages()[first_new_idx..] were added since the last reply
  bool rewritten = false;    ///< earlier history changed (first turn or pull-back): resend it all
};

class conversation {
 public:
  /// `marker` is put at the start of the first block; `scope` namespaces hash ids (the trace);
  /// the first `system_tokens` of the first prompt become a system message.
  conversation(std::string marker, uint64_t scope, int64_t system_tokens);

  /// Appends the input of `req`: on the first turn, or when more than 10% of the previous
  /// request's blocks are gone (a pull-back), the history is rebuilt; otherwise a user message
  /// with the new tokens is added after the last reply.
  turn_input next_turn(const trace_request& req);

  /// Records the server's reply to the last turn (`num_tokens` from usage, or chunks counted).
  void add_reply(std::string text, int64_t num_tokens);

  /// Replays requests [0, count) without a server, taking each reply as filler of the recorded
  /// length: the history a session has when it starts mid-trace.
  void fast_forward(const std::vector<trace_request>& reqs, size_t count);

  const std::vector<message>& messages() const { return messages_; }
  int64_t num_tokens() const { return num_tokens_; }  ///< estimated prompt size so far

 private:
  void rebuild(const trace_request& req);
  std::string blocks_text(const std::vector<int64_t>& ids, size_t begin, size_t end) const;

  std::string marker_;
  uint64_t scope_;
  int64_t system_tokens_;
  std::vector<message> messages_;
  std::vector<int64_t> prev_ids_;
  int64_t num_tokens_ = 0;
  uint64_t num_turns_ = 0;
};

}  // namespace cedar::bench
