// Layouts through the engine facade (what the server's admin routes call): an engine started
// on the V4.1 model (micro, random weights) in tp2 switches to dep2 while requests stream,
// reports its layout and shards, and keeps serving after a shard is killed.
#include <doctest/doctest.h>

#include <condition_variable>
#include <future>
#include <map>
#include <mutex>

#include "actors/engine.hpp"
#include "config/model_config.hpp"
#include "kernels/model/random_weights.hpp"

using namespace cedar;

namespace {

struct streams {
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
  bool wait(uint64_t id) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return reason.count(id) > 0; });
  }
};

std::vector<uint64_t> submit_some(engine& e, streams& s, int n, int seed) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < n; ++i) {
    request_spec spec;
    for (int k = 0; k < 10 + i; ++k) spec.prompt.push_back(3 + (seed * 131 + i * 17 + k * 7) % 5000);
    spec.max_tokens = 12;
    spec.ignore_eos = true;
    auto id = e.submit(spec, s.callback());
    REQUIRE(id.ok());
    ids.push_back(id.value());
  }
  return ids;
}

}  // namespace

TEST_CASE("engine: switch_layout, layout_info and kill_shard on the V4.1 model") {
  std::string error;
  const auto args = load_model_args("micro", &error);
  REQUIRE(args.has_value());
  engine_options o;
  o.page_tokens = 16;
  o.kv_budget_bytes = int64_t(32) << 20;
  o.layout = "tp2";
  auto started = engine::start(*args, std::make_shared<tensor_map>(make_random_weights(*args, 5)), o);
  REQUIRE(started.ok());
  engine& e = *started.value();
  CHECK(e.layout_info().value().layout == "tp2");

  streams s;
  const auto ids = submit_some(e, s, 6, 1);
  std::promise<outcome<switch_result>> done;
  e.switch_layout("dep2", [&](outcome<switch_result> r) { done.set_value(std::move(r)); });
  const outcome<switch_result> r = done.get_future().get();
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(r.value().layout == "dep2");
  for (uint64_t id : ids) {
    REQUIRE(s.wait(id));
    CHECK(s.reason[id] == "length");
    CHECK(s.tokens[id].size() == 12u);
  }
  const layout_status st = e.layout_info().value();
  CHECK(st.layout == "dep2");
  CHECK(st.shards.size() == 2u);
  CHECK(st.switches == 1);

  std::promise<outcome<switch_result>> bad;
  e.switch_layout("tp3", [&](outcome<switch_result> r) { bad.set_value(std::move(r)); });
  CHECK_FALSE(bad.get_future().get().ok());  // micro's 4 heads do not split 3 ways

  REQUIRE(e.kill_shard(1).ok());
  CHECK(e.healthy());
  const auto after = submit_some(e, s, 2, 2);
  for (uint64_t id : after) {
    REQUIRE(s.wait(id));
    CHECK(s.reason[id] == "length");
  }
  CHECK(e.layout_info().value().rebuilds == 1);
}
