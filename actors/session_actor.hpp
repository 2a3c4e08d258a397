// The session actor: one per conversation (or one per stand-alone request). It owns the
// conversation's token history, so a follow-up turn sends only its new tokens; it forwards
// each turn to the scheduler and streams the turn's token batches to the current callback
// (each turn brings its own, installed when the session takes the turn: that is how a
// reconnected client resumes).
#pragma once

#include <mutex>

#include "actors/engine.hpp"
#include "actors/protocol.hpp"

namespace cedar {

/// Where a session's batches go: the current turn's callback (submit_turn replaces it).
struct session_output {
  std::mutex mu;
  token_callback on_tokens;
};

/// session_id 0 = a stand-alone request: the actor handles one turn and then stops.
session_actor spawn_session(caf::actor_system& sys, uint64_t session_id, scheduler_actor sched,
                            std::shared_ptr<session_output> out, int64_t control_timeout_ms);

}  // namespace cedar
