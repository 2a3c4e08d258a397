// The engine facade end to end on the actors, with the toy model: concurrent requests,
// sessions across turns (and a reconnecting client), cancellation, bad input and drain, and a
// 2,000-request churn with cancellations and preemptions that leaks nothing and loses nothing.
#include <doctest/doctest.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>

#include "actors/engine.hpp"
#include "tests/actors/toy_model.hpp"

using namespace cedar;

namespace {

/// Collects every request's batches; waits for requests to finish.
struct collector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, token_batch> last;

  token_callback callback() {
    return [this](const token_batch& b) {
      std::lock_guard<std::mutex> lock(mu);
      auto& v = tokens[b.request_id];
      v.insert(v.end(), b.ids.begin(), b.ids.end());
      if (b.finished) last[b.request_id] = b;
      cv.notify_all();
    };
  }
  bool wait(uint64_t id, int ms = 20000) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::milliseconds(ms), [&] { return last.count(id) > 0; });
  }
  std::vector<int32_t> get(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    return tokens[id];
  }
};

engine_options toy_options() {
  engine_options o;
  o.page_tokens = 16;
  o.max_num_seqs = 16;
  o.max_batched_tokens = 64;
  o.max_prefill_tokens_per_request = 24;
  o.kv_budget_bytes = 32 << 20;
  return o;
}

std::unique_ptr<engine> start_toy(engine_options o = toy_options()) {
  auto e = engine::start(std::make_unique<test::toy_model>(test::toy_args(), o.page_tokens), o);
  REQUIRE(e.ok());
  return std::move(e.value());
}

request_spec spec_of(std::vector<int32_t> prompt, int max_tokens) {
  request_spec s;
  s.prompt = std::move(prompt);
  s.max_tokens = max_tokens;
  s.ignore_eos = true;
  return s;
}

}  // namespace

TEST_CASE("engine: concurrent requests stream the same tokens as alone, and every page comes back") {
  auto eng = start_toy();
  collector c;
  std::mt19937 g(21);
  std::vector<request_spec> specs;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> p(g() % 60 + 1);
    for (auto& t : p) t = int32_t(2 + g() % 60);
    specs.push_back(spec_of(p, int(g() % 20 + 1)));
    ids.push_back(eng->submit(specs.back(), c.callback()).value());
  }
  for (auto id : ids) REQUIRE(c.wait(id));
  for (std::size_t i = 0; i < specs.size(); ++i) {
    collector alone;
    const uint64_t id = eng->submit(specs[i], alone.callback()).value();
    REQUIRE(alone.wait(id));
    CHECK(alone.get(id) == c.get(ids[i]));
    CHECK(c.last[ids[i]].finish_reason == "length");
    CHECK(c.last[ids[i]].usage.completion_tokens == specs[i].max_tokens);
  }
  const metrics_snapshot m = eng->metrics();
  CHECK(m.requests_running == 0);
  CHECK(m.pages_used == 0);
  CHECK(m.ring_slots_used == 0);
  CHECK(m.tokens_out > 0);
  CHECK(m.ttft_ms.size() == 32);
}

TEST_CASE("engine: a session keeps its history; a follow-up sends only new tokens and hits the cache") {
  auto eng = start_toy();
  const uint64_t sid = eng->open_session().value();
  collector c;
  std::vector<int32_t> turn1(70);
  for (int i = 0; i < 70; ++i) turn1[i] = 2 + i % 40;
  request_spec s = spec_of(turn1, 6);
  s.session_id = sid;
  const uint64_t r1 = eng->submit(s, c.callback()).value();
  REQUIRE(c.wait(r1));
  CHECK(eng->lookup_session(sid).value().history_tokens == 76);
  // The client goes away and comes back: same session id, a new callback.
  collector c2;
  request_spec s2 = spec_of({7, 8, 9, 10, 11}, 4);
  s2.session_id = sid;
  const uint64_t r2 = eng->submit(s2, c2.callback()).value();
  REQUIRE(c2.wait(r2));
  const token_batch& last = c2.last[r2];
  CHECK(last.usage.prompt_tokens == 81);
  CHECK(last.usage.cached_prompt_tokens == (76 - 1) / 16 * 16);  // turn 1 computed 75 positions: 4 full pages
  CHECK(eng->lookup_session(sid).value().history_tokens == 85);
  // The same conversation sent whole, without a session and without the cache, agrees.
  std::vector<int32_t> whole = turn1;
  auto t1 = c.get(r1);
  whole.insert(whole.end(), t1.begin(), t1.end());
  whole.insert(whole.end(), {7, 8, 9, 10, 11});
  engine_options cold = toy_options();
  cold.prefix_cache = false;
  auto eng_cold = start_toy(cold);
  collector c3;
  const uint64_t r3 = eng_cold->submit(spec_of(whole, 4), c3.callback()).value();
  REQUIRE(c3.wait(r3));
  CHECK(c3.get(r3) == c2.get(r2));
  CHECK(eng->close_session(sid).ok());
  CHECK(eng->lookup_session(sid).error().code == engine_errc::unknown_session);
  CHECK(eng->submit(s2, c2.callback()).error().code == engine_errc::unknown_session);
}

