// One request as the scheduler tracks it from submit to finish: its tokens (prompt, then
// completion), how far its KV is computed, the pages and ring slot it holds, a pending
// replay window, and its timing. Plain C++, owned by the scheduler's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/messages.hpp"

namespace cedar {

using steady_time = std::chrono::steady_clock::time_point;

struct request_state {
  uint64_t id = 0;
  request_spec spec;                 ///< spec.prompt is the full prompt
  std::vector<int32_t> tokens;       ///< prompt then completion tokens
  int64_t prompt_len = 0;
  int64_t num_computed = 0;          ///< KV positions written (the next position to run)
  int64_t cached_prompt_tokens = 0;  ///< from the prefix cache at first admission
  int64_t truncate_below = -1;       ///< fixed at first admission: prompt_len - window, or -1
  std::vector<int32_t> pages;        ///< page i holds positions [i*P, (i+1)*P)
  int32_t slot = -1;                 ///< SWA ring slot while running
  int64_t replay_from = -1;          ///< pending replay [replay_from, replay_to), or -1
  int64_t replay_to = -1;
  int64_t published_pages = 0;       ///< full pages handed to the prefix cache
  bool admitted_once = false;
  bool cancel_requested = false;
  int num_preemptions = 0;
  /// Structured output: where the completion stands in spec.grammar, once the constraint has
  /// started (at once, or after spec.grammar.start_after); empty before and without a grammar.
  std::optional<json_matcher> matcher;
  /// A forced lead (spec.lead): where it starts in tokens once it has (-1: not yet), and
  /// whether the tokens since then spell a whole choice.
  int64_t lead_begin = -1;
  bool lead_done = false;
  /// With a frequency, presence or repetition penalty: each completion token and how often it came.
  std::unordered_map<int32_t, int32_t> seen;
  /// With a repetition penalty: the prompt's distinct ids, ascending (sent with sampling steps only).
  std::vector<int32_t> prompt_ids;
  steady_time submit_time{};
  steady_time last_token_time{};

  /// The request with its KV placement dropped (as a new scheduler adopts it): tokens, spec,
  /// prompt length, first-admission facts, preemptions and timing stay; pages, slot, computed
  /// positions, replay and published pages are back at their defaults.
  request_state without_kv() && {
    request_state r = std::move(*this);
    r.num_computed = 0, r.pages.clear(), r.slot = -1, r.replay_from = r.replay_to = -1, r.published_pages = 0;
    return r;
  }

  int64_t completion_tokens() const { return int64_t(tokens.size()) - prompt_len; }
  bool has_replay() const { return replay_from >= 0; }
  /// Tokens not yet run through the model (1 while decoding: the last sampled token).
  int64_t pending_tokens() const { return int64_t(tokens.size()) - num_computed; }
  /// Inside a forced lead: the next token is one of the lead's choices.
  bool in_lead() const { return lead_begin >= 0 && !lead_done; }
};

}  // namespace cedar
