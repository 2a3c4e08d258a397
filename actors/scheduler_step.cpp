// The scheduler's step, as named stages: reap cancelled requests, the capacity stage
// (preempt under KV pressure, admit with a prefix-cache lookup and a replay plan), the
// token-budget stage (decodes, replays, prefill chunks), then one step_item per request.
#include <algorithm>

#include "actors/batch_plan.hpp"
#include "actors/replay.hpp"
#include "actors/scheduler.hpp"

namespace cedar {

std::optional<run_step> scheduler::next_step() {
  CEDAR_CHECK(!in_flight_);
  reap_cancelled();
  // A step that only preempted admits nothing; a second pass then admits into what it freed,
  // so the step is not empty while requests wait (nothing else would start the next one).
  std::vector<step_item> items;
  for (int pass = 0; pass < 2 && items.empty(); ++pass) {
    run_capacity_stage();
    items = run_budget_stage();
  }
  if (items.empty()) return std::nullopt;
  run_step step{next_step_id_++, std::move(items)};
  in_flight_step flight{step.step_id, {}};
  for (const auto& it : step.items) flight.items.push_back({it.request_id, it.end_pos(), it.replay});
  in_flight_ = std::move(flight);
  return step;
}

void scheduler::reap_cancelled() {
  std::vector<uint64_t> ids;
  for (auto& [id, r] : requests_)
    if (r.cancel_requested) ids.push_back(id);
  for (uint64_t id : ids) finish(requests_.at(id), "cancelled");
}

void scheduler::run_capacity_stage() {
  const int P = layout_.page_tokens;
  const int64_t cap = options_.max_prefill_tokens_per_request;
  auto running_candidates = [&] {
    std::vector<capacity_candidate> running;
    for (uint64_t id : running_) {
      const request_state& r = requests_.at(id);
      const int64_t next = r.has_replay() ? 0 : std::min(r.pending_tokens(), cap);
      int64_t sole = 0;
      for (int32_t p : r.pages) sole += pool_.ref_count(p) == 1;
      const int64_t new_pages = pages_for(r.num_computed + next, P) - int64_t(r.pages.size());
      running.push_back({id, std::max<int64_t>(0, new_pages), sole});
    }
    return running;
  };
  auto available = [&] { return pool_.num_pages_free() + pool_.num_pages_idle_cached(); };
  // Victims go one at a time, newest first, each planned against the pool as the previous
  // left it: pages shared among victims (a common prefix) are freed only when the last of
  // them goes, which no estimate made up front sees. A step that preempts admits nothing.
  bool preempted = false;
  for (;;) {
    const capacity_plan plan =
        plan_capacity(running_candidates(), {}, available(), pool_.num_slots_free(), options_.max_num_seqs);
    if (plan.preempt.empty()) break;
    preempt(plan.preempt.front());
    preempted = true;
  }
  if (preempted) return;
  // Only the waiting requests that slots could admit this step are looked up in the cache.
  const std::size_t admissible = std::size_t(std::max<int64_t>(
      0, std::min<int64_t>(pool_.num_slots_free(), options_.max_num_seqs - int64_t(running_.size()))));
  std::vector<capacity_candidate> waiting;
  for (uint64_t id : waiting_) {
    if (waiting.size() == admissible) break;
    // its first chunk's new pages, plus the idle cached pages its prefix hit takes out of use
    const request_state& r = requests_.at(id);
    prefix_cache::peek_result hit;
    if (options_.prefix_cache) hit = cache_.peek(r.tokens, (int64_t(r.tokens.size()) - 1) / P);
    const int64_t from = hit.pages * P;
    const int64_t chunk = std::min(int64_t(r.tokens.size()) - from, cap);
    waiting.push_back({id, hit.idle_pages + pages_for(from + chunk, P) - hit.pages, 0});
  }
  const capacity_plan plan =
      plan_capacity(running_candidates(), waiting, available(), pool_.num_slots_free(), options_.max_num_seqs);
  for (uint64_t id : plan.admit) admit(id);
}

void scheduler::preempt(uint64_t request_id) {
  request_state& r = requests_.at(request_id);
  release_kv(r);  // full pages stay in the prefix cache; the tokens stay here
  ++r.num_preemptions;
  ++counters_.preemptions;
  std::erase(running_, request_id);
  waiting_.push_front(request_id);
}

void scheduler::admit(uint64_t request_id) {
  request_state& r = requests_.at(request_id);
  std::erase(waiting_, request_id);
  r.slot = pool_.alloc_slot();
  CEDAR_CHECK(r.slot >= 0);
  const int P = layout_.page_tokens;
  if (options_.prefix_cache) {
    const int64_t max_pages = (int64_t(r.tokens.size()) - 1) / P;  // keep one token to run
    std::vector<int32_t> hit = cache_.lookup(r.tokens, max_pages, r.spec.session_id, !r.admitted_once);
    const replay_plan plan =
        plan_replay(int64_t(hit.size()) * P, layout_.window, layout_.num_layers, options_.swa_replay);
    const std::size_t keep = std::size_t(plan.cached_tokens / P);
    for (std::size_t i = keep; i < hit.size(); ++i) pool_.release(hit[i]);
    hit.resize(keep);
    r.pages = std::move(hit);
    r.published_pages = int64_t(keep);
    r.num_computed = plan.cached_tokens;
    if (plan.replay_tokens() > 0) r.replay_from = plan.replay_from, r.replay_to = plan.cached_tokens;
    if (!r.admitted_once) r.cached_prompt_tokens = std::min(plan.cached_tokens, r.prompt_len);
  }
  if (!r.admitted_once && options_.decoder_truncation) r.truncate_below = r.prompt_len - layout_.window;
  r.admitted_once = true;
  running_.push_back(request_id);
}

std::vector<step_item> scheduler::run_budget_stage() {
  std::vector<budget_candidate> candidates;
  for (uint64_t id : running_) {
    const request_state& r = requests_.at(id);
    if (r.has_replay())
      candidates.push_back({id, r.replay_to - r.replay_from, false, true});
    else  // one token left is a decode; a resumed request's generated tokens go in prefill chunks
      candidates.push_back({id, r.pending_tokens(), r.pending_tokens() == 1, false});
  }
  std::vector<step_item> items;
  for (const budget_slice& s :
       plan_token_budget(candidates, options_.max_batched_tokens, options_.max_prefill_tokens_per_request)) {
    request_state& r = requests_.at(s.request_id);
    if (!r.has_replay() && !ensure_pages(r, r.num_computed + s.num_tokens)) continue;  // retried next step
    items.push_back(make_item(r, s.num_tokens));
  }
  return items;
}

bool scheduler::ensure_pages(request_state& r, int64_t end_pos) {
  while (int64_t(r.pages.size()) < pages_for(end_pos, layout_.page_tokens)) {
    int32_t p = pool_.alloc_page();
    if (p < 0 && cache_.evict_one()) p = pool_.alloc_page();
    if (p < 0) return false;
    r.pages.push_back(p);
  }
  return true;
}

step_item scheduler::make_item(request_state& r, int64_t num_tokens) {
  step_item it;
  it.request_id = r.id;
  it.page_ids = r.pages;
  it.ring_slot = r.slot;
  it.truncate_below = r.truncate_below;
  it.sampling = r.spec.sampling;
  it.token_idx = r.completion_tokens();
  const int64_t end = r.has_replay() ? r.replay_to : r.num_computed + num_tokens;
  it.start_pos = r.has_replay() ? r.replay_from : r.num_computed;
  it.tokens_from = std::max<int64_t>(0, it.start_pos - lookback_);
  it.tokens.assign(r.tokens.begin() + it.tokens_from, r.tokens.begin() + end);
  if (r.has_replay()) {
    it.replay = true;
    counters_.replay_tokens += r.replay_to - r.replay_from;
  } else {
    it.sample = end == int64_t(r.tokens.size());
    const bool too_soon = r.completion_tokens() < r.spec.min_tokens;  // no end token yet
    if (it.sample && (r.matcher || r.in_lead() || too_soon || !r.spec.banned_ids.empty()))
      it.sampling.allowed = allowed_tokens(r);
    if (it.sample) {
      it.sampling.prompt_ids = r.prompt_ids;
      for (const auto& [id, count] : r.seen) {
        it.sampling.seen_ids.push_back(id);
        it.sampling.seen_counts.push_back(count);
      }
    }
  }
  return it;
}

}  // namespace cedar
