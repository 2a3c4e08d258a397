// Building a layout and switching to another one (see runtime_state_actor.hpp). A switch runs
// at a step boundary with admission paused: the new shards and schedulers are built, every
// request and cached page chain is re-homed (rehome.hpp), the old shards are stopped, and the
// held submissions are admitted. A rebuild after a shard failure is a switch to the same
// layout in which a failed shard's KV counts as lost.
#include <algorithm>

#include "actors/rehome.hpp"
#include "actors/runtime_state_actor.hpp"
#include "actors/shard_actor.hpp"

namespace cedar::runtime_detail {
namespace {

/// The arena an old group's KV can be read from, or null when it is lost.
kv_arena* source_arena(std::vector<rank_entry>& ranks, int group) {
  for (rank_entry& r : ranks)
    if (r.group == group && r.alive && r.kv_safe && r.s) return &r.s->arena();
  return nullptr;
}

/// Admission opens again: the submissions held while the switch waited are admitted (those
/// past their deadline refused).
void resume_admission(self_ptr self) {
  auto& st = self->state;
  st.paused = false;
  std::vector<held_submit> held = std::move(st.held);
  st.held.clear();
  for (held_submit& h : held) h.rp.deliver(do_submit(self, h.msg, h.sink));
  pump(self);
}

void finish_switch(self_ptr self, const rehome_stats& moved, std::chrono::steady_clock::time_point started) {
  auto& st = self->state;
  pending_switch sw = std::move(*st.sw);
  st.sw.reset();
  const auto now = std::chrono::steady_clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - sw.t0).count();
  st.last_switch_ms = ms;
  if (!sw.rp)
    report(self, "layout_rebuilt", {field("cause", sw.cause), field("layout", st.layout.name()),
                                    field("shards", int64_t(st.ranks.size())), field("pause_ms", millis_text(ms), true),
                                    field("requests_moved", int64_t(moved.requests_moved))});
  if (sw.rp) {
    switch_result r;
    r.layout = st.layout.name();
    r.pause_ms = ms;
    r.rehome_ms = std::chrono::duration<double, std::milli>(now - started).count();
    r.requests_moved = moved.requests_moved;
    r.pages_copied = moved.pages_copied;
    sw.rp->deliver(std::move(r));
  }
  resume_admission(self);
}

}  // namespace

void build_layout(self_ptr self, const layout_spec& spec, std::vector<rank_entry>& ranks,
                  std::vector<std::unique_ptr<scheduler>>& groups, std::shared_ptr<inproc_group>& comm) {
  auto& st = self->state;
  const kv_layout& kv = st.src->layout();
  const kv_capacity cap = plan_kv_capacity(kv, st.options.kv_budget_bytes, st.options.max_num_seqs);
  if (spec.num_shards == 1 && !st.remote_pool.empty()) {  // a joined shard process serves tp1
    rank_entry e;
    e.actor = st.remote_pool.front();
    e.remote = true;
    ranks.push_back(std::move(e));
  }
  const int first = int(ranks.size());
  layout_ranks made = st.src->make(spec, first, std::chrono::milliseconds(st.options.step_timeout_ms));
  comm = made.comm;
  for (int r = first; r < spec.num_shards; ++r) {
    auto s = std::make_shared<shard>(std::move(made.models[r - first]), cap);
    rank_entry e;
    e.s = s;
    e.group = spec.group_of_shard(r);
    e.actor = spawn_shard(self->system(), std::move(s));
    self->monitor(e.actor);
    ranks.push_back(std::move(e));
  }
  for (int g = 0; g < spec.num_groups(); ++g) {
    groups.push_back(std::make_unique<scheduler>(st.src->args(), kv, st.options));
    for (uint64_t session : st.live_sessions) groups.back()->session_opened(session);
    if (st.draining) groups.back()->drain();
  }
}

void run_switch(self_ptr self) {
  auto& st = self->state;
  CEDAR_CHECK(st.sw && !st.step);
  const auto started = std::chrono::steady_clock::now();
  st.paused = true;
  std::vector<rank_entry> ranks;
  std::vector<std::unique_ptr<scheduler>> groups;
  std::shared_ptr<inproc_group> comm;
  try {
    build_layout(self, st.sw->target, ranks, groups, comm);
  } catch (const std::exception& e) {  // (device memory for a second set of arenas, a collective group)
    for (rank_entry& r : ranks) {
      if (r.remote) continue;
      self->demonitor(r.actor.address());
      self->send_exit(r.actor, caf::exit_reason::user_shutdown);
    }
    pending_switch sw = std::move(*st.sw);
    st.sw.reset();
    st.last_fault = "layout " + sw.target.name() + " could not be built: " + e.what();
    if (!sw.rp) report(self, "layout_rebuild_failed", {field("cause", sw.cause), field("error", st.last_fault)});
    if (sw.rp) sw.rp->deliver(switch_result{int32_t(engine_errc::shard_failed), st.last_fault, st.layout.name()});
    resume_admission(self);
    return;
  }

  std::vector<rehome_source> from;
  for (std::size_t g = 0; g < st.groups.size(); ++g) from.push_back({st.groups[g].get(), source_arena(st.ranks, int(g))});
  std::vector<rehome_target> to(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) to[g].policy = groups[g].get();
  for (rank_entry& r : ranks) {
    if (r.s) to[r.group].arenas.push_back(&r.s->arena());
    else to[r.group].reachable = false;
  }
  st.router.regroup(int(groups.size()));
  const rehome_stats moved = rehome(from, to, st.src->layout(), st.router, st.request_group);

  const bool rebuild = !st.sw->rp.has_value();
  for (rank_entry& r : st.ranks) {
    if (r.remote) continue;  // stays in the pool (and monitored) for a later tp1
    self->demonitor(r.actor.address());
    self->send_exit(r.actor, caf::exit_reason::user_shutdown);
  }
  st.ranks = std::move(ranks);
  for (const auto& g : st.groups) add_counters(st.retired, g->metrics());
  st.groups = std::move(groups);
  st.comm = std::move(comm);
  st.layout = st.sw->target;
  ++st.generation;
  (rebuild ? st.rebuilds : st.switches) += 1;
  finish_switch(self, moved, started);
}

}  // namespace cedar::runtime_detail
