// Capacity and token-budget stages of the step policy (see batch_plan.hpp).
#include "actors/batch_plan.hpp"

#include <algorithm>

namespace cedar {

capacity_plan plan_capacity(std::span<const capacity_candidate> running, std::span<const capacity_candidate> waiting,
                            int64_t pages_available, int64_t slots_free, int64_t max_running) {
  capacity_plan plan;
  std::size_t kept = running.size();
  int64_t avail = pages_available;
  for (std::size_t i = 0; i < kept; ++i) {
    while (running[i].pages_needed > avail && kept > i + 1) {
      --kept;
      avail += running[kept].pages_freed_if_preempted;
      plan.preempt.push_back(running[kept].request_id);
    }
    if (running[i].pages_needed > avail) {  // alone and still too big: it waits too
      plan.preempt.push_back(running[i].request_id);
      kept = i;
      break;
    }
    avail -= running[i].pages_needed;
  }
  if (!plan.preempt.empty()) return plan;
  int64_t num_running = int64_t(kept);
  for (const auto& w : waiting) {
    if (num_running >= max_running || slots_free <= 0 || w.pages_needed > avail) break;
    avail -= w.pages_needed;
    --slots_free;
    ++num_running;
    plan.admit.push_back(w.request_id);
  }
  return plan;
}

std::vector<budget_slice> plan_token_budget(std::span<const budget_candidate> candidates, int64_t token_budget,
                                            int64_t per_request_cap) {
  std::vector<budget_slice> out;
  int64_t left = token_budget;
  // The first replay goes first when it does not fit beside every decode: decodes fill what it
  // leaves, and the rest wait one step. (Behind the decodes it would wait as long as any
  // request decodes, holding its slot and pages.)
  int64_t num_decoding = 0;
  for (const auto& c : candidates) num_decoding += c.decoding;
  for (const auto& c : candidates) {
    if (!c.replay) continue;
    if (c.pending_tokens > token_budget - std::min(num_decoding, token_budget)) {
      out.push_back({c.request_id, c.pending_tokens});
      left -= c.pending_tokens;
      for (const auto& d : candidates)
        if (d.decoding && left > 0) out.push_back({d.request_id, 1}), --left;
      return out;
    }
    break;
  }
  for (const auto& c : candidates)
    if (c.decoding && left > 0) out.push_back({c.request_id, 1}), --left;
  for (const auto& c : candidates) {
    if (!c.replay) continue;
    if (c.pending_tokens <= left || out.empty()) out.push_back({c.request_id, c.pending_tokens}), left -= c.pending_tokens;
  }
  for (const auto& c : candidates) {
    if (c.decoding || c.replay || left <= 0) continue;
    const int64_t n = std::min({c.pending_tokens, per_request_cap, left});
    if (n > 0) out.push_back({c.request_id, n}), left -= n;
  }
  return out;
}

}  // namespace cedar
