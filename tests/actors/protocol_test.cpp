// Every runtime message is registered and survives CAF's binary serialization (what the
// middleman does to carry it to a remote shard or scheduler), field for field.
#include <doctest/doctest.h>

#include "actors/protocol.hpp"

using namespace cedar;

namespace {

template <class T>
T round_trip(caf::actor_system& sys, T x) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE(!sink(x));
  T y;
  caf::binary_deserializer source{sys, buf};
  REQUIRE(!source(y));
  return y;
}

}  // namespace

TEST_CASE("protocol: run_step, step_output, token_batch and the control messages round-trip") {
  caf::actor_system_config cfg;
  register_messages(cfg);
  caf::actor_system sys{cfg};

  run_step step{7, {}};
  step_item it;
  it.request_id = 3, it.tokens = {5, 6, 7, 8}, it.start_pos = 2, it.page_ids = {11, 4}, it.ring_slot = 9;
  it.replay = true, it.truncate_below = 120, it.sample = true, it.token_idx = 42;
  it.sampling.temperature = 0.5f, it.sampling.top_k = 3, it.sampling.top_p = 0.9f, it.sampling.seed = 99;
  it.sampling.logprobs = 2;
  step.items = {it, it};
  step.items[1].request_id = 4;
  const run_step s2 = round_trip(sys, step);
  CHECK(s2.step_id == 7);
  REQUIRE(s2.items.size() == 2);
  const step_item& a = s2.items[0];
  CHECK((a.request_id == 3 && a.tokens == it.tokens && a.start_pos == 2 && a.page_ids == it.page_ids));
  CHECK((a.ring_slot == 9 && a.replay && a.truncate_below == 120 && a.sample && a.token_idx == 42));
  CHECK((a.sampling.temperature == 0.5f && a.sampling.top_k == 3 && a.sampling.top_p == 0.9f));
  CHECK((a.sampling.seed == 99 && a.sampling.logprobs == 2));
  CHECK(s2.items[1].request_id == 4);

  step_output out{7, {}, "boom"};
  item_result r;
  r.request_id = 3, r.has_token = true, r.token.token_id = 17, r.token.logprob = -0.25f;
  r.token.top_ids = {17, 2}, r.token.top_logprobs = {-0.25f, -2.f};
  out.results = {r};
  const step_output o2 = round_trip(sys, out);
  CHECK((o2.step_id == 7 && o2.error == "boom" && o2.results.size() == 1));
  CHECK((o2.results[0].token.token_id == 17 && o2.results[0].token.top_ids == r.token.top_ids));

  token_batch b;
  b.request_id = 5, b.session_id = 6, b.ids = {1, 2}, b.logprobs = {-1.f, -2.f}, b.top_ids = {{1}, {2}};
  b.top_logprobs = {{-1.f}, {-2.f}}, b.finished = true, b.finish_reason = "stop";
  b.usage = {10, 8, 2};
  const token_batch b2 = round_trip(sys, b);
  CHECK((b2.ids == b.ids && b2.top_ids == b.top_ids && b2.finish_reason == "stop" && b2.finished));
  CHECK((b2.usage.prompt_tokens == 10 && b2.usage.cached_prompt_tokens == 8 && b2.usage.completion_tokens == 2));

  submit_request sr;
  sr.spec.session_id = 2, sr.spec.prompt = {9, 9}, sr.spec.max_tokens = 5, sr.spec.stop_ids = {3};
  const submit_request sr2 = round_trip(sys, sr);
  CHECK((sr2.spec.prompt == sr.spec.prompt && sr2.spec.max_tokens == 5 && sr2.spec.stop_ids == sr.spec.stop_ids));
  metrics_snapshot m;
  m.pages_total = 12, m.ttft_ms = {1.5, 2.5};
  CHECK(round_trip(sys, m).ttft_ms == m.ttft_ms);
  CHECK(round_trip(sys, submit_reply{4, 2, "x"}).error_message == "x");
  CHECK(round_trip(sys, session_info{3, 100, 0}).history_tokens == 100);
  // Registered under their names, so a remote node can deserialize them.
  CHECK(sys.types().portable_name(0, &typeid(run_step)) == "cedar::run_step");
  CHECK(sys.types().portable_name(0, &typeid(token_batch)) == "cedar::token_batch");
}
