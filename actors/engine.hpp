// The runtime's facade for the server (net/) and the tools: start an engine on a model,
// submit requests (fresh prompts or session turns), stream their tokens, cancel, manage
// sessions, read metrics, drain. No CAF here; engine_actor.cpp builds it on the actors.
// Every method is thread-safe and returns within `control_timeout_ms`.
//
// Threads: token callbacks run on an actor's thread. They must be quick and must not call
// back into the engine synchronously; the server should hop to its own executor (post the
// batch to its I/O context) and return.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "actors/errors.hpp"
#include "actors/messages.hpp"
#include "config/engine_options.hpp"
#include "config/model_args.hpp"

namespace cedar {

struct tensor_map;
class step_model;
class rank_source;

/// A session's state as the engine sees it.
struct session_status {
  uint64_t session_id = 0;
  int64_t history_tokens = 0;   ///< the conversation so far (prompts and completions)
  uint64_t active_request = 0;  ///< 0 = no turn running
};

class engine {
 public:
  /// Builds the CPU model from `weights` and starts the actors. Errors: bad options, weights
  /// that do not match the config, a KV budget with no room for one request.
  static outcome<std::unique_ptr<engine>> start(const model_args& args, std::shared_ptr<const tensor_map> weights,
                                                engine_options options);
  /// Same with any step_model (the V4.1 model or a test model).
  static outcome<std::unique_ptr<engine>> start(std::unique_ptr<step_model> model, engine_options options);
  /// The V4.1 model's layouts from `src` (actors/rank_source.hpp: the CPU model, or GPU models
  /// placed one per device), starting in options.layout; switch_layout moves among the layouts
  /// src can build.
  static outcome<std::unique_ptr<engine>> start(std::shared_ptr<rank_source> src, engine_options options);
  /// Cancels what runs and stops the actors.
  ~engine();

  /// Submits a request. spec.session_id == 0: spec.prompt is the whole prompt. Otherwise
  /// spec.prompt holds only the new tokens, appended to the session's history. `on_tokens`
  /// receives the batches. Returns the request id.
  outcome<uint64_t> submit(request_spec spec, token_callback on_tokens);
  /// Cancels a running or waiting request; its last batch says "cancelled".
  status cancel(uint64_t request_id);

  /// Opens a conversation. It lives until close_session (not tied to a connection): a
  /// client that reconnects continues it by id.
  outcome<uint64_t> open_session();
  /// Closes a conversation. A turn still running is cancelled; its callback still gets the
  /// final batch.
  status close_session(uint64_t session_id);
  outcome<session_status> lookup_session(uint64_t session_id);

  metrics_snapshot metrics();
  /// The actors answer.
  bool healthy();
  /// Healthy and not draining.
  bool ready();
  /// Stops taking requests and waits (up to timeout_ms) until running ones finish.
  status drain(int64_t timeout_ms);

  /// Switches the parallel layout ("tp1", "tp4", "dep2", ...) at the next step boundary:
  /// admission pauses, every request keeps its tokens and its cached global-KV pages (moved to
  /// their new owner), SWA rings are rebuilt by replay, admission resumes; no request is
  /// dropped. `done` gets the outcome on an actor thread (keep it short). Only an engine
  /// started on the V4.1 model has layouts.
  void switch_layout(const std::string& layout, std::function<void(outcome<switch_result>)> done);
  /// The layout, its shards and the load of each data-parallel group.
  outcome<layout_status> layout_info();
  /// Test builds (CEDAR_TEST_HOOKS) only: shard `rank` crashes; the runtime replaces it.
  status kill_shard(int rank);
  /// The port shard processes connect to (`cedar shard --connect HOST:PORT`), or -1 when the
  /// engine was started without --shard-port.
  int shard_port() const;

  const model_args& args() const;
  int64_t control_timeout_ms = 10000;

 private:
  struct impl;
  explicit engine(std::unique_ptr<impl> p);
  /// Every start(): `layered` (layouts of the V4.1 model, or null) runs under the runtime actor
  /// in options.layout; otherwise `model` runs on one shard under one scheduler.
  static outcome<std::unique_ptr<engine>> start(std::unique_ptr<step_model> model, std::shared_ptr<rank_source> layered,
                                                engine_options options);
  std::unique_ptr<impl> impl_;
};

}  // namespace cedar
