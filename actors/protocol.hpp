// Every message of the runtime and every typed-actor interface (CAF 0.17.6). The payload
// structs are plain C++ (actors/messages.hpp, so policies use them without CAF); this header
// gives each an inspect() and registers them all, so remote shards (CAF's middleman) can
// carry them. Hot path: one-way run_step / step_output carrying a step number. Control:
// request/response with a timeout.
#pragma once

#include <chrono>

#include <caf/all.hpp>

#include "actors/messages.hpp"

namespace cedar {

// ---- control messages (plain structs, defined here: only actors exchange them) ----

/// Now on the clock of submit_request's deadline: steady_clock milliseconds since its epoch.
inline int64_t steady_now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

/// Command: queue a request (spec.prompt = the full prompt). The sender receives the
/// request's token_batch events.
struct submit_request {
  request_spec spec;
  /// The latest time the request may start, on steady_now_ms()'s clock (0: any time). The sender
  /// sets it short of its reply timeout. A submit taken up later (it waited in the mailbox) is
  /// refused and never runs: its sender has given up on it and rolled the turn back. One held
  /// by a layout switch is answered when it arrives, so the deadline is checked then.
  int64_t deadline_ms = 0;
  /// Past the deadline: the request must not start.
  bool expired() const { return deadline_ms > 0 && steady_now_ms() > deadline_ms; }
};
/// Command: open a session turn: spec.prompt holds only the new tokens.
struct submit_turn {
  request_spec spec;
  /// The turn's batches go here once the session takes the turn (a refused turn leaves the
  /// running one's stream alone); empty: to the session's current callback. Not serialized:
  /// turns come from this process.
  token_callback on_tokens;
};
/// Reply to submit_request / submit_turn: the request id, or an error (code = engine_errc).
struct submit_reply {
  uint64_t request_id = 0;
  int32_t error_code = -1;  ///< -1: none
  std::string error_message;
};
/// Command: cancel a request.
struct cancel_request {
  uint64_t request_id = 0;
};
/// Reply to control commands with no value.
struct status_reply {
  int32_t error_code = -1;
  std::string error_message;
};
/// Event: a session was opened (true) or closed (false); the prefix cache keeps live ones.
struct session_changed {
  uint64_t session_id = 0;
  bool open = false;
};
/// Reply to a session lookup.
struct session_info {
  uint64_t session_id = 0;
  int64_t history_tokens = 0;  ///< tokens of the conversation so far
  uint64_t active_request = 0; ///< 0 = idle
};
/// Event (scheduler -> itself): a step's reply is overdue.
struct step_timed_out {
  uint64_t step_id = 0;
};
/// Event (a layout's builder -> the runtime): the shards of switch `ticket` are built, or failed.
struct layout_built {
  uint64_t ticket = 0;
};

// ---- atoms ----
using metrics_atom = caf::atom_constant<caf::atom("metrics")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
using info_atom = caf::atom_constant<caf::atom("info")>;
using close_atom = caf::atom_constant<caf::atom("close")>;

// ---- typed interfaces ----

/// A shard: runs steps. Replies with a step_output sent one-way to the step's sender.
using shard_actor = caf::typed_actor<caf::reacts_to<run_step>>;

/// The scheduler of one data-parallel group.
using scheduler_actor = caf::typed_actor<
    caf::replies_to<submit_request>::with<submit_reply>,  ///< queue a request; events go to the sender
    caf::replies_to<cancel_request>::with<status_reply>,  ///< cancel; freed at the next step boundary
    caf::reacts_to<session_changed>,                      ///< live-session retention in the prefix cache
    caf::replies_to<metrics_atom>::with<metrics_snapshot>,///< a metrics snapshot
    caf::replies_to<drain_atom>::with<status_reply>,      ///< stop admitting; running requests finish
    caf::reacts_to<step_output>,                          ///< a shard's reply to run_step
    caf::reacts_to<step_timed_out>>;                      ///< a step overdue: fail it

/// A conversation: owns its token history and the outgoing stream of its current turn.
using session_actor = caf::typed_actor<
    caf::replies_to<submit_turn>::with<submit_reply>,     ///< a new turn (tokens appended)
    caf::reacts_to<token_batch>,                          ///< the current turn's tokens
    caf::replies_to<info_atom>::with<session_info>,       ///< history length and activity
    caf::replies_to<close_atom>::with<status_reply>>;     ///< cancel the turn; stop after its last batch

// ---- inspect: one per message type (and nested type) ----

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampling_params& x) {
  return f(caf::meta::type_name("sampling_params"), x.temperature, x.top_k, x.top_p, x.min_p, x.seed, x.logprobs,
           x.allowed, x.frequency_penalty, x.presence_penalty, x.repetition_penalty, x.seen_ids, x.seen_counts,
           x.prompt_ids, x.bias_ids, x.bias_values);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, grammar_node& x) {
  return f(caf::meta::type_name("grammar_node"), x.kind, x.names, x.children, x.required, x.extra, x.min_count,
           x.max_count);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, output_grammar& x) {
  return f(caf::meta::type_name("output_grammar"), x.nodes, x.root, x.start_after, x.any_node);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampled_token& x) {
  return f(caf::meta::type_name("sampled_token"), x.token_id, x.logprob, x.top_ids, x.top_logprobs);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_item& x) {
  return f(caf::meta::type_name("step_item"), x.request_id, x.tokens, x.tokens_from, x.start_pos, x.page_ids,
           x.ring_slot, x.replay, x.truncate_below, x.sample, x.sampling, x.token_idx);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, run_step& x) {
  return f(caf::meta::type_name("run_step"), x.step_id, x.items);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, item_result& x) {
  return f(caf::meta::type_name("item_result"), x.request_id, x.has_token, x.token);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_output& x) {
  return f(caf::meta::type_name("step_output"), x.step_id, x.results, x.error);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, forced_lead& x) {
  return f(caf::meta::type_name("forced_lead"), x.choices, x.after);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_spec& x) {
  return f(caf::meta::type_name("request_spec"), x.session_id, x.prompt, x.sampling, x.max_tokens, x.stop_ids,
           x.ignore_eos, x.grammar, x.banned_ids, x.lead, x.min_tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, usage_counts& x) {
  return f(caf::meta::type_name("usage_counts"), x.prompt_tokens, x.cached_prompt_tokens, x.completion_tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_batch& x) {
  return f(caf::meta::type_name("token_batch"), x.request_id, x.session_id, x.ids, x.logprobs, x.top_ids,
           x.top_logprobs, x.finished, x.finish_reason, x.error, x.usage);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, metrics_snapshot& x) {
  return f(caf::meta::type_name("metrics_snapshot"), x.requests_running, x.requests_waiting, x.pages_total,
           x.pages_used, x.pages_cached_idle, x.pages_free, x.ring_slots_used, x.kv_bytes_used, x.kv_budget_bytes,
           x.prefix_queried_tokens, x.prefix_hit_tokens, x.tokens_in, x.tokens_out, x.replay_tokens, x.preemptions,
           x.steps, x.context_tokens, x.ttft_ms, x.itl_ms);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, submit_request& x) {
  return f(caf::meta::type_name("submit_request"), x.spec, x.deadline_ms);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, submit_turn& x) {
  return f(caf::meta::type_name("submit_turn"), x.spec);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, submit_reply& x) {
  return f(caf::meta::type_name("submit_reply"), x.request_id, x.error_code, x.error_message);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cancel_request& x) {
  return f(caf::meta::type_name("cancel_request"), x.request_id);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, status_reply& x) {
  return f(caf::meta::type_name("status_reply"), x.error_code, x.error_message);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, session_changed& x) {
  return f(caf::meta::type_name("session_changed"), x.session_id, x.open);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, session_info& x) {
  return f(caf::meta::type_name("session_info"), x.session_id, x.history_tokens, x.active_request);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_timed_out& x) {
  return f(caf::meta::type_name("step_timed_out"), x.step_id);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, layout_built& x) {
  return f(caf::meta::type_name("layout_built"), x.ticket);
}

// ---- layouts (actors/runtime_actor.hpp) ----

using layout_atom = caf::atom_constant<caf::atom("layout")>;

/// Command (a shard process -> the runtime): offers `shard` for the runtime's layouts.
/// `model` describes the shard's model (model_fingerprint); a mismatch is refused.
struct shard_join {
  shard_actor shard;
  std::string model;
};

/// The runtime (supervisor): stands where one scheduler would (sessions submit to it), runs
/// the schedulers of its data-parallel groups over the current layout's shards, switches
/// layouts and rebuilds after a shard failure.
using runtime_actor = scheduler_actor::extend<
    caf::replies_to<switch_layout>::with<switch_result>,  ///< switch at a step boundary
    caf::replies_to<layout_atom>::with<layout_status>,    ///< layout, shards, per-group load
    caf::replies_to<kill_shard>::with<status_reply>,      ///< test hook: crash a shard
    caf::replies_to<shard_join>::with<status_reply>,      ///< a shard process offers itself
    caf::reacts_to<layout_built>>;                         ///< a switch's shards are ready

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, switch_layout& x) {
  return f(caf::meta::type_name("switch_layout"), x.layout);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, switch_result& x) {
  return f(caf::meta::type_name("switch_result"), x.error_code, x.error_message, x.layout, x.pause_ms,
           x.rehome_ms, x.requests_moved, x.pages_copied);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_status& x) {
  return f(caf::meta::type_name("shard_status"), x.rank, x.group, x.alive, x.steps, x.rows, x.remote, x.device);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, layout_status& x) {
  return f(caf::meta::type_name("layout_status"), x.layout, x.generation, x.switching, x.shards, x.group_running,
           x.group_waiting, x.switches, x.rebuilds, x.last_switch_ms, x.last_fault);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_join& x) {
  return f(caf::meta::type_name("shard_join"), x.shard, x.model);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kill_shard& x) {
  return f(caf::meta::type_name("kill_shard"), x.rank);
}

/// Registers every message type (and the actor handles) with an actor system config.
inline void register_messages(caf::actor_system_config& cfg) {
  cfg.add_message_type<sampling_params>("cedar::sampling_params");
  cfg.add_message_type<sampled_token>("cedar::sampled_token");
  cfg.add_message_type<step_item>("cedar::step_item");
  cfg.add_message_type<run_step>("cedar::run_step");
  cfg.add_message_type<item_result>("cedar::item_result");
  cfg.add_message_type<step_output>("cedar::step_output");
  cfg.add_message_type<request_spec>("cedar::request_spec");
  cfg.add_message_type<usage_counts>("cedar::usage_counts");
  cfg.add_message_type<token_batch>("cedar::token_batch");
  cfg.add_message_type<metrics_snapshot>("cedar::metrics_snapshot");
  cfg.add_message_type<submit_request>("cedar::submit_request");
  cfg.add_message_type<submit_turn>("cedar::submit_turn");
  cfg.add_message_type<submit_reply>("cedar::submit_reply");
  cfg.add_message_type<cancel_request>("cedar::cancel_request");
  cfg.add_message_type<status_reply>("cedar::status_reply");
  cfg.add_message_type<session_changed>("cedar::session_changed");
  cfg.add_message_type<session_info>("cedar::session_info");
  cfg.add_message_type<step_timed_out>("cedar::step_timed_out");
  cfg.add_message_type<layout_built>("cedar::layout_built");
  cfg.add_message_type<std::vector<std::vector<int32_t>>>("cedar::id_lists");
  cfg.add_message_type<std::vector<std::vector<float>>>("cedar::logprob_lists");
  cfg.add_message_type<switch_layout>("cedar::switch_layout");
  cfg.add_message_type<switch_result>("cedar::switch_result");
  cfg.add_message_type<shard_status>("cedar::shard_status");
  cfg.add_message_type<std::vector<shard_status>>("cedar::shard_statuses");
  cfg.add_message_type<layout_status>("cedar::layout_status");
  cfg.add_message_type<kill_shard>("cedar::kill_shard");
  cfg.add_message_type<shard_join>("cedar::shard_join");
  cfg.add_message_type<runtime_actor>("cedar::runtime_actor");
  cfg.add_message_type<shard_actor>("cedar::shard_actor");
  cfg.add_message_type<scheduler_actor>("cedar::scheduler_actor");
  cfg.add_message_type<session_actor>("cedar::session_actor");
}

}  // namespace cedar