TEST_CASE("engine: a turn refused because its session is busy leaves the running turn's stream alone") {
  auto eng = start_toy();
  const uint64_t sid = eng->open_session().value();
  collector running, refused;
  request_spec first = spec_of({3, 4, 5}, 100000);
  first.session_id = sid;
  const uint64_t id = eng->submit(first, running.callback()).value();
  while (running.get(id).size() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  request_spec second = spec_of({7, 8}, 4);
  second.session_id = sid;
  const auto busy = eng->submit(second, refused.callback());
  REQUIRE(!busy.ok());
  CHECK(busy.error().code == engine_errc::session_busy);
  // the running turn's batches, its last included, still reach its own caller
  const std::size_t before = running.get(id).size();
  CHECK(eng->cancel(id).ok());
  REQUIRE(running.wait(id, 5000));
  CHECK(running.last[id].finish_reason == "cancelled");
  CHECK(running.get(id).size() >= before);
  std::lock_guard<std::mutex> lock(refused.mu);
  CHECK(refused.tokens.empty());
}

TEST_CASE("engine: closing a session mid-turn cancels the turn, and its caller still gets the final batch") {
  auto eng = start_toy();
  const uint64_t sid = eng->open_session().value();
  collector c;
  request_spec s = spec_of({3, 4, 5}, 100000);
  s.session_id = sid;
  const uint64_t id = eng->submit(s, c.callback()).value();
  while (c.get(id).size() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(eng->close_session(sid).ok());
  REQUIRE(c.wait(id, 5000));
  CHECK(c.last[id].finish_reason == "cancelled");
  const metrics_snapshot m = eng->metrics();
  CHECK(m.requests_running == 0);
  CHECK(m.pages_used == 0);
  CHECK(m.ring_slots_used == 0);
}

TEST_CASE("engine: cancellation, bad input and drain answer clearly and leave the runtime working") {
  auto eng = start_toy();
  collector c;
  const uint64_t long_id = eng->submit(spec_of({3, 4, 5}, 100000), c.callback()).value();
  while (c.get(long_id).size() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(eng->cancel(long_id).ok());
  REQUIRE(c.wait(long_id));
  CHECK(c.last[long_id].finish_reason == "cancelled");
  CHECK(eng->cancel(long_id).error().code == engine_errc::unknown_request);

  auto bad = eng->submit(spec_of({3, 4}, 0), c.callback());
  REQUIRE(!bad.ok());
  CHECK(bad.error().code == engine_errc::bad_params);
  CHECK(!bad.error().message.empty());
  CHECK(eng->submit(spec_of({3, 4}, -1), c.callback()).error().code == engine_errc::bad_params);
  std::vector<int32_t> huge(1 << 21, 3);
  const auto too_long = eng->submit(spec_of(huge, 4), c.callback());
  REQUIRE(!too_long.ok());
  CHECK((too_long.error().code == engine_errc::prompt_too_long || too_long.error().code == engine_errc::kv_exhausted));
  request_spec in_session = spec_of({3}, 2);
  in_session.session_id = 999;
  CHECK(eng->submit(in_session, c.callback()).error().code == engine_errc::unknown_session);
  CHECK(eng->close_session(999).error().code == engine_errc::unknown_session);

  const uint64_t ok_id = eng->submit(spec_of({3, 4, 5}, 5), c.callback()).value();
  REQUIRE(c.wait(ok_id));
  CHECK(c.get(ok_id).size() == 5);
  CHECK(eng->healthy());
  CHECK(eng->ready());
  const uint64_t tail = eng->submit(spec_of({6, 7}, 40), c.callback()).value();
  CHECK(eng->drain(20000).ok());
  CHECK(c.wait(tail, 1000));
  CHECK(!eng->ready());
  CHECK(eng->submit(spec_of({3}, 2), c.callback()).error().code == engine_errc::draining);
  const metrics_snapshot m = eng->metrics();
  CHECK(m.pages_used == 0);
  CHECK(m.ring_slots_used == 0);
}

namespace {

/// The toy model, failing any forward call that runs token 63.
class failing_model final : public step_model {
 public:
  failing_model() : inner_(test::toy_args(), 16) {}
  const model_args& args() const override { return inner_.args(); }
  const kv_layout& layout() const override { return inner_.layout(); }
  void forward(std::span<forward_item> batch, std::vector<float>& logits) override {
    for (auto& it : batch)
      for (int32_t t : it.tokens)
        if (t == 63) throw std::runtime_error("device fault");
    inner_.forward(batch, logits);
  }

 private:
  test::toy_model inner_;
};

}  // namespace

TEST_CASE("engine: a failed step ends its requests with an error and the runtime keeps serving") {
  auto eng = engine::start(std::make_unique<failing_model>(), toy_options()).value();
  collector c;
  const uint64_t bad = eng->submit(spec_of({3, 63, 4}, 5), c.callback()).value();
  REQUIRE(c.wait(bad));
  CHECK(c.last[bad].finish_reason == "error");
  CHECK(c.last[bad].error.find("device fault") != std::string::npos);
  const uint64_t good = eng->submit(spec_of({3, 4, 5}, 5), c.callback()).value();
  REQUIRE(c.wait(good));
  CHECK(c.last[good].finish_reason == "length");
  const metrics_snapshot m = eng->metrics();
  CHECK(m.pages_used == 0);
  CHECK(m.ring_slots_used == 0);
}

namespace {

/// The toy model taking about a millisecond per step, so that cancels sent on seeing a
/// request's tokens land while it still runs.
class paced_model final : public step_model {
 public:
  explicit paced_model(int page_tokens) : inner_(test::toy_args(), page_tokens) {}
  const model_args& args() const override { return inner_.args(); }
  const kv_layout& layout() const override { return inner_.layout(); }
  void forward(std::span<forward_item> batch, std::vector<float>& logits) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    inner_.forward(batch, logits);
  }

 private:
  test::toy_model inner_;
};

}  // namespace

TEST_CASE("engine: 2,000 requests through the actors, 20% cancelled mid-stream, KV pressure: no leaks, no loss") {
  engine_options o = toy_options();
  o.swa_replay = swa_replay_mode::full;  // resumed requests rebuild their rings exactly
  o.max_num_seqs = 32;
  o.max_batched_tokens = 128;
  const auto layout = kv_layout::make(test::toy_args(), kv_dtype::fp4, o.page_tokens);
  // 32 ring slots but 40 pages: a prompt of up to 60 tokens plus 20 generated needs up to 5.
  o.kv_budget_bytes = int64_t(32 * (layout.ring_bytes() + layout.tail_floats() * 4) + 40 * layout.page_bytes);
  auto eng = engine::start(std::make_unique<paced_model>(o.page_tokens), o).value();
  collector c;
  std::mt19937 g(31);
  const int num_requests = 2000;
  std::map<uint64_t, request_spec> specs;
  std::map<uint64_t, std::size_t> cancel_after;  // cancel once this many tokens arrived (0: before the first)
  int submitted = 0, cancels_sent = 0;
  for (;;) {
    std::size_t finished = 0;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      finished = c.last.size();
    }
    if (finished == std::size_t(num_requests)) break;
    while (submitted < num_requests && submitted - int(finished) < 96) {
      std::vector<int32_t> p(g() % 60 + 1);
      for (auto& t : p) t = int32_t(2 + g() % 60);
      request_spec s = spec_of(p, int(g() % 20 + 1));
      if (g() % 2) s.sampling.temperature = 0.8f, s.sampling.top_p = 0.9f, s.sampling.seed = g();
      const uint64_t id = eng->submit(s, c.callback()).value();
      if (g() % 5 == 0) cancel_after[id] = g() % uint32_t(s.max_tokens);
      specs[id] = std::move(s);
      ++submitted;
    }
    std::vector<uint64_t> to_cancel;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      for (auto it = cancel_after.begin(); it != cancel_after.end();) {
        if (c.last.count(it->first)) it = cancel_after.erase(it);
        else if (c.tokens[it->first].size() >= it->second) to_cancel.push_back(it->first), it = cancel_after.erase(it);
        else ++it;
      }
    }
    for (uint64_t id : to_cancel) cancels_sent += eng->cancel(id).ok();  // may have finished meanwhile: fine
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const metrics_snapshot m = eng->metrics();
  CHECK(m.preemptions > 0);
  CHECK(m.requests_running == 0);
  CHECK(m.requests_waiting == 0);
  CHECK(m.pages_used == 0);
  CHECK(m.ring_slots_used == 0);
  CHECK(m.pages_free + m.pages_cached_idle == m.pages_total);
  int completed = 0, cancelled = 0;
  for (auto& [id, s] : specs) {
    const std::vector<int32_t> want = test::toy_alone(s, o.page_tokens);
    const std::vector<int32_t> got = c.get(id);
    if (c.last[id].finish_reason == "cancelled") {
      ++cancelled;
      REQUIRE(got.size() < want.size());
      CHECK(std::equal(got.begin(), got.end(), want.begin()));  // what streamed before the cancel was right
      continue;
    }
    ++completed;
    CHECK(c.last[id].finish_reason == "length");
    CHECK(got == want);
  }
  MESSAGE("2,000 requests through the engine: ", completed, " completed, ", cancelled, " cancelled (", cancels_sent,
          " cancels accepted), ", m.preemptions, " preemptions, ", m.steps, " steps");
  CHECK(completed + cancelled == num_requests);
  CHECK(cancelled <= cancels_sent);
  CHECK(cancelled >= num_requests / 10);
}
