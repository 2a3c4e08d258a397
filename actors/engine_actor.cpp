// The engine facade on the actors (see engine.hpp): it owns the actor system, the shard and
// scheduler actors and the table of open sessions, and turns each call into a request to
// an actor with a timeout.
#include <atomic>
#include <map>

#include <caf/io/all.hpp>

#include "actors/engine.hpp"
#include "actors/protocol.hpp"
#include "actors/rank_source.hpp"
#include "actors/runtime_actor.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/session_actor.hpp"
#include "actors/shard_actor.hpp"
#include "kernels/model/model.hpp"

namespace cedar {

struct engine::impl {
  model_args args;
  engine_options options;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  shard_actor shard;
  scheduler_actor sched;
  runtime_actor runtime;  ///< the V4.1 model's layouts (null for a plain step_model)
  int shard_port = -1;    ///< where the runtime is published for shard processes
  std::mutex mu;
  std::map<uint64_t, session_actor> sessions;
  uint64_t next_session_id = 1;
  std::atomic<bool> draining{false};
  int64_t* timeout_ms = nullptr;

  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(*timeout_ms); }

  /// Sends `msg` to `dest` and waits for the reply (or the timeout).
  template <class Reply, class Dest, class Msg>
  outcome<Reply> ask(const Dest& dest, Msg msg) {
    caf::scoped_actor self{*sys};
    std::optional<outcome<Reply>> result;
    self->request(dest, timeout(), std::move(msg))
        .receive([&](Reply& r) { result.emplace(std::move(r)); },
                 [&](caf::error& e) {
                   result.emplace(engine_error{engine_errc::shard_failed, "runtime: " + sys->render(e)});
                 });
    return std::move(*result);
  }
};

namespace {

template <class Reply>
std::optional<engine_error> error_of(const Reply& r) {
  if (r.error_code < 0) return std::nullopt;
  return engine_error{engine_errc(r.error_code), r.error_message};
}

}  // namespace

engine::engine(std::unique_ptr<impl> p) : impl_(std::move(p)) { impl_->timeout_ms = &control_timeout_ms; }

engine::~engine() {
  std::map<uint64_t, session_actor> sessions;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    sessions.swap(impl_->sessions);
  }
  for (auto& [id, s] : sessions) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(impl_->sched, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(impl_->shard, caf::exit_reason::user_shutdown);
  sessions.clear();
  impl_->sched = scheduler_actor{};
  impl_->runtime = runtime_actor{};
  impl_->shard = shard_actor{};  // the detached shard's thread ends once no handle is left
  impl_->sys.reset();            // waits for every actor to finish
}

outcome<std::unique_ptr<engine>> engine::start(const model_args& args, std::shared_ptr<const tensor_map> weights,
                                               engine_options options) {
  std::shared_ptr<const model> m;
  try {
    m = std::make_shared<model>(args, std::move(weights), options.kv_fp8 ? kv_dtype::fp8 : kv_dtype::fp4,
                                options.page_tokens);
  } catch (const std::exception& e) {
    return engine_error{engine_errc::bad_params, std::string("model: ") + e.what()};
  }
  return start(nullptr, make_cpu_rank_source(m), options);
}

outcome<std::unique_ptr<engine>> engine::start(std::unique_ptr<step_model> model, engine_options options) {
  return start(std::move(model), nullptr, options);
}

outcome<std::unique_ptr<engine>> engine::start(std::shared_ptr<rank_source> src, engine_options options) {
  return start(nullptr, std::move(src), options);
}

