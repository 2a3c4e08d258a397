// The runtime on the real V4.1 model (preset `tiny`, random weights): batching never changes
// a request's tokens, and after a churn of requests with cancellations and preemptions every
// page and ring slot is free again and each completed request got its stand-alone tokens.
#include <doctest/doctest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <random>

#include "actors/engine.hpp"
#include "actors/shard.hpp"
#include "config/model_config.hpp"
#include "kernels/model/random_weights.hpp"

using namespace cedar;

namespace {

std::shared_ptr<const model> tiny_model() {
  static std::shared_ptr<const model> m = [] {
    std::string error;
    auto args = load_model_args("tiny", &error);
    REQUIRE_MESSAGE(args, error);
    auto w = std::make_shared<tensor_map>(make_random_weights(*args, 1));
    return std::make_shared<const model>(*args, w, kv_dtype::fp4);
  }();
  return m;
}

struct sink {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, std::string> reason;
  token_callback callback() {
    return [this](const token_batch& b) {
      std::lock_guard<std::mutex> lock(mu);
      auto& v = tokens[b.request_id];
      v.insert(v.end(), b.ids.begin(), b.ids.end());
      if (b.finished) reason[b.request_id] = b.finish_reason;
      cv.notify_all();
    };
  }
  void wait_all(const std::vector<uint64_t>& ids) {
    std::unique_lock<std::mutex> lock(mu);
    for (uint64_t id : ids)
      REQUIRE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return reason.count(id) > 0; }));
  }
  std::size_t count(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    return tokens[id].size();
  }
};

request_spec random_spec(std::mt19937& g, int max_prompt, int max_new) {
  request_spec s;
  s.prompt.resize(1 + g() % max_prompt);
  for (auto& t : s.prompt) t = int32_t(3 + g() % 1000);
  s.max_tokens = 1 + int(g() % max_new);
  s.ignore_eos = true;
  return s;
}

std::vector<int32_t> alone(engine& e, const request_spec& s) {
  sink k;
  const uint64_t id = e.submit(s, k.callback()).value();
  k.wait_all({id});
  return k.tokens[id];
}

}  // namespace

TEST_CASE("runtime on tiny: 64 concurrent greedy requests give exactly the tokens each gives alone") {
  engine_options o;
  o.max_num_seqs = 64;
  o.max_batched_tokens = 256;
  o.max_prefill_tokens_per_request = 32;
  o.kv_budget_bytes = 64 << 20;
  auto eng = engine::start(wrap_model(tiny_model()), o).value();
  std::mt19937 g(17);
  std::vector<request_spec> specs;
  std::vector<uint64_t> ids;
  sink k;
  for (int i = 0; i < 64; ++i) {
    specs.push_back(random_spec(g, 48, 6));
    ids.push_back(eng->submit(specs.back(), k.callback()).value());
  }
  k.wait_all(ids);
  for (std::size_t i = 0; i < ids.size(); ++i) CHECK(k.tokens[ids[i]] == alone(*eng, specs[i]));
  const metrics_snapshot m = eng->metrics();
  CHECK(m.pages_used == 0);
  CHECK(m.ring_slots_used == 0);
}

TEST_CASE("runtime on tiny: churn with 20% cancelled and KV pressure leaks nothing and loses nothing") {
  engine_options o;
  o.max_num_seqs = 8;
  o.max_batched_tokens = 192;
  o.max_prefill_tokens_per_request = 64;
  o.swa_replay = swa_replay_mode::full;  // resumed requests rebuild their rings exactly
  const kv_layout& layout = tiny_model()->layout();
  const int64_t slot = int64_t(layout.ring_bytes() + layout.tail_floats() * sizeof(float));
  // 1,536 token positions of pages for 8 running requests (a request takes up to 612)
  o.kv_budget_bytes = 8 * slot + (1536 / layout.page_tokens) * int64_t(layout.page_bytes);
  auto eng = engine::start(wrap_model(tiny_model()), o).value();
  std::mt19937 g(23);
  const int num_requests = 120;
  sink k;
  std::vector<uint64_t> ids;
  std::map<uint64_t, request_spec> specs;
  std::map<uint64_t, std::size_t> cancel_after;
  for (int i = 0; i < num_requests; ++i) {
    request_spec s = random_spec(g, i % 6 == 0 ? 600 : 120, 12);
    const uint64_t id = eng->submit(s, k.callback()).value();
    ids.push_back(id);
    specs[id] = s;
    if (g() % 5 == 0) cancel_after[id] = g() % 4;
  }
  for (bool pending = true; pending;) {
    pending = false;
    for (auto& [id, n] : cancel_after) {
      if (n == SIZE_MAX) continue;
      pending = true;
      if (k.count(id) >= n) eng->cancel(id), n = SIZE_MAX;  // may already have finished: fine
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  k.wait_all(ids);
  const metrics_snapshot m = eng->metrics();
  CHECK(m.preemptions > 0);
  CHECK(m.pages_used == 0);
  CHECK(m.ring_slots_used == 0);
  CHECK(m.pages_free + m.pages_cached_idle == m.pages_total);
  int completed = 0, checked = 0;
  for (uint64_t id : ids) {
    if (k.reason[id] == "cancelled") continue;
    ++completed;
    CHECK(k.reason[id] == "length");
    if (id % 3 != 0) continue;
    CHECK(k.tokens[id] == alone(*eng, specs[id]));
    ++checked;
  }
  MESSAGE("completed ", completed, " of ", num_requests, ", ", checked, " re-run alone, preemptions ",
          m.preemptions);
  CHECK(completed >= num_requests / 2);
}
