// Request bodies, SSE framing, stream events, and the replayed conversation's prefix property.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <random>

#include "tools/bench/client.hpp"
#include "tools/bench/conversation.hpp"
#include "tools/bench/filler.hpp"
#include "tools/bench/protocol.hpp"
#include "tools/bench/synth.hpp"

using namespace cedar::bench;

TEST_CASE("SSE events come out the same however the bytes are split") {
  std::string stream =
      ": comment\n\ndata: {\"a\":1}\n\nevent: x\r\ndata: {\"b\":\r\ndata: 2}\r\n\r\ndata: [DONE]\n\n";
  std::vector<std::string> whole = sse_parser().feed(stream);
  REQUIRE(whole == std::vector<std::string>{"{\"a\":1}", "{\"b\":\n2}", "[DONE]"});
  std::mt19937 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    sse_parser p;
    std::vector<std::string> got;
    for (size_t at = 0; at < stream.size();) {
      size_t n = 1 + rng() % 9;
      for (auto& e : p.feed(std::string_view(stream).substr(at, n))) got.push_back(e);
      at += n;
    }
    CHECK(got == whole);
  }
}

TEST_CASE("chat chunks: content, reasoning, usage (present, null or absent), [DONE], errors") {
  stream_event e;
  REQUIRE(parse_chat_event(R"({"choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null})", e));
  CHECK(e.has_tokens);
  CHECK(e.text == "hi");
  CHECK_FALSE(e.num_output_tokens);
  REQUIRE(parse_chat_event(R"({"choices":[{"delta":{"reasoning_content":"hm"}}]})", e));
  CHECK(e.has_tokens);
  CHECK(e.text.empty());
  REQUIRE(parse_chat_event(
      R"({"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":64}}})",
      e));
  CHECK_FALSE(e.has_tokens);
  CHECK(*e.num_prompt_tokens == 100);
  CHECK(*e.num_output_tokens == 7);
  CHECK(*e.num_cached_tokens == 64);
  REQUIRE(parse_chat_event("[DONE]", e));
  CHECK(e.done);
  REQUIRE(parse_chat_event(R"({"error":{"message":"too long"}})", e));
  CHECK(e.error == "too long");
  CHECK_FALSE(parse_chat_event("{not json", e));
}

TEST_CASE("Responses events: id, text deltas, completion with usage, failure") {
  stream_event e;
  REQUIRE(parse_responses_event(R"({"type":"response.created","response":{"id":"resp_1"}})", e));
  CHECK(e.response_id == "resp_1");
  REQUIRE(parse_responses_event(R"({"type":"response.output_text.delta","delta":"ab"})", e));
  CHECK(e.has_tokens);
  CHECK(e.text == "ab");
  REQUIRE(parse_responses_event(
      R"({"type":"response.completed","response":{"id":"resp_1","usage":{"input_tokens":9,"output_tokens":3,"input_tokens_details":{"cached_tokens":0}}}})",
      e));
  CHECK(e.done);
  CHECK(*e.num_output_tokens == 3);
  REQUIRE(parse_responses_event(R"({"type":"response.completed","response":{"id":"r"}})", e));
  CHECK(e.done);
  CHECK_FALSE(e.num_output_tokens);  // a server that omits usage
  REQUIRE(parse_responses_event(R"({"type":"error","error":{"message":"bad"}})", e));
  CHECK(e.error == "bad");
}

TEST_CASE("request bodies are JSON with the fields a server expects") {
  std::vector<message> msgs = {{"system", "a \"quoted\"\n\\ \x01", 3}, {"user", "b", 1},
                               {"assistant", "c", 1}, {"user", "d", 1}};
  simdjson::dom::parser parser;
  simdjson::dom::element chat;
  REQUIRE(!parser.parse(chat_body("m", msgs, 17)).get(chat));
  CHECK(std::string_view(chat["model"]) == "m");
  CHECK(int64_t(chat["max_tokens"]) == 17);
  CHECK(bool(chat["stream"]));
  CHECK(bool(chat["stream_options"]["include_usage"]));
  CHECK(simdjson::dom::array(chat["messages"]).size() == 4);
  CHECK(std::string_view(chat["messages"].at(0)["content"]) == "a \"quoted\"\n\\ \x01");

  simdjson::dom::element resp;
  REQUIRE(!parser.parse(responses_body("m", msgs, 3, "resp_9", 5, false)).get(resp));
  CHECK(simdjson::dom::array(resp["input"]).size() == 1);
  CHECK(std::string_view(resp["previous_response_id"]) == "resp_9");
  CHECK(bool(resp["stream"]));
  simdjson::dom::element ws;
  REQUIRE(!parser.parse(responses_body("m", msgs, 0, "", 5, true)).get(ws));
  CHECK(std::string_view(ws["type"]) == "response.create");
  CHECK(ws["stream"].error() == simdjson::NO_SUCH_FIELD);
  CHECK(ws["previous_response_id"].error() == simdjson::NO_SUCH_FIELD);
  CHECK(simdjson::dom::array(ws["input"]).size() == 4);
}