outcome<std::unique_ptr<engine>> engine::start(std::unique_ptr<step_model> model, std::shared_ptr<rank_source> layered,
                                               engine_options options) {
  if (auto errors = validate(options); !errors.empty()) return engine_error{engine_errc::bad_params, errors.front()};
  std::optional<layout_spec> parallel;
  if (layered) {
    auto spec = parse_layout(options.layout, layered->args());
    if (!spec) return spec.error();
    if (const std::string why = layered->check(spec.value()); !why.empty())
      return engine_error{engine_errc::bad_params, "layout '" + options.layout + "': " + why};
    if (options.shard_port >= 0 && !layered->remote_shards())
      return engine_error{engine_errc::bad_params, "--shard-port: this model's shards run in this process only"};
    const int shards = spec.value().num_shards;
    const std::string what = "layout '" + options.layout + "' (" + std::to_string(shards) + " shards)";
    if (const std::string why = check_host_kv(*layered, options.kv_budget_bytes, shards, what); !why.empty())
      return engine_error{engine_errc::kv_exhausted, why};
    parallel = spec.value();
  }
  const kv_layout layout = layered ? layered->layout() : model->layout();
  if (options.page_tokens != layout.page_tokens)
    return engine_error{engine_errc::bad_params, "--page-tokens " + std::to_string(options.page_tokens) +
                                                     " differs from the model's pages of " +
                                                     std::to_string(layout.page_tokens) + " tokens"};
  const kv_capacity cap = plan_kv_capacity(layout, options.kv_budget_bytes, options.max_num_seqs);
  if (cap.num_pages < 1 || cap.num_slots < 1)
    return engine_error{engine_errc::kv_exhausted,
                        "--kv-budget-bytes " + std::to_string(options.kv_budget_bytes) +
                            " holds no page and ring slot (a slot is " + std::to_string(cap.slot_bytes) +
                            " B, a page " + std::to_string(cap.page_bytes) + " B)"};
  auto p = std::make_unique<impl>();
  p->args = layered ? layered->args() : model->args();
  p->options = options;
  register_messages(p->cfg);
  p->cfg.set("scheduler.max-threads", 2);
  p->cfg.set("logger.verbosity", caf::atom("quiet"));
  if (parallel && options.shard_port >= 0) p->cfg.load<caf::io::middleman>();
  p->sys = std::make_unique<caf::actor_system>(p->cfg);
  if (parallel) {
    p->runtime = spawn_runtime(*p->sys, std::move(layered), options, *parallel);
    p->sched = caf::actor_cast<scheduler_actor>(p->runtime);
    if (options.shard_port >= 0) {
      auto port = p->sys->middleman().publish(p->runtime, uint16_t(options.shard_port), options.shard_host.c_str());
      if (!port) {
        caf::anon_send_exit(p->runtime, caf::exit_reason::user_shutdown);
        return engine_error{engine_errc::bad_params, "--shard-port " + std::to_string(options.shard_port) +
                                                         " on " + options.shard_host + ": " +
                                                         p->sys->render(port.error())};
      }
      p->shard_port = *port;
    }
  } else {
    p->shard = spawn_shard(*p->sys, std::make_shared<shard>(std::move(model), cap));
    p->sched = spawn_scheduler(*p->sys, p->args, layout, options, p->shard);
  }
  return std::unique_ptr<engine>(new engine(std::move(p)));
}

outcome<uint64_t> engine::submit(request_spec spec, token_callback on_tokens) {
  if (impl_->draining) return engine_error{engine_errc::draining, "the engine is draining and takes no new requests"};
  session_actor target;
  if (spec.session_id == 0) {
    target = spawn_session(*impl_->sys, 0, impl_->sched, std::make_shared<session_output>(), control_timeout_ms);
  } else {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->sessions.find(spec.session_id);
    if (it == impl_->sessions.end())
      return engine_error{engine_errc::unknown_session, "no open session " + std::to_string(spec.session_id)};
    target = it->second;
  }
  // the session installs the callback only if it takes the turn
  auto r = impl_->ask<submit_reply>(target, submit_turn{std::move(spec), std::move(on_tokens)});
  if (!r) return r.error();
  if (auto e = error_of(r.value())) return *e;
  return r.value().request_id;
}

status engine::cancel(uint64_t request_id) {
  auto r = impl_->ask<status_reply>(impl_->sched, cancel_request{request_id});
  if (!r) return r.error();
  if (auto e = error_of(r.value())) return *e;
  return ok_t{};
}

