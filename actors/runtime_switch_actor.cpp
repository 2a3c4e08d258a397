// Building a layout and switching to another one (see runtime_state_actor.hpp). A switch runs
// at a step boundary with admission paused: the new shards are built by a detached builder
// (the runtime keeps answering meanwhile: submits are held, cancels, metrics and status
// answer), then the schedulers are made, every request and cached page chain is re-homed
// (rehome.hpp), the old shards are stopped, and the held submissions are admitted. A rebuild
// after a shard failure is a switch to the same layout in which a failed shard's KV counts as
// lost.
#include <algorithm>
#include <stdexcept>

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
  for (held_submit& h : held) {
    if (h.cancelled) continue;
    const submit_reply r = do_submit(self, h.msg, h.sink, h.id);
    if (r.error_code >= 0) end_held(self, h, "error", r.error_message);
  }
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

namespace {

/// Makes the shards of job.spec from rank job.remote_first on (the slow part of a layout: the
/// models' weights and the KV arenas); any thread. A failure is kept in job.error.
void make_shards(rank_source& src, layout_build& job, std::chrono::milliseconds timeout) {
  try {
    const int first = job.remote_first ? 1 : 0;
    layout_ranks made = src.make(job.spec, first, timeout);
    job.comm = made.comm;
    for (auto& m : made.models) job.shards.push_back(std::make_shared<shard>(std::move(m), job.cap));
  } catch (const std::exception& e) {
    job.shards.clear();
    job.comm.reset();
    job.error = e.what();
  }
}

std::shared_ptr<layout_build> new_build(self_ptr self, const layout_spec& spec) {
  auto& st = self->state;
  auto job = std::make_shared<layout_build>();
  job->ticket = st.next_build_ticket++;
  job->spec = spec;
  job->remote_first = spec.num_shards == 1 && !st.remote_pool.empty();  // a joined shard process serves tp1
  job->cap = plan_kv_capacity(st.src->layout(), st.options.kv_budget_bytes, st.options.max_num_seqs);
  job->t0 = std::chrono::steady_clock::now();
  return job;
}

/// The built shards as the layout's ranks (spawned and monitored) and its groups' schedulers.
void adopt_layout(self_ptr self, layout_build& job, std::vector<rank_entry>& ranks,
                  std::vector<std::unique_ptr<scheduler>>& groups, std::shared_ptr<inproc_group>& comm) {
  auto& st = self->state;
  if (!job.error.empty()) throw std::runtime_error(job.error);
  if (job.remote_first) {
    if (st.remote_pool.empty()) throw std::runtime_error("the shard process left while the layout was built");
    rank_entry e;
    e.actor = st.remote_pool.front();
    e.remote = true;
    ranks.push_back(std::move(e));
  }
  comm = job.comm;
  for (auto& s : job.shards) {
    rank_entry e;
    e.s = s;
    e.group = job.spec.group_of_shard(int(ranks.size()));
    e.actor = spawn_shard(self->system(), std::move(s));
    self->monitor(e.actor);
    ranks.push_back(std::move(e));
  }
  job.shards.clear();
  for (int g = 0; g < job.spec.num_groups(); ++g) {
    groups.push_back(std::make_unique<scheduler>(st.src->args(), st.src->layout(), st.options));
    for (uint64_t session : st.live_sessions) groups.back()->session_opened(session);
    if (st.draining) groups.back()->drain();
  }
}

}  // namespace

void build_layout(self_ptr self, const layout_spec& spec, std::vector<rank_entry>& ranks,
                  std::vector<std::unique_ptr<scheduler>>& groups, std::shared_ptr<inproc_group>& comm) {
  auto job = new_build(self, spec);
  make_shards(*self->state.src, *job, std::chrono::milliseconds(self->state.options.step_timeout_ms));
  adopt_layout(self, *job, ranks, groups, comm);
}

void run_switch(self_ptr self) {
  auto& st = self->state;
  CEDAR_CHECK(st.sw && !st.step);
  st.paused = true;
  if (st.build) return;  // its builder is at work; on_layout_built goes on
  st.build = new_build(self, st.sw->target);
  self->system().spawn<caf::detached>([job = st.build, src = st.src,
                                       timeout = std::chrono::milliseconds(st.options.step_timeout_ms),
                                       rt = caf::actor_cast<runtime_actor>(self)](caf::event_based_actor* builder) {
    make_shards(*src, *job, timeout);
    builder->send(rt, layout_built{job->ticket});
  });
}

void on_layout_built(self_ptr self, uint64_t ticket) {
  auto& st = self->state;
  if (!st.build || st.build->ticket != ticket || !st.sw) return;
  const std::shared_ptr<layout_build> job = std::move(st.build);
  st.build.reset();
  const auto started = job->t0;
  std::vector<rank_entry> ranks;
  std::vector<std::unique_ptr<scheduler>> groups;
  std::shared_ptr<inproc_group> comm;
  try {
    adopt_layout(self, *job, ranks, groups, comm);
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
