// The runtime actor's behaviour (see runtime_actor.hpp): the scheduler interface (submit,
// cancel, sessions, metrics, drain, shard replies) over the current layout's groups, plus
// layout switches, status and the shard-crash test hook; a monitored shard that goes down is
// a fault (runtime_step_actor.cpp).
#include "actors/runtime_actor.hpp"

#include "actors/runtime_state_actor.hpp"

namespace cedar {

using namespace runtime_detail;

namespace runtime_detail {

submit_reply do_submit(self_ptr self, submit_request& msg, const caf::strong_actor_ptr& sink, uint64_t held_id) {
  auto& st = self->state;
  if (held_id == 0 && msg.expired())  // its sender has rolled the turn back: running it would stream to nobody
    return {0, int32_t(engine_errc::cancelled), "the request waited longer than its sender would; not started"};
  std::vector<int64_t> load(st.groups.size(), 0);  // live requests per group
  for (const auto& [id, g] : st.request_group) ++load[g];
  const int g = st.router.route(msg.spec.session_id, load);
  st.groups[g]->set_next_request_id(held_id ? held_id : st.next_request_id);
  auto r = st.groups[g]->submit(std::move(msg.spec), held_id != 0);
  if (!r) return {0, int32_t(r.error().code), r.error().message};
  st.next_request_id = std::max(st.next_request_id, r.value() + 1);
  st.request_group[r.value()] = g;
  st.sinks[r.value()] = sink;
  pump(self);
  return {r.value(), -1, {}};
}

void end_held(self_ptr self, held_submit& h, const std::string& reason, const std::string& error) {
  h.cancelled = true;
  token_batch b;
  b.request_id = h.id;
  b.session_id = h.msg.spec.session_id;
  b.finished = true;
  b.finish_reason = reason;
  b.error = error;
  b.usage.prompt_tokens = int64_t(h.msg.spec.prompt.size());
  if (h.sink) self->send(caf::actor_cast<session_actor>(h.sink), std::move(b));
}

void add_counters(metrics_snapshot& m, const metrics_snapshot& x) {
  m.prefix_queried_tokens += x.prefix_queried_tokens, m.prefix_hit_tokens += x.prefix_hit_tokens;
  m.tokens_in += x.tokens_in, m.tokens_out += x.tokens_out, m.replay_tokens += x.replay_tokens;
  m.preemptions += x.preemptions, m.steps += x.steps;
}

}  // namespace runtime_detail

namespace {

status_reply to_reply(const status& s) {
  if (s.ok()) return {};
  return {int32_t(s.error().code), s.error().message};
}

metrics_snapshot sum_metrics(const runtime_state& st) {
  metrics_snapshot m;
  add_counters(m, st.retired);  // counters only go up, across switches too
  for (const auto& g : st.groups) {
    const metrics_snapshot x = g->metrics();
    m.context_tokens = m.context_tokens ? std::min(m.context_tokens, x.context_tokens) : x.context_tokens;
    m.requests_running += x.requests_running, m.requests_waiting += x.requests_waiting;
    m.pages_total += x.pages_total, m.pages_used += x.pages_used, m.pages_cached_idle += x.pages_cached_idle;
    m.pages_free += x.pages_free, m.ring_slots_used += x.ring_slots_used, m.kv_bytes_used += x.kv_bytes_used;
    m.kv_budget_bytes += x.kv_budget_bytes;
    add_counters(m, x);
    m.ttft_ms.insert(m.ttft_ms.end(), x.ttft_ms.begin(), x.ttft_ms.end());
    m.itl_ms.insert(m.itl_ms.end(), x.itl_ms.begin(), x.itl_ms.end());
  }
  for (const held_submit& h : st.held) m.requests_waiting += !h.cancelled;  // behind a switch
  return m;
}

layout_status make_status(const runtime_state& st) {
  layout_status s;
  s.layout = st.layout.name();
  s.generation = st.generation;
  s.switching = st.sw.has_value();
  for (std::size_t r = 0; r < st.ranks.size(); ++r) {
    const rank_entry& e = st.ranks[r];
    s.shards.push_back({int32_t(r), int32_t(e.group), e.alive, e.steps, e.rows, e.remote,
                        e.s ? e.s->model_ref().device() : std::string()});
  }
  for (const auto& g : st.groups) {
    s.group_running.push_back(g->metrics().requests_running);
    s.group_waiting.push_back(g->metrics().requests_waiting);
  }
  s.switches = st.switches;
  s.rebuilds = st.rebuilds;
  s.last_switch_ms = st.last_switch_ms;
  s.last_fault = st.last_fault;
  return s;
}

runtime_actor::behavior_type runtime_behavior(self_ptr self, std::shared_ptr<rank_source> src, engine_options options,
                                              layout_spec layout) {
  auto& st = self->state;
  st.src = std::move(src);
  st.options = options;
  st.layout = layout;
  st.router = session_router(layout.num_groups());
  build_layout(self, layout, st.ranks, st.groups, st.comm);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    std::erase_if(st.remote_pool, [&](const shard_actor& a) { return a.address() == dm.source; });
    for (std::size_t r = 0; r < st.ranks.size(); ++r)
      if (st.ranks[r].actor.address() == dm.source && st.ranks[r].alive)
        return on_fault(self, int(r), "shard actor down (" + self->system().render(dm.reason) + ")", true);
  });
  return {
      [=](submit_request& msg) -> caf::result<submit_reply> {
        auto& st = self->state;
        if (st.draining) return submit_reply{0, int32_t(engine_errc::draining), "the engine is draining"};
        if (st.paused) {
          // held until the switch is done, but answered now: its caller (an I/O thread, through
          // its session) goes on, and cancels it by this id as a running one
          if (msg.expired())
            return submit_reply{0, int32_t(engine_errc::cancelled), "the request waited longer than its sender would"};
          if (auto e = st.groups.front()->check(msg.spec)) return submit_reply{0, int32_t(e->code), e->message};
          const uint64_t id = st.next_request_id++;
          st.held.push_back({std::move(msg), self->current_sender(), id});
          return submit_reply{id, -1, {}};
        }
        return do_submit(self, msg, self->current_sender());
      },
      [=](const cancel_request& msg) -> status_reply {
        auto& st = self->state;
        for (held_submit& h : st.held)
          if (h.id == msg.request_id && !h.cancelled) {
            end_held(self, h, "cancelled", {});
            return {};
          }
        auto it = st.request_group.find(msg.request_id);
        if (it == st.request_group.end())
          return {int32_t(engine_errc::unknown_request), "request " + std::to_string(msg.request_id) + " is not running"};
        const status s = st.groups[it->second]->cancel(msg.request_id);
        pump(self);
        return to_reply(s);
      },
      [=](const session_changed& msg) {
        auto& st = self->state;
        if (msg.open) st.live_sessions.insert(msg.session_id);
        else st.live_sessions.erase(msg.session_id), st.router.forget(msg.session_id);
        for (auto& g : st.groups) msg.open ? g->session_opened(msg.session_id) : g->session_closed(msg.session_id);
      },
      [=](metrics_atom) -> metrics_snapshot { return sum_metrics(self->state); },
      [=](drain_atom) -> status_reply {
        self->state.draining = true;
        for (auto& g : self->state.groups) g->drain();
        return {};
      },
      [=](const step_output& out) { on_step_output(self, out); },
      [=](const step_timed_out& msg) {
        auto& st = self->state;
        if (!st.step || st.step->id != msg.step_id) return;
        const std::vector<bool> waiting = st.step->waiting;
        for (std::size_t r = 0; r < waiting.size(); ++r) {
          if (!waiting[r]) continue;
          self->send_exit(st.ranks[r].actor, caf::exit_reason::kill);
          on_fault(self, int(r), "no reply within the step timeout", true);
        }
      },
      [=](const switch_layout& msg) -> caf::result<switch_result> {
        auto& st = self->state;
        auto spec = parse_layout(msg.layout, st.src->args());
        if (!spec) return switch_result{int32_t(spec.error().code), spec.error().message, st.layout.name()};
        if (const std::string why = st.src->check(spec.value()); !why.empty())
          return switch_result{int32_t(engine_errc::bad_params), "layout '" + msg.layout + "': " + why,
                               st.layout.name()};
        if (st.sw) return switch_result{int32_t(engine_errc::busy), "a layout switch is already running", st.layout.name()};
        // The new shards' arenas are made before the old ones go (their pages are copied across).
        const int now =
            int(std::count_if(st.ranks.begin(), st.ranks.end(), [](const rank_entry& r) { return !r.remote; }));
        const int next = spec.value().num_shards;
        if (const std::string why = check_host_kv(*st.src, st.options.kv_budget_bytes, now + next,
                                                  "switching from " + st.layout.name() + " (" + std::to_string(now) +
                                                      " shards) to " + msg.layout + " (" + std::to_string(next) + ")");
            !why.empty())
          return switch_result{int32_t(engine_errc::kv_exhausted), why, st.layout.name()};
        auto rp = self->make_response_promise<switch_result>();
        st.sw = pending_switch{spec.value(), rp, std::chrono::steady_clock::now()};
        st.paused = true;  // admission stops now; the switch runs at the step boundary
        if (!st.step) run_switch(self);
        return rp;
      },
      [=](layout_atom) -> layout_status { return make_status(self->state); },
      [=](const layout_built& msg) { on_layout_built(self, msg.ticket); },
      [=](shard_join& msg) -> status_reply {
        auto& st = self->state;
        if (!st.src->remote_shards())
          return {int32_t(engine_errc::bad_params), "this engine's shards run in its process only"};
        const std::string mine = model_fingerprint(st.src->args(), st.src->layout());
        if (msg.model != mine)
          return {int32_t(engine_errc::bad_params), "the shard's model (" + msg.model + ") is not this engine's (" + mine + ")"};
        self->monitor(msg.shard);
        st.remote_pool.push_back(msg.shard);
        report(self, "shard_joined", {field("pool", int64_t(st.remote_pool.size())),
                                      field("node", to_string(msg.shard.node()))});
        if (st.layout.num_shards == 1 && !st.sw) {  // move the one-shard layout onto it
          st.sw = pending_switch{st.layout, std::nullopt, std::chrono::steady_clock::now(), "shard_joined"};
          st.paused = true;
          if (!st.step) run_switch(self);
        }
        return {};
      },
      [=](const kill_shard& msg) -> status_reply {
#ifdef CEDAR_TEST_HOOKS
        auto& st = self->state;
        if (msg.rank < 0 || msg.rank >= int32_t(st.ranks.size()))
          return {int32_t(engine_errc::bad_params), "no shard " + std::to_string(msg.rank)};
        self->send_exit(st.ranks[msg.rank].actor, caf::exit_reason::kill);
        return {};
#else
        return {int32_t(engine_errc::bad_params), "built without CEDAR_TEST_HOOKS"};
#endif
      },
  };
}

}  // namespace

runtime_actor spawn_runtime(caf::actor_system& sys, std::shared_ptr<rank_source> src, const engine_options& options,
                            layout_spec layout) {
  return sys.spawn(runtime_behavior, std::move(src), options, layout);
}

}  // namespace cedar