outcome<uint64_t> engine::open_session() {
  if (impl_->draining) return engine_error{engine_errc::draining, "the engine is draining and opens no sessions"};
  std::lock_guard<std::mutex> lock(impl_->mu);
  const uint64_t id = impl_->next_session_id++;
  impl_->sessions[id] =
      spawn_session(*impl_->sys, id, impl_->sched, std::make_shared<session_output>(), control_timeout_ms);
  return id;
}

status engine::close_session(uint64_t session_id) {
  session_actor actor;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->sessions.find(session_id);
    if (it == impl_->sessions.end())
      return engine_error{engine_errc::unknown_session, "no open session " + std::to_string(session_id)};
    actor = it->second;
    impl_->sessions.erase(it);
  }
  auto r = impl_->ask<status_reply>(actor, close_atom::value);
  return r ? status(ok_t{}) : status(r.error());
}

outcome<session_status> engine::lookup_session(uint64_t session_id) {
  session_actor actor;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->sessions.find(session_id);
    if (it == impl_->sessions.end())
      return engine_error{engine_errc::unknown_session, "no open session " + std::to_string(session_id)};
    actor = it->second;
  }
  auto r = impl_->ask<session_info>(actor, info_atom::value);
  if (!r) return r.error();
  return session_status{r.value().session_id, r.value().history_tokens, r.value().active_request};
}

metrics_snapshot engine::metrics() {
  auto r = impl_->ask<metrics_snapshot>(impl_->sched, metrics_atom::value);
  return r ? r.value() : metrics_snapshot{};
}

bool engine::healthy() { return impl_->ask<metrics_snapshot>(impl_->sched, metrics_atom::value).ok(); }

bool engine::ready() { return !impl_->draining && healthy(); }

status engine::drain(int64_t timeout_ms) {
  impl_->draining = true;
  auto r = impl_->ask<status_reply>(impl_->sched, drain_atom::value);
  if (!r) return r.error();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    const metrics_snapshot m = metrics();
    if (m.requests_running == 0 && m.requests_waiting == 0) return ok_t{};
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return engine_error{engine_errc::draining, "requests still running after " + std::to_string(timeout_ms) + " ms"};
}

const model_args& engine::args() const { return impl_->args; }

void engine::switch_layout(const std::string& layout, std::function<void(outcome<switch_result>)> done) {
  if (!impl_->runtime) {
    done(engine_error{engine_errc::bad_params, "layouts need an engine started on the V4.1 model"});
    return;
  }
  // A switch waits for the step boundary and moves every request: it may take longer than a
  // control call, so the reply comes through `done` from a helper actor.
  impl_->sys->spawn([rt = impl_->runtime, layout, done = std::move(done)](caf::event_based_actor* self) {
    self->request(rt, caf::infinite, cedar::switch_layout{layout})
        .then(
            [=](switch_result& r) {
              if (r.error_code >= 0) done(engine_error{engine_errc(r.error_code), r.error_message});
              else done(std::move(r));
            },
            [=](caf::error& e) { done(engine_error{engine_errc::shard_failed, "runtime: " + self->system().render(e)}); });
  });
}

outcome<layout_status> engine::layout_info() {
  if (!impl_->runtime) return engine_error{engine_errc::bad_params, "layouts need an engine started on the V4.1 model"};
  return impl_->ask<layout_status>(impl_->runtime, layout_atom::value);
}

status engine::kill_shard(int rank) {
  if (!impl_->runtime) return engine_error{engine_errc::bad_params, "layouts need an engine started on the V4.1 model"};
  auto r = impl_->ask<status_reply>(impl_->runtime, cedar::kill_shard{int32_t(rank)});
  if (!r) return r.error();
  if (auto e = error_of(r.value())) return *e;
  return ok_t{};
}

int engine::shard_port() const { return impl_->shard_port; }

}  // namespace cedar
