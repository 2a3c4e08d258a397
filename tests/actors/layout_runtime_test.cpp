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
#include <optional>
#include <thread>

#include "actors/protocol.hpp"
#include "actors/rank_source.hpp"
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

  rig(const std::string& layout, engine_options o,
      std::shared_ptr<rank_source> src = make_cpu_rank_source(micro_model())) {
    register_messages(cfg);
    cfg.set("scheduler.max-threads", 2);
    cfg.set("logger.verbosity", caf::atom("quiet"));
    sys = std::make_unique<caf::actor_system>(cfg);
    auto spec = parse_layout(layout, micro_model()->args());
    REQUIRE(spec.ok());
    rt = spawn_runtime(*sys, std::move(src), o, spec.value());
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

  /// A client; session_id 0 makes a one-request client. Its session waits control_timeout_ms
  /// for the runtime's answer to a submit.
  client& open(uint64_t session_id, int64_t control_timeout_ms = 60000) {
    clients.push_back(std::make_unique<client>());
    client& c = *clients.back();
    c.out->on_tokens = [&c](const token_batch& b) {
      std::lock_guard<std::mutex> lock(c.mu);
      c.turns.back().insert(c.turns.back().end(), b.ids.begin(), b.ids.end());
      if (b.finished) c.reasons.back() = b.finish_reason, c.errors.back() = b.error;
      c.cv.notify_all();
    };
    c.actor = spawn_session(*sys, session_id, caf::actor_cast<scheduler_actor>(rt), c.out, control_timeout_ms);
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

/// What a multi-turn run produced: per session, per turn, the streamed tokens.
struct run_result {
  std::vector<std::vector<std::vector<int32_t>>> tokens;
  std::vector<switch_result> switches;
  int failed = 0;     ///< turns that did not finish with "length"
  int truncated = 0;  ///< turns with fewer tokens than asked
};

constexpr int num_sessions = 32, num_turns = 3, turn_tokens = 8;

/// 32 sessions of 3 turns each, every session starting its next turn as soon as the previous
/// one finished. With `switch_to`, a second thread switches to each layout in turn once the
/// sessions have streamed another eighth of their tokens.
run_result run_sessions(const std::string& first, const std::vector<std::string>& switch_to, swa_replay_mode replay) {
  rig r(first, options(replay));
  std::vector<client*> cs;
  for (int i = 0; i < num_sessions; ++i) cs.push_back(&r.open(uint64_t(i + 1)));
  std::atomic<int64_t> streamed{0};
  for (client* c : cs) {
    auto inner = c->out->on_tokens;
    c->out->on_tokens = [inner, &streamed](const token_batch& b) {
      streamed += int64_t(b.ids.size());
      inner(b);
    };
  }
  run_result res;
  std::thread switcher([&] {
    const int64_t total = int64_t(num_sessions) * num_turns * turn_tokens;
    for (std::size_t k = 0; k < switch_to.size(); ++k) {
      while (streamed < total * int64_t(k + 1) / 8) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      res.switches.push_back(r.ask<switch_result>(r.rt, switch_layout{switch_to[k]}));
    }
  });
  std::vector<int> turns_started(num_sessions, 0);
  for (int done = 0; done < num_sessions;) {
    done = 0;
    for (int i = 0; i < num_sessions; ++i) {
      client& c = *cs[i];
      bool idle;
      {
        std::lock_guard<std::mutex> lock(c.mu);
        idle = c.reasons.empty() || !c.reasons.back().empty();
      }
      if (!idle) continue;
      if (turns_started[i] == num_turns) {
        ++done;
        continue;
      }
      const int t = turns_started[i]++;
      r.turn(c, tokens_for(1000 * i + t, t == 0 ? 20 : 10), turn_tokens);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  switcher.join();
  for (client* c : cs) {
    res.tokens.push_back(c->turns);
    for (std::size_t t = 0; t < c->turns.size(); ++t) {
      res.failed += c->reasons[t] != "length";
      res.truncated += int(c->turns[t].size()) != turn_tokens;
    }
  }
  return res;
}

}  // namespace

TEST_CASE("runtime: every layout serves TP-1's greedy tokens") {
  const auto want = serve_prompts("tp1", 12);
  for (const char* layout : {"tp2", "tp4", "dep2"}) {
    INFO(layout);
    CHECK(serve_prompts(layout, 12) == want);
  }
}

TEST_CASE("runtime: 32 streaming sessions survive tp4 -> dep2 -> tp4 -> tp1 switches") {
  const std::vector<std::string> plan{"dep2", "tp4", "tp1"};
  for (const auto replay : {swa_replay_mode::full, swa_replay_mode::bounded}) {
    const bool exact = replay == swa_replay_mode::full;
    const std::string mode = exact ? "exact" : "bounded";
    INFO(mode << " replay");
    const run_result want = run_sessions("tp4", {}, replay);
    const run_result got = run_sessions("tp4", plan, replay);
    CHECK(want.failed == 0);
    CHECK(got.failed == 0);
    CHECK(got.truncated == 0);
    REQUIRE(got.switches.size() == plan.size());
    for (std::size_t k = 0; k < plan.size(); ++k) {
      CHECK_MESSAGE(got.switches[k].error_code < 0, got.switches[k].error_message);
      CHECK(got.switches[k].layout == plan[k]);
      MESSAGE(mode << " replay: switch to " << plan[k] << " paused admission for "
              << got.switches[k].pause_ms << " ms (" << got.switches[k].rehome_ms << " ms re-homing), moved " << got.switches[k].requests_moved << " requests and "
              << got.switches[k].pages_copied << " pages");
    }
    int sessions_differ = 0, tokens_differ = 0;
    for (int i = 0; i < num_sessions; ++i) {
      bool differs = false;
      for (int t = 0; t < num_turns; ++t)
        for (int k = 0; k < turn_tokens; ++k) {
          const bool d = got.tokens[i][t][k] != want.tokens[i][t][k];
          tokens_differ += d;
          differs |= d;
        }
      sessions_differ += differs;
    }
    MESSAGE(mode << " replay: " << sessions_differ << " of " << num_sessions
            << " sessions differ from the unswitched run, " << tokens_differ << " of "
            << num_sessions * num_turns * turn_tokens << " tokens");
    if (exact) CHECK(sessions_differ == 0);
  }
}

/// A 3000-token prefill step is in flight when a switch to tp1 arrives, so the switch waits for
/// it and a submit sent meanwhile is held (`held` says whether it was: the step may be quicker).
struct switch_waiting_for_a_step {
  rig r;
  client& first;
  switch_result sw;
  std::thread switcher;
  bool held = false;

  static engine_options long_steps() {
    engine_options o = options();
    o.max_batched_tokens = 4096;
    o.max_prefill_tokens_per_request = 4096;
    return o;
  }
  switch_waiting_for_a_step() : r("tp2", long_steps()), first(r.open(0)) {
    r.turn(first, tokens_for(700, 3000), 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the 3000-token step is running
    switcher = std::thread([this] { sw = r.ask<switch_result>(r.rt, switch_layout{"tp1"}); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the switch waits for that step
    held = r.ask<layout_status>(r.rt, layout_atom::value).switching;
  }
  ~switch_waiting_for_a_step() {
    if (switcher.joinable()) switcher.join();
  }
  /// The switch went through and the first request finished whole.
  void finish() {
    switcher.join();
    CHECK_MESSAGE(sw.error_code < 0, sw.error_message);
    REQUIRE(rig::wait(first, 30000));
    CHECK(first.reasons[0] == "length");
  }
};

TEST_CASE("runtime: a submit held by a pending switch streams to its session") {
  // the held request must stream its tokens to the session that sent it (its sender was once
  // lost with the promise)
  switch_waiting_for_a_step s;
  client& second = s.r.open(0);
  s.r.turn(second, tokens_for(701, 9), 4);
  s.finish();
  REQUIRE(rig::wait(second, 30000));
  CHECK(second.reasons[0] == "length");
  CHECK(second.turns[0].size() == 4u);
  const std::string when = s.held ? "while the switch waited (held)" : "outside the switch's wait";
  MESSAGE("the second submit arrived " << when);
}

TEST_CASE("runtime: a submit held by a pending switch is answered at once, its tokens come after the switch") {
  // its caller (an I/O thread, through its session) must not wait for the switch
  switch_waiting_for_a_step s;
  client& second = s.r.open(0);
  s.r.turn(second, tokens_for(702, 9), 4);  // returns once the runtime answered
  const bool answered_mid_switch = s.r.ask<layout_status>(s.r.rt, layout_atom::value).switching;
  s.finish();
  REQUIRE(rig::wait(second, 30000));
  CHECK(second.reasons[0] == "length");
  CHECK(second.turns[0].size() == 4u);
  if (s.held) CHECK(answered_mid_switch);
  else MESSAGE("the submit arrived outside the switch's wait; nothing to check");
}

/// The CPU model's layouts; building `slow` takes `build_ms` longer (a GPU layout loading).
class slow_source final : public rank_source {
 public:
  slow_source(std::string slow, int build_ms)
      : cpu_(make_cpu_rank_source(micro_model())), slow_(std::move(slow)), build_ms_(build_ms) {}
  const model_args& args() const override { return cpu_->args(); }
  const kv_layout& layout() const override { return cpu_->layout(); }
  std::string check(const layout_spec&) const override { return ""; }
  layout_ranks make(const layout_spec& spec, int first, std::chrono::milliseconds timeout) override {
    if (spec.name() == slow_) std::this_thread::sleep_for(std::chrono::milliseconds(build_ms_));
    return cpu_->make(spec, first, timeout);
  }

 private:
  std::shared_ptr<rank_source> cpu_;
  std::string slow_;
  int build_ms_;
};

TEST_CASE("runtime: while a slow layout builds, the runtime answers at once and holds submits until it is up") {
  rig r("tp1", options(), std::make_shared<slow_source>("tp2", 1500));
  client& c = r.open(9);
  switch_result sw;
  std::thread switcher([&] { sw = r.ask<switch_result>(r.rt, switch_layout{"tp2"}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // tp2's shards are being built
  // metrics and the layout's status answer within 300 ms, mid-build (a server's /metrics, /health)
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<layout_status> status;
  {
    caf::scoped_actor self{*r.sys};
    self->request(r.rt, std::chrono::milliseconds(300), metrics_atom::value)
        .receive([&](metrics_snapshot&) {}, [&](caf::error& e) { FAIL("metrics mid-build: " << r.sys->render(e)); });
    self->request(r.rt, std::chrono::milliseconds(300), layout_atom::value)
        .receive([&](layout_status& s) { status = s; },
                 [&](caf::error& e) { FAIL("status mid-build: " << r.sys->render(e)); });
  }
  const double answered_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(status);
  CHECK(status->switching);
  CHECK(status->layout == "tp1");
  // a turn submitted mid-build waits for tp2 and then runs whole on it
  std::thread submitter([&] { r.turn(c, tokens_for(760, 20), 4); });
  const layout_status still = r.ask<layout_status>(r.rt, layout_atom::value, 300);
  CHECK(still.switching);
  switcher.join();
  submitter.join();
  CHECK_MESSAGE(sw.error_code < 0, sw.error_message);
  CHECK(sw.layout == "tp2");
  REQUIRE(rig::wait(c, 30000));
  CHECK(c.reasons[0] == "length");
  CHECK(c.turns[0].size() == 4u);
  MESSAGE("mid-build: metrics and status answered in " << answered_ms << " ms; the switch paused " << sw.pause_ms
                                                        << " ms");
}

TEST_CASE("runtime: a session that waits 300 ms for an answer gets one mid-build; its turn runs on the new layout") {
  rig r("tp1", options(), std::make_shared<slow_source>("tp2", 1500));
  client& c = r.open(7, 300);
  switch_result sw;
  std::thread switcher([&] { sw = r.ask<switch_result>(r.rt, switch_layout{"tp2"}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the runtime is building tp2
  r.turn(c, tokens_for(720, 20), 4);  // REQUIREs the answer: before, the session gave up at 300 ms
  switcher.join();
  CHECK_MESSAGE(sw.error_code < 0, sw.error_message);
  REQUIRE(rig::wait(c, 30000));
  CHECK(c.reasons[0] == "length");
  CHECK(c.turns[0].size() == 4u);
  CHECK(r.ask<session_info>(c.actor, info_atom::value).history_tokens == 20 + 4);
  // the next turn goes on from it
  r.turn(c, tokens_for(721, 12), 4);
  REQUIRE(rig::wait(c, 30000));
  CHECK(c.reasons[1] == "length");
  CHECK(r.ask<session_info>(c.actor, info_atom::value).history_tokens == 20 + 4 + 12 + 4);
  const auto m = r.ask<metrics_snapshot>(r.rt, metrics_atom::value);
  CHECK(m.requests_running + m.requests_waiting == 0);
}

TEST_CASE("runtime: a drain begun while a submission is held lets it run; a later submit is refused") {
  rig r("tp1", options(), std::make_shared<slow_source>("tp2", 1000));
  client& c = r.open(0);
  switch_result sw;
  std::thread switcher([&] { sw = r.ask<switch_result>(r.rt, switch_layout{"tp2"}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the runtime is building tp2
  r.turn(c, tokens_for(750, 16), 4);                             // held, and answered
  CHECK(r.ask<status_reply>(r.rt, drain_atom::value).error_code < 0);
  request_spec late;
  late.prompt = tokens_for(751, 8);
  late.max_tokens = 2;
  CHECK(r.ask<submit_reply>(r.rt, submit_request{late, 0}).error_code == int32_t(engine_errc::draining));
  switcher.join();
  CHECK_MESSAGE(sw.error_code < 0, sw.error_message);
  REQUIRE(rig::wait(c, 30000));
  CHECK(c.reasons[0] == "length");  // it was accepted before the drain: it runs whole
  CHECK(c.turns[0].size() == 4u);
}

TEST_CASE("runtime: a session closed while its turn waits behind a switch cancels the turn; it never runs") {
  rig r("tp1", options(), std::make_shared<slow_source>("tp2", 1500));
  client& c = r.open(8);
  switch_result sw;
  std::thread switcher([&] { sw = r.ask<switch_result>(r.rt, switch_layout{"tp2"}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the runtime is building tp2
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.turns.emplace_back(), c.reasons.emplace_back(), c.errors.emplace_back();
  }
  request_spec spec;
  spec.prompt = tokens_for(740, 20);
  spec.max_tokens = 200;
  spec.ignore_eos = true;
  // the turn's submit is held until the switch is done, and answered at once
  std::optional<submit_reply> accepted;
  std::thread submitter([&] {
    caf::scoped_actor self{*r.sys};
    self->request(c.actor, std::chrono::seconds(10), submit_turn{spec})
        .receive([&](submit_reply& reply) { accepted = reply; }, [&](caf::error&) {});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(r.ask<status_reply>(c.actor, close_atom::value).error_code < 0);
  submitter.join();
  switcher.join();
  CHECK_MESSAGE(sw.error_code < 0, sw.error_message);
  // the held request was cancelled by its id: its caller got the id and the final batch, and
  // it was never admitted
  CHECK((accepted && accepted->error_code < 0));
  CHECK(rig::wait(c, 10000));
  CHECK(c.reasons[0] == "cancelled");
  CHECK(c.turns[0].empty());
  const auto m = r.ask<metrics_snapshot>(r.rt, metrics_atom::value);
  CHECK(m.requests_running + m.requests_waiting == 0);
  CHECK(m.tokens_out == 0);  // nothing ran for nobody
}

/// Steps to fail: the next `fails` forward passes of any shard throw, each once `go` is set
/// (`entered`: one is waiting for it).
struct fault_plan {
  std::atomic<int> fails{0};
  std::atomic<bool> go{true}, entered{false};
};

/// A CPU rank that fails the steps its fault_plan asks for.
class faulty_model final : public step_model {
 public:
  faulty_model(std::unique_ptr<step_model> m, std::shared_ptr<fault_plan> plan)
      : m_(std::move(m)), plan_(std::move(plan)) {}
  const model_args& args() const override { return m_->args(); }
  const kv_layout& layout() const override { return m_->layout(); }
  void forward(std::span<forward_item> batch, std::vector<float>& logits) override {
    maybe_fail();
    m_->forward(batch, logits);
  }
  std::vector<sampled_token> forward_sample(std::span<forward_item> batch, std::span<const sampling_params> params,
                                            std::span<const int64_t> token_idx) override {
    maybe_fail();
    return m_->forward_sample(batch, params, token_idx);
  }
  std::unique_ptr<kv_arena> make_arena(const kv_capacity& cap) const override { return m_->make_arena(cap); }

 private:
  void maybe_fail() {
    if (plan_->fails <= 0) return;
    plan_->entered = true;
    while (!plan_->go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    --plan_->fails;
    throw std::runtime_error("injected fault");
  }
  std::unique_ptr<step_model> m_;
  std::shared_ptr<fault_plan> plan_;
};

/// The CPU model's layouts, every rank following one fault_plan.
class faulty_source final : public rank_source {
 public:
  explicit faulty_source(std::shared_ptr<fault_plan> plan)
      : cpu_(make_cpu_rank_source(micro_model())), plan_(std::move(plan)) {}
  const model_args& args() const override { return cpu_->args(); }
  const kv_layout& layout() const override { return cpu_->layout(); }
  std::string check(const layout_spec&) const override { return ""; }
  layout_ranks make(const layout_spec& spec, int first, std::chrono::milliseconds timeout) override {
    layout_ranks ranks = cpu_->make(spec, first, timeout);
    for (auto& m : ranks.models) m = std::make_unique<faulty_model>(std::move(m), plan_);
    return ranks;
  }

 private:
  std::shared_ptr<rank_source> cpu_;
  std::shared_ptr<fault_plan> plan_;
};

TEST_CASE("runtime: a second failed step ends only the requests it failed twice; the others run on") {
  auto plan = std::make_shared<fault_plan>();
  rig r("tp1", options(), std::make_shared<faulty_source>(plan));
  client& twice = r.open(0);
  r.turn(twice, tokens_for(730, 20), 200);
  auto streamed = [&] {
    std::lock_guard<std::mutex> lock(twice.mu);
    return twice.turns[0].size();
  };
  while (streamed() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  plan->go = false;
  plan->fails = 2;  // the next two steps fail
  while (!plan->entered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // queued behind the first failing step, so it first runs in the second one
  client& once = r.open(0);
  r.turn(once, tokens_for(731, 20), 4);
  plan->go = true;
  REQUIRE(rig::wait(twice, 30000));
  REQUIRE(rig::wait(once, 30000));
  CHECK(twice.reasons[0] == "error");
  CHECK(twice.errors[0].find("twice") != std::string::npos);
  CHECK_MESSAGE(once.reasons[0] == "length", once.errors[0]);
  CHECK(once.turns[0].size() == 4u);
  const layout_status st = r.ask<layout_status>(r.rt, layout_atom::value);
  CHECK(st.rebuilds == 2);
}

TEST_CASE("runtime: counters survive a switch, and dep2's context is one group's KV, not both") {
  engine_options o = options();
  o.max_num_seqs = 4;
  o.kv_budget_bytes = int64_t(4) << 20;  // the KV, not the position limit, bounds the context
  rig r("tp2", o);
  client& c = r.open(1);
  r.turn(c, tokens_for(900, 100), 4);
  REQUIRE(rig::wait(c, 30000));
  r.turn(c, tokens_for(901, 40), 4);  // the session's second turn hits its first turn's pages
  REQUIRE(rig::wait(c, 30000));
  const auto before = r.ask<metrics_snapshot>(r.rt, metrics_atom::value);
  REQUIRE(before.prefix_hit_tokens > 0);
  REQUIRE(before.pages_total * page_tokens < micro_model()->args().max_position_embeddings);
  CHECK(before.context_tokens == before.pages_total * page_tokens);
  const switch_result sw = r.ask<switch_result>(r.rt, switch_layout{"dep2"});
  REQUIRE_MESSAGE(sw.error_code < 0, sw.error_message);
  const auto after = r.ask<metrics_snapshot>(r.rt, metrics_atom::value);
  CHECK(after.steps >= before.steps);
  CHECK(after.tokens_in >= before.tokens_in);
  CHECK(after.tokens_out >= before.tokens_out);
  CHECK(after.prefix_queried_tokens >= before.prefix_queried_tokens);
  CHECK(after.prefix_hit_tokens >= before.prefix_hit_tokens);
  // two groups, each with the whole budget: a request still fits in one
  CHECK(after.pages_total == 2 * before.pages_total);
  CHECK(after.context_tokens == before.context_tokens);
}

/// The CPU model's layouts, but building `refused` throws (as a GPU layout without the device
/// memory for a second set of arenas does), and `unknown` is not offered at all.
class failing_source final : public rank_source {
 public:
  failing_source(std::string refused, std::string unknown)
      : cpu_(make_cpu_rank_source(micro_model())), refused_(std::move(refused)), unknown_(std::move(unknown)) {}
  const model_args& args() const override { return cpu_->args(); }
  const kv_layout& layout() const override { return cpu_->layout(); }
  std::string check(const layout_spec& spec) const override {
    return spec.name() == unknown_ ? "not offered by this source" : "";
  }
  layout_ranks make(const layout_spec& spec, int first, std::chrono::milliseconds timeout) override {
    if (spec.name() == refused_) throw std::runtime_error("no device memory for " + refused_);
    return cpu_->make(spec, first, timeout);
  }

 private:
  std::shared_ptr<rank_source> cpu_;
  std::string refused_, unknown_;
};

TEST_CASE("runtime: a switch whose shards cannot be built is refused and the old layout keeps serving") {
  rig r("tp2", options(), std::make_shared<failing_source>("dep2", "tp4"));
  client& running = r.open(0);
  r.turn(running, tokens_for(900, 30), 24);  // streams across both refusals
  const switch_result bad = r.ask<switch_result>(r.rt, switch_layout{"dep2"});
  CHECK(bad.error_code >= 0);
  CHECK(bad.error_message.find("no device memory for dep2") != std::string::npos);
  CHECK(bad.layout == "tp2");
  const switch_result unknown = r.ask<switch_result>(r.rt, switch_layout{"tp4"});
  CHECK(unknown.error_code >= 0);
  CHECK(unknown.error_message.find("not offered") != std::string::npos);
  const layout_status st = r.ask<layout_status>(r.rt, layout_atom::value);
  CHECK(st.layout == "tp2");
  CHECK_FALSE(st.switching);
  CHECK(st.shards.size() == 2u);
  for (const shard_status& sh : st.shards) CHECK(sh.device == "cpu");
  CHECK(st.last_fault.find("dep2") != std::string::npos);
  REQUIRE(rig::wait(running, 60000));
  CHECK(running.reasons[0] == "length");
  CHECK(running.turns[0].size() == 24u);
  // admission is open again: a new request is served in the old layout, and a good switch runs
  client& after = r.open(0);
  r.turn(after, tokens_for(901, 12), 4);
  REQUIRE(rig::wait(after, 60000));
  CHECK(after.turns[0].size() == 4u);
  const switch_result good = r.ask<switch_result>(r.rt, switch_layout{"tp1"});
  CHECK_MESSAGE(good.error_code < 0, good.error_message);
  CHECK(good.layout == "tp1");
}

TEST_CASE("runtime: a switch whose KV arenas would not fit in host memory is refused before it starts") {
  engine_options o = options();
  o.kv_budget_bytes = host_memory_bytes() / 3 + 1;  // one layout's arena fits (pages are made as they fill)
  rig r("tp1", o);
  client& running = r.open(0);
  r.turn(running, tokens_for(910, 20), 12);
  // tp2 beside tp1 while the pages move: three arenas of a third of the host each
  const switch_result bad = r.ask<switch_result>(r.rt, switch_layout{"tp2"});
  CHECK(bad.error_code == int32_t(engine_errc::kv_exhausted));
  CHECK_MESSAGE(bad.error_message.find("--kv-budget-bytes") != std::string::npos, bad.error_message);
  CHECK(bad.error_message.find("3 KV arenas") != std::string::npos);
  CHECK(bad.layout == "tp1");
  CHECK_FALSE(r.ask<layout_status>(r.rt, layout_atom::value).switching);
  REQUIRE(rig::wait(running, 60000));
  CHECK(running.reasons[0] == "length");
  // two arenas fit: tp1 -> tp1 (a rebuild in place) runs
  const switch_result good = r.ask<switch_result>(r.rt, switch_layout{"tp1"});
  CHECK_MESSAGE(good.error_code < 0, good.error_message);
}

TEST_CASE("runtime: a shard killed mid-run is replaced and every request ends within 10 s") {
  for (const std::string layout : {"tp2", "dep2"}) {
    INFO(layout);
    rig r(layout, options());
    for (int i = 0; i < 8; ++i) r.turn(r.open(0), tokens_for(500 + i, 12 + i), 24);
    // Wait for the first tokens, then crash shard 1.
    for (int streamed = 0; streamed < 8;) {
      streamed = 0;
      for (auto& c : r.clients) {
        std::lock_guard<std::mutex> lock(c->mu);
        streamed += int(c->turns[0].size());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(r.ask<status_reply>(r.rt, kill_shard{1}).error_code < 0);
    // The runtime answers throughout, and every request completes or fails with a reason.
    for (auto& c : r.clients) {
      while (!rig::wait(*c, 50)) {
        CHECK(r.ask<metrics_snapshot>(r.rt, metrics_atom::value, 1000).requests_running >= 0);
        REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
      }
      const bool completed = c->reasons[0] == "length" && c->turns[0].size() == 24u;
      const bool failed_cleanly = c->reasons[0] == "error" && !c->errors[0].empty();
      CHECK((completed || failed_cleanly));
    }
    const double ended_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const layout_status st = r.ask<layout_status>(r.rt, layout_atom::value);
    CHECK(st.layout == layout);
    CHECK(st.rebuilds == 1);
    CHECK(st.last_fault.find("shard 1") != std::string::npos);
    for (const shard_status& s : st.shards) CHECK(s.alive);
    // The rebuilt layout serves a new request.
    client& fresh = r.open(0);
    r.turn(fresh, tokens_for(900, 9), 4);
    REQUIRE(rig::wait(fresh, 10000));
    CHECK(fresh.reasons[0] == "length");
    MESSAGE(layout << ": every request ended " << ended_ms << " ms after the kill");
  }
}

}  // namespace cedar::test
