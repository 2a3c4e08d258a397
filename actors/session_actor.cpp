// The session actor's behaviour (see session_actor.hpp).
#include "actors/session_actor.hpp"

#include <algorithm>
#include <limits>

namespace cedar {
namespace {

constexpr uint64_t turn_starting = std::numeric_limits<uint64_t>::max();
constexpr int64_t reply_margin_ms = 200;  ///< kept for the submit reply's trip back

struct session_state {
  uint64_t session_id = 0;
  std::vector<int32_t> history;  ///< every token of the conversation so far
  uint64_t active_request = 0;   ///< 0 = idle
  bool closed = false;           ///< closed mid-turn: the actor stops once the turn has ended
  scheduler_actor sched;
  std::shared_ptr<session_output> out;
  static inline const char* name = "cedar.session";
};

using self_ptr = session_actor::stateful_pointer<session_state>;

/// A stand-alone session stops after its one turn, a closed one after the turn it was closed in.
void end_turn(self_ptr self) {
  self->state.active_request = 0;
  if (self->state.session_id == 0 || self->state.closed) self->quit();
}

void emit(self_ptr self, const token_batch& b) {
  std::lock_guard<std::mutex> lock(self->state.out->mu);
  if (self->state.out->on_tokens) self->state.out->on_tokens(b);
}

caf::result<submit_reply> start_turn(self_ptr self, submit_turn& msg, int64_t timeout_ms) {
  auto& st = self->state;
  if (st.active_request != 0)
    return submit_reply{0, int32_t(engine_errc::session_busy),
                        "session " + std::to_string(st.session_id) + " is still running a turn"};
  std::vector<int32_t> before = st.history;
  st.history.insert(st.history.end(), msg.spec.prompt.begin(), msg.spec.prompt.end());
  msg.spec.prompt = st.history;
  msg.spec.session_id = st.session_id;
  st.active_request = turn_starting;
  if (msg.on_tokens) {
    std::lock_guard<std::mutex> lock(st.out->mu);
    st.out->on_tokens = std::move(msg.on_tokens);
  }
  auto rp = self->make_response_promise<submit_reply>();
  // the request may start only while its reply can still reach us before we give up on it
  const int64_t deadline_ms = steady_now_ms() + timeout_ms - std::min<int64_t>(reply_margin_ms, timeout_ms / 2);
  self->request(st.sched, std::chrono::milliseconds(timeout_ms), submit_request{std::move(msg.spec), deadline_ms})
      .then(
          [=](submit_reply& r) mutable {
            if (r.error_code >= 0) {
              self->state.history = before;
              end_turn(self);
            } else if (self->state.active_request == turn_starting) {
              self->state.active_request = r.request_id;
              if (self->state.closed) caf::anon_send(self->state.sched, cancel_request{r.request_id});
            }
            rp.deliver(std::move(r));
          },
          [=](caf::error& e) mutable {
            self->state.history = before;
            rp.deliver(submit_reply{0, int32_t(engine_errc::shard_failed), "scheduler: " + self->system().render(e)});
            end_turn(self);
          });
  return rp;
}

session_actor::behavior_type session_behavior(self_ptr self, uint64_t session_id, scheduler_actor sched,
                                              std::shared_ptr<session_output> out, int64_t timeout_ms) {
  self->state.session_id = session_id;
  self->state.sched = sched;
  self->state.out = std::move(out);
  if (session_id != 0) self->send(sched, session_changed{session_id, true});
  return {
      [=](submit_turn& msg) -> caf::result<submit_reply> { return start_turn(self, msg, timeout_ms); },
      [=](const token_batch& b) {
        auto& st = self->state;
        st.history.insert(st.history.end(), b.ids.begin(), b.ids.end());
        emit(self, b);
        if (b.finished) end_turn(self);
      },
      [=](info_atom) -> session_info {
        const auto& st = self->state;
        return {st.session_id, int64_t(st.history.size()), st.active_request == turn_starting ? 0 : st.active_request};
      },
      [=](close_atom) -> status_reply {
        auto& st = self->state;
        self->send(st.sched, session_changed{st.session_id, false});
        if (st.active_request == 0) {
          self->quit();
          return {};
        }
        // The turn is cancelled (once its id is known, if it is still being submitted) and the
        // actor stays until its final batch has reached the caller; a scheduler that stopped
        // sends none.
        st.closed = true;
        if (st.active_request != turn_starting) caf::anon_send(st.sched, cancel_request{st.active_request});
        self->monitor(st.sched);
        self->set_down_handler([=](caf::down_msg&) { self->quit(); });
        return {};
      },
  };
}

}  // namespace

session_actor spawn_session(caf::actor_system& sys, uint64_t session_id, scheduler_actor sched,
                            std::shared_ptr<session_output> out, int64_t control_timeout_ms) {
  return sys.spawn(session_behavior, session_id, std::move(sched), std::move(out), control_timeout_ms);
}

}  // namespace cedar
