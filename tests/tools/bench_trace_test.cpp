// Weka trace reading, scaling and the theoretical prefix reuse, on hand-written traces and on the
// 48-trace sample in shared/data/agent-traces (checked against the totals each file carries).
#include <doctest/doctest.h>
#include <simdjson.h>

#include <cmath>
#include <filesystem>

#include "tools/bench/trace.hpp"

using namespace cedar::bench;

namespace {

const char* kTrace = R"({
  "id": "t1", "block_size": 64, "tool_tokens": 100, "system_tokens": 28,
  "requests": [
    {"t": 0.0, "type": "n", "in": 200, "out": 10, "hash_ids": [1, 2, 3], "think_time": 0.0},
    {"t": 5.0, "type": "s", "in": 270, "out": 20, "hash_ids": [1, 2, 3, 4]},
    {"t": 9.0, "type": "subagent", "agent_id": "agent_001", "subagent_type": "Explore",
     "status": "completed", "requests": [
       {"t": 0.0, "type": "n", "in": 130, "out": 5, "hash_ids": [10, 11], "think_time": 0},
       {"t": 2.0, "type": "n", "in": 140, "out": 5, "hash_ids": [10, 11], "think_time": 1.5}]},
    {"t": 9.0, "type": "subagent", "agent_id": "agent_002", "status": "async_launched",
     "duration_ms": null, "requests": [
       {"t": 0.0, "type": "n", "in": 70, "out": 5, "hash_ids": [10]}]},
    {"t": 20.0, "type": "n", "in": 300, "out": 30, "hash_ids": [1, 2, 3, 4], "think_time": 7.0}
  ]})";

}  // namespace

TEST_CASE("a Weka trace parses into main requests and subagents placed after their parent turn") {
  session_trace t;
  std::string error;
  REQUIRE(parse_trace(kTrace, t, error));
  CHECK(t.id == "t1");
  CHECK(t.system_tokens == 128);
  REQUIRE(t.requests.size() == 3);
  CHECK(t.requests[1].num_input_tokens == 270);
  CHECK(t.requests[1].think_time_s == 0);  // missing think_time reads as none
  CHECK(t.requests[2].think_time_s == 7.0);
  CHECK(t.requests[2].hash_ids == std::vector<int64_t>{1, 2, 3, 4});
  REQUIRE(t.subagents.size() == 2);
  CHECK(t.subagents[0].after_request_idx == 1);
  CHECK_FALSE(t.subagents[0].background);
  CHECK(t.subagents[0].type == "Explore");
  CHECK(t.subagents[0].requests.size() == 2);
  CHECK(t.subagents[0].requests[1].think_time_s == 1.5);
  CHECK(t.subagents[1].background);
}

TEST_CASE("broken traces are reported, not accepted") {
  session_trace t;
  std::string error;
  CHECK_FALSE(parse_trace("[1,2]", t, error));
  CHECK_FALSE(parse_trace(R"({"requests":[{"t":0,"in":5}]})", t, error));
  CHECK_FALSE(parse_trace(R"({"requests":[]})", t, error));
  CHECK_FALSE(error.empty());
}

TEST_CASE("theoretical prefix reuse counts blocks seen earlier, subagents included") {
  session_trace t;
  std::string error;
  REQUIRE(parse_trace(kTrace, t, error));
  // Order: main[0] {1,2,3}, main[1] {1,2,3,4}, agent_001 {10,11} {10,11}, agent_002 {10},
  // main[2] {1,2,3,4}: 3 + 2 + 1 + 4 reused of 3 + 4 + 2 + 2 + 1 + 4 blocks.
  CHECK(theoretical_prefix_reuse(t) == doctest::Approx(10.0 / 16.0));
}

TEST_CASE("scaling keeps prefix chains and the one-id-per-full-block rule") {
  session_trace t;
  std::string error;
  REQUIRE(parse_trace(kTrace, t, error));
  session_trace original = t;
  scale_trace(t, 0.5);
  for (size_t i = 0; i < t.requests.size(); ++i) {
    const auto& r = t.requests[i];
    CHECK(r.num_input_tokens == std::llround(original.requests[i].num_input_tokens * 0.5));
    CHECK(r.num_output_tokens >= 1);
    CHECK(int64_t(r.hash_ids.size()) == std::min<int64_t>(r.num_input_tokens / 64,
                                                         original.requests[i].hash_ids.size()));
    CHECK(std::equal(r.hash_ids.begin(), r.hash_ids.end(), original.requests[i].hash_ids.begin()));
  }
}

TEST_CASE("a context cap ends the session before the first request over it") {
  session_trace t;
  std::string error;
  REQUIRE(parse_trace(kTrace, t, error));
  cap_context(t, 300);  // main[2] needs 330
  CHECK(t.requests.size() == 2);
  CHECK(t.subagents.size() == 2);  // launched after main[1], which stays
  cap_context(t, 250);  // main[1] needs 290
  CHECK(t.requests.size() == 1);
  CHECK(t.subagents.empty());
}

TEST_CASE("the shared trace sample reads whole and agrees with each file's own totals") {
  std::string dir = "/work/shared/data/agent-traces";
  if (!std::filesystem::exists(dir)) return;
  std::vector<session_trace> traces;
  std::string error;
  REQUIRE_MESSAGE(read_traces(dir, traces, error), error);
  CHECK(traces.size() == 48);
  int num_with_subagents = 0;
  simdjson::dom::parser parser;
  for (auto& t : traces) {
    num_with_subagents += !t.subagents.empty();
    int64_t sum_in = 0, sum_out = 0;
    for (auto& r : t.requests) {
      sum_in += r.num_input_tokens;
      sum_out += r.num_output_tokens;
      CHECK(int64_t(r.hash_ids.size()) == r.num_input_tokens / t.block_size);
    }
    simdjson::dom::element root;
    REQUIRE(!parser.load(dir + "/" + t.id + ".json").get(root));
    int64_t in = 0, out = 0;
    if (!root["totals"]["parent_tokens"]["input"].get_int64().get(in) &&
        !root["totals"]["parent_tokens"]["output"].get_int64().get(out)) {
      CHECK(sum_in == in);
      CHECK(sum_out == out);
    }
  }
  CHECK(num_with_subagents == 2);  // README: 2 sessions with subagents
}
