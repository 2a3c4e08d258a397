// The scheduler actor's behaviour: control messages, the step loop and event delivery.
#include "actors/scheduler_actor.hpp"

#include <map>

namespace cedar {
namespace {

struct scheduler_state {
  std::unique_ptr<scheduler> policy;
  shard_actor shard;
  engine_options options;
  std::map<uint64_t, caf::strong_actor_ptr> sinks;  ///< request id -> who submitted it
  static inline const char* name = "cedar.scheduler";
};

using self_ptr = scheduler_actor::stateful_pointer<scheduler_state>;

void deliver_events(self_ptr self) {
  auto& st = self->state;
  for (token_batch& b : st.policy->take_events()) {
    auto it = st.sinks.find(b.request_id);
    if (it == st.sinks.end()) continue;
    const bool finished = b.finished;
    self->send(caf::actor_cast<session_actor>(it->second), std::move(b));
    if (finished) st.sinks.erase(it);
  }
}

/// Starts the next step when none is in flight, and sends out whatever events are ready.
void pump(self_ptr self) {
  auto& st = self->state;
  if (!st.policy->step_in_flight()) {
    if (auto step = st.policy->next_step()) {
      const uint64_t id = step->step_id;
      self->send(st.shard, std::move(*step));
      self->delayed_send(self, std::chrono::milliseconds(st.options.step_timeout_ms), step_timed_out{id});
    }
  }
  deliver_events(self);
}

status_reply to_reply(const status& s) {
  if (s.ok()) return {};
  return {int32_t(s.error().code), s.error().message};
}

scheduler_actor::behavior_type scheduler_behavior(self_ptr self, model_args args, kv_layout layout,
                                                  engine_options options, shard_actor shard) {
  self->state.policy = std::make_unique<scheduler>(args, layout, options);
  self->state.shard = std::move(shard);
  self->state.options = options;
  return {
      [=](submit_request& msg) -> submit_reply {
        if (msg.expired())  // its sender has rolled the turn back: running it would stream to nobody
          return {0, int32_t(engine_errc::cancelled), "the request waited longer than its sender would; not started"};
        auto r = self->state.policy->submit(std::move(msg.spec));
        if (!r) return {0, int32_t(r.error().code), r.error().message};
        self->state.sinks[r.value()] = self->current_sender();
        pump(self);
        return {r.value(), -1, {}};
      },
      [=](const cancel_request& msg) -> status_reply {
        const status s = self->state.policy->cancel(msg.request_id);
        pump(self);
        return to_reply(s);
      },
      [=](const session_changed& msg) {
        if (msg.open)
          self->state.policy->session_opened(msg.session_id);
        else
          self->state.policy->session_closed(msg.session_id);
      },
      [=](metrics_atom) -> metrics_snapshot { return self->state.policy->metrics(); },
      [=](drain_atom) -> status_reply {
        self->state.policy->drain();
        return {};
      },
      [=](const step_output& out) {
        if (self->state.policy->apply(out)) pump(self);  // a late or duplicate reply is dropped
      },
      [=](const step_timed_out& msg) {
        if (self->state.policy->in_flight_step_id() != msg.step_id) return;
        self->state.policy->apply(step_output{msg.step_id, {}, "no reply within the step timeout"});
        pump(self);
      },
  };
}

}  // namespace

scheduler_actor spawn_scheduler(caf::actor_system& sys, const model_args& args, const kv_layout& layout,
                                const engine_options& options, shard_actor shard) {
  return sys.spawn(scheduler_behavior, args, layout, options, std::move(shard));
}

}  // namespace cedar
