// The runtime's step loop (see runtime_state_actor.hpp): one global step at a time, each
// group's planned step sent to its shards (TP: the same step to every rank; DEP: each rank its
// group's step or an empty one), replies collected by sender, and failures turned into a
// rebuild: the failed step is forgotten (its requests run those positions again on the new
// shards) unless a request was in a failed step before, which then finishes with an error.
#include "actors/runtime_state_actor.hpp"

#include <cstdio>

namespace cedar::runtime_detail {
namespace {

int rank_of(self_ptr self, const caf::actor_addr& addr) {
  auto& ranks = self->state.ranks;
  for (std::size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].actor.address() == addr) return int(r);
  return -1;
}

/// Closes the global step: applies each group's output, or handles the failure.
void complete_step(self_ptr self) {
  auto& st = self->state;
  global_step g = std::move(*st.step);
  st.step.reset();
  for (std::size_t k = 0; k < g.group_steps.size(); ++k) {
    if (!g.group_steps[k]) continue;
    const run_step& sent = *g.group_steps[k];
    if (g.failure.empty()) {
      const int leader = st.layout.mode == parallel_mode::tp ? 0 : int(k);
      st.groups[k]->apply(*g.outputs[leader]);
      for (const step_item& it : sent.items) st.faults.erase(it.request_id);
      continue;
    }
    std::vector<uint64_t> failed_twice;  // the others run those positions again
    for (const step_item& it : sent.items)
      if (++st.faults[it.request_id] >= 2) failed_twice.push_back(it.request_id);
    st.groups[k]->abandon_step(failed_twice, "shard failed twice while running it: " + g.failure);
  }
  if (!g.failure.empty() && !st.sw)
    st.sw = pending_switch{st.layout, std::nullopt, std::chrono::steady_clock::now(), "shard_failed"};
  deliver_events(self);
  if (st.sw) return run_switch(self);
  pump(self);
}

}  // namespace

void deliver_events(self_ptr self) {
  auto& st = self->state;
  for (auto& policy : st.groups) {
    for (token_batch& b : policy->take_events()) {
      auto it = st.sinks.find(b.request_id);
      const bool finished = b.finished;
      if (finished) st.request_group.erase(b.request_id), st.faults.erase(b.request_id);
      if (it == st.sinks.end()) continue;
      self->send(caf::actor_cast<session_actor>(it->second), std::move(b));
      if (finished) st.sinks.erase(it);
    }
  }
}

void pump(self_ptr self) {
  auto& st = self->state;
  deliver_events(self);
  if (st.step || st.paused) return;
  global_step g;
  bool any = false;
  for (auto& policy : st.groups) {
    g.group_steps.push_back(policy->next_step());
    any |= g.group_steps.back().has_value();
  }
  deliver_events(self);  // next_step may finish cancelled requests
  if (!any) return;
  g.id = st.next_step_id++;
  g.outputs.resize(st.ranks.size());
  g.waiting.assign(st.ranks.size(), true);
  for (std::size_t r = 0; r < st.ranks.size(); ++r) {
    rank_entry& rank = st.ranks[r];
    const auto& mine = g.group_steps[rank.group];
    run_step step = mine ? *mine : run_step{0, {}};
    ++rank.steps;
    for (const step_item& it : step.items) rank.rows += it.end_pos() - it.start_pos;
    self->send(rank.actor, std::move(step));
  }
  self->delayed_send(self, std::chrono::milliseconds(st.options.step_timeout_ms), step_timed_out{g.id});
  st.step = std::move(g);
}

void on_step_output(self_ptr self, const step_output& out) {
  auto& st = self->state;
  const int r = rank_of(self, caf::actor_cast<caf::actor_addr>(self->current_sender()));
  if (r < 0 || !st.step || !st.step->waiting[r]) return;  // an old layout's or a late reply
  const auto& sent = st.step->group_steps[st.ranks[r].group];
  if (out.step_id != (sent ? sent->step_id : 0)) return;
  st.step->waiting[r] = false;
  st.step->outputs[r] = out;
  if (!out.error.empty() && st.step->failure.empty()) {
    report(self, "shard_step_failed", {field("rank", r), field("error", out.error)});
    st.step->failure = "shard " + std::to_string(r) + ": " + out.error;
    st.last_fault = st.step->failure;
    if (st.comm) st.comm->abort(st.step->failure);  // peers blocked in a collective return now
  }
  if (std::none_of(st.step->waiting.begin(), st.step->waiting.end(), [](bool w) { return w; })) complete_step(self);
}

void report(self_ptr self, const std::string& event, std::vector<runtime_event_field> fields) {
  if (const auto& log = self->state.options.on_event) log(event, fields);
}

runtime_event_field field(std::string key, std::string text, bool number) {
  return {std::move(key), std::move(text), number};
}
runtime_event_field field(std::string key, int64_t number) { return {std::move(key), std::to_string(number), true}; }

std::string millis_text(double ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", ms);
  return text;
}

void on_fault(self_ptr self, int rank, const std::string& reason, bool kv_lost) {
  auto& st = self->state;
  report(self, "shard_lost", {field("rank", rank), field("reason", reason), field("kv_lost", kv_lost ? "yes" : "no")});
  st.last_fault = "shard " + std::to_string(rank) + ": " + reason;
  if (rank >= 0 && rank < int(st.ranks.size())) {
    st.ranks[rank].alive = false;
    st.ranks[rank].kv_safe = !kv_lost;
  }
  if (st.comm) st.comm->abort(st.last_fault);
  if (st.step) {
    if (st.step->failure.empty()) st.step->failure = st.last_fault;
    if (rank >= 0 && rank < int(st.ranks.size()) && st.step->waiting[rank]) {
      st.step->waiting[rank] = false;
      if (std::none_of(st.step->waiting.begin(), st.step->waiting.end(), [](bool w) { return w; }))
        complete_step(self);
    }
    return;  // the other ranks' replies (aborted collectives) close the step
  }
  if (!st.sw) st.sw = pending_switch{st.layout, std::nullopt, std::chrono::steady_clock::now(), "shard_failed"};
  run_switch(self);
}

}  // namespace cedar::runtime_detail