namespace {
std::string prompt_text(const conversation& c) {
  std::string s;
  for (auto& m : c.messages()) s += m.role + ":" + m.content + "|";
  return s;
}
}  // namespace

TEST_CASE("a replayed conversation only ever appends, and its size follows the trace") {
  synth_params p;
  p.pullback_prob = 0;
  session_trace t = synthesize_session(p, 77);
  scale_trace(t, 0.05);
  conversation conv(session_marker(1), hash_string(t.id), t.system_tokens);
  std::string before;
  for (size_t i = 0; i < t.requests.size(); ++i) {
    turn_input in = conv.next_turn(t.requests[i]);
    CHECK(in.rewritten == (i == 0));
    std::string now = prompt_text(conv);
    CHECK(now.compare(0, before.size(), before) == 0);
    // The prompt's words match the trace's input size (a reply shorter than recorded only
    // makes the prompt shorter).
    int64_t words = 0;
    for (auto& m : conv.messages()) words += count_words(m.content);
    CHECK(double(words) == doctest::Approx(double(t.requests[i].num_input_tokens)).epsilon(0.02));
    std::string reply;
    append_words(reply, i, t.requests[i].num_output_tokens);
    conv.add_reply(reply, t.requests[i].num_output_tokens);
    before = prompt_text(conv);
  }
  CHECK(conv.messages().front().content.rfind("[rid:", 0) == 0);
}

TEST_CASE("sessions share prompt text only where their hash ids and markers agree") {
  trace_request first{0, 64 * 10 + 5, 4, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0};
  trace_request other = first;
  other.hash_ids = {1, 2, 3, 4, 5, 6, 70, 80, 90, 100};
  conversation a("[rid:a]", 1, 0), b("[rid:a]", 1, 0), c("[rid:c]", 1, 0);
  a.next_turn(first);
  b.next_turn(other);
  c.next_turn(first);
  const std::string& ta = a.messages()[0].content;
  const std::string& tb = b.messages()[0].content;
  size_t common = 0;
  while (common < ta.size() && ta[common] == tb[common]) ++common;
  CHECK(count_words(ta.substr(0, common)) >= 6 * kWordsPerBlock);
  CHECK(count_words(ta.substr(0, common)) < 7 * kWordsPerBlock + 1);
  CHECK(c.messages()[0].content.substr(7) != ta.substr(7, c.messages()[0].content.size() - 7));
  CHECK(c.messages()[0].content.substr(0, 7) != ta.substr(0, 7));
}

TEST_CASE("a pull-back rebuilds the history") {
  trace_request r0{0, 64 * 20, 4, {}, 0}, r1 = r0;
  for (int i = 0; i < 20; ++i) r0.hash_ids.push_back(i + 1);
  r1.hash_ids = {1, 2, 3, 4, 5, 50, 51, 52};
  r1.num_input_tokens = 64 * 8 + 10;
  conversation conv("[rid:x]", 1, 64 * 2);
  CHECK(conv.next_turn(r0).rewritten);
  REQUIRE(conv.messages().size() == 2);
  CHECK(conv.messages()[0].role == "system");
  conv.add_reply("ok", 1);
  turn_input in = conv.next_turn(r1);
  CHECK(in.rewritten);
  CHECK(conv.messages().size() == 2);
  CHECK(conv.num_tokens() == 64 * 8 + 10);
}

TEST_CASE("server URLs give host, port and the API prefix") {
  endpoint e;
  std::string error;
  REQUIRE(parse_url("http://127.0.0.1:8000", e, error));
  CHECK(e.host == "127.0.0.1");
  CHECK(e.port == "8000");
  CHECK(e.api_path == "/v1");
  REQUIRE(parse_url("http://localhost:9/v1/", e, error));
  CHECK(e.api_path == "/v1");
  REQUIRE(parse_url("ws://gateway/team/a", e, error));
  CHECK(e.port == "80");
  CHECK(e.api_path == "/team/a/v1");
  CHECK_FALSE(parse_url("https://example.com", e, error));
  CHECK_FALSE(parse_url("http://:80", e, error));
}

TEST_CASE("the model to ask for comes from GET /v1/models when not given") {
  CHECK(first_model_id(R"({"object":"list","data":[{"id":"dsv41-micro","object":"model"},{"id":"b"}]})") ==
        "dsv41-micro");
  CHECK(first_model_id(R"({"data":[]})").empty());
  CHECK(first_model_id("nonsense").empty());
}
