// The runtime actor's state and the functions its behaviour calls (internal to the three
// runtime_*_actor.cpp files): step loop (runtime_step_actor.cpp), layout build, switch and
// rebuild (runtime_switch_actor.cpp), messages (runtime_actor.cpp). All run on the runtime
// actor's thread.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "actors/layout.hpp"
#include "actors/protocol.hpp"
#include "actors/rank_source.hpp"
#include "actors/scheduler.hpp"
#include "actors/session_router.hpp"
#include "actors/shard.hpp"
#include "kernels/collectives/inproc.hpp"

namespace cedar::runtime_detail {

/// One shard of the current layout.
struct rank_entry {
  shard_actor actor;
  std::shared_ptr<shard> s;  ///< shared with the actor; its arena is read only between steps (null: remote)
  bool remote = false;       ///< a shard process (cedar shard --connect); its KV is out of reach
  int group = 0;
  bool alive = true;
  bool kv_safe = true;       ///< false once it failed mid-step (its KV may be half written)
  int64_t steps = 0;
  int64_t rows = 0;
};

/// A step of every group at once (the ranks meet in collectives, so they step together).
struct global_step {
  uint64_t id = 0;
  std::vector<std::optional<run_step>> group_steps;  ///< [groups]; empty = the group had no work
  std::vector<std::optional<step_output>> outputs;   ///< [ranks]
  std::vector<bool> waiting;                         ///< [ranks] reply still expected
  std::string failure;                               ///< first error or fault; empty = fine
};

/// A submission that arrived while admission was paused: answered at once with the id it will
/// run under (its caller goes on), admitted when the switch is done.
struct held_submit {
  submit_request msg;
  caf::strong_actor_ptr sink;
  uint64_t id = 0;
  bool cancelled = false;  ///< its final batch has gone; it is not admitted
};

/// A switch's shards, made off the runtime's thread: loading a layout may take long, and the
/// runtime goes on answering (held submits, cancels, metrics, status) meanwhile. The builder
/// fills it and then sends layout_built; the runtime reads it only after that message.
struct layout_build {
  uint64_t ticket = 0;
  layout_spec spec;
  bool remote_first = false;  ///< rank 0 is a joined shard process (tp1); the rest are built here
  kv_capacity cap;
  std::vector<std::shared_ptr<shard>> shards;  ///< ranks remote_first.. of spec
  std::shared_ptr<inproc_group> comm;
  std::string error;  ///< what the build threw (then no shard is kept)
  std::chrono::steady_clock::time_point t0;
};

/// A switch (or rebuild) waiting for the step boundary.
struct pending_switch {
  layout_spec target;
  std::optional<caf::typed_response_promise<switch_result>> rp;  ///< none for a rebuild
  std::chrono::steady_clock::time_point t0;
  std::string cause;  ///< a rebuild's, for the event log: "shard_failed", "shard_joined"
};

struct runtime_state {
  std::shared_ptr<rank_source> src;  ///< makes every layout's shards
  engine_options options;
  layout_spec layout;
  uint64_t generation = 0;
  std::shared_ptr<inproc_group> comm;
  std::vector<rank_entry> ranks;
  std::vector<std::unique_ptr<scheduler>> groups;
  session_router router;
  std::map<uint64_t, int> request_group;               ///< live request -> group
  std::map<uint64_t, caf::strong_actor_ptr> sinks;     ///< live request -> who submitted it
  std::map<uint64_t, int> faults;                      ///< request -> failed steps it was in
  std::set<uint64_t> live_sessions;
  std::vector<shard_actor> remote_pool;                ///< shard processes that joined, monitored
  uint64_t next_request_id = 1;
  std::optional<global_step> step;
  uint64_t next_step_id = 1;
  bool paused = false;
  bool draining = false;
  std::optional<pending_switch> sw;
  std::shared_ptr<layout_build> build;  ///< the switch's shards being made (null: none)
  uint64_t next_build_ticket = 1;
  std::vector<held_submit> held;
  metrics_snapshot retired;  ///< the counters of groups a switch or rebuild replaced
  int64_t switches = 0, rebuilds = 0;
  double last_switch_ms = 0;
  std::string last_fault;
  static inline const char* name = "cedar.runtime";
};

using self_ptr = runtime_actor::stateful_pointer<runtime_state>;

// runtime_step_actor.cpp
/// Starts the next global step unless one is in flight or admission is paused, and delivers
/// the groups' events.
void pump(self_ptr self);
void deliver_events(self_ptr self);
/// A rank's reply; completes the global step once every expected reply is in.
void on_step_output(self_ptr self, const step_output& out);
/// A shard died, timed out or failed: abort the collectives and rebuild at the boundary.
void on_fault(self_ptr self, int rank, const std::string& reason, bool kv_lost);
/// Hands an event to options.on_event, when set (the server's log).
void report(self_ptr self, const std::string& event, std::vector<runtime_event_field> fields);
/// A field of report(): text, or a number.
runtime_event_field field(std::string key, std::string text, bool number = false);
runtime_event_field field(std::string key, int64_t number);
/// Milliseconds with three decimals, for a number field.
std::string millis_text(double ms);

// runtime_actor.cpp
/// Adds x's counters (prefix lookups and hits, tokens, replays, preemptions, steps) to m.
void add_counters(metrics_snapshot& m, const metrics_snapshot& x);

// runtime_switch_actor.cpp
/// The shards and schedulers of `spec` (generation `gen`), spawned and monitored.
void build_layout(self_ptr self, const layout_spec& spec, std::vector<rank_entry>& ranks,
                  std::vector<std::unique_ptr<scheduler>>& groups, std::shared_ptr<inproc_group>& comm);
/// Runs the pending switch or rebuild: no step may be in flight. Its shards are made off this
/// thread; the switch goes on in on_layout_built.
void run_switch(self_ptr self);
/// The builder of switch `ticket` is done: the new layout takes over (or the switch fails).
void on_layout_built(self_ptr self, uint64_t ticket);

// runtime_actor.cpp
/// Submits to the routed group and records the sink; answers the submitter (a submit past
/// its deadline is refused and never runs). held_id: the id a held submission was given (its
/// caller has its answer, so neither its deadline nor a drain begun since refuses it).
submit_reply do_submit(self_ptr self, submit_request& msg, const caf::strong_actor_ptr& sink, uint64_t held_id = 0);
/// Ends a held submission with its only batch: finished, with `reason` ("cancelled", "error").
void end_held(self_ptr self, held_submit& h, const std::string& reason, const std::string& error);

}  // namespace cedar::runtime_detail
