// The step policy, in two named stages (run by the scheduler every step, tested alone):
// 1. capacity: which running requests keep their place (preempting the newest when the KV
//    pool cannot hold everyone's next chunk) and which waiting requests are admitted;
// 2. token budget: how many tokens each scheduled request runs this step: every decode
//    first (one token each), then replays (whole), then prefill chunks capped per request,
//    so a long prompt never stalls running decodes; a replay too big to fit beside the decodes
//    goes first instead, once. Plain C++.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace cedar {

/// Pages needed to hold `num_tokens` positions.
inline int64_t pages_for(int64_t num_tokens, int page_tokens) {
  return (num_tokens + page_tokens - 1) / page_tokens;
}

/// A request as the capacity stage sees it.
struct capacity_candidate {
  uint64_t request_id = 0;
  int64_t pages_needed = 0;              ///< new pages its next chunk needs
  int64_t pages_freed_if_preempted = 0;  ///< pages that only it references (running only)
};

struct capacity_plan {
  std::vector<uint64_t> preempt;  ///< running requests to preempt, newest first
  std::vector<uint64_t> admit;    ///< waiting requests to admit, in order
};

/// running: oldest first. waiting: arrival order. Admission stops at the first waiting
/// request that does not fit (no overtaking), and nothing is admitted in a step that preempts.
capacity_plan plan_capacity(std::span<const capacity_candidate> running, std::span<const capacity_candidate> waiting,
                            int64_t pages_available, int64_t slots_free, int64_t max_running);

/// A scheduled request as the token-budget stage sees it.
struct budget_candidate {
  uint64_t request_id = 0;
  int64_t pending_tokens = 0;  ///< tokens it could run now
  bool decoding = false;       ///< runs exactly one token
  bool replay = false;         ///< a replay window: scheduled whole or not at all
};

struct budget_slice {
  uint64_t request_id = 0;
  int64_t num_tokens = 0;
};

/// Candidates in priority order. The first replay that does not fit beside every decode runs
/// first (whole, even past the budget) with the decodes that fit after it, so it cannot starve.
std::vector<budget_slice> plan_token_budget(std::span<const budget_candidate> candidates, int64_t token_budget,
                                            int64_t per_request_cap);

}  // namespace cedar
