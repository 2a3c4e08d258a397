// The server's edge, without sockets: JSON strings always come out valid and round-trip, request
// bodies parse into the right native fields or into a 400 naming the bad field, the latency
// histogram's quantiles agree with sorting the samples and its text keeps exact bounds, and a
// log line stays one line whatever its values hold.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>

#include "net/api_parse.hpp"
#include "net/json_writer.hpp"
#include "net/metrics.hpp"
#include "net/server_state.hpp"

using namespace cedar::net;

namespace {

/// Slow and obvious: is `s` valid UTF-8 (no overlongs, surrogates or values above U+10FFFF)?
bool valid_utf8_slow(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    unsigned c = (unsigned char)s[i];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0xFF >> (n + 1));
    for (int k = 1; k < n; ++k) {
      unsigned b = (unsigned char)s[i + k];
      if ((b & 0xC0) != 0x80) return false;
      cp = cp << 6 | (b & 0x3F);
    }
    uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

std::string random_bytes(std::mt19937& rng, bool mostly_text) {
  std::string s;
  int n = int(rng() % 40);
  const char* pieces[] = {"a", "\"", "\\", "\n", "\x01", "é", "中", "😀", "\x7f", "\xff", "\xc3", "\xed\xa0\x80"};
  for (int i = 0; i < n; ++i) {
    if (mostly_text) s += pieces[rng() % 9];
    else if (rng() % 2) s += pieces[rng() % 12];
    else s += char(rng() % 256);
  }
  return s;
}

std::string parse_string(const std::string& json) {
  simdjson::dom::parser p;
  std::string_view out;
  auto err = p.parse(json).get(out);
  REQUIRE_MESSAGE(err == simdjson::SUCCESS, json);
  return std::string(out);
}

}  // namespace

TEST_CASE("JSON strings: valid input round-trips, any input gives valid JSON") {
  std::mt19937 rng(7);
  for (int i = 0; i < 3000; ++i) {
    std::string s = random_bytes(rng, i % 2 == 0);
    std::string json;
    append_json_string(json, s);
    std::string back = parse_string(json);  // always valid JSON
    if (valid_utf8_slow(s)) CHECK(back == s);
    else CHECK(valid_utf8_slow(back));
  }
}

TEST_CASE("json_writer places commas and nests") {
  json_writer w;
  w.obj().kv("a", 1).key("b").arr().num(int64_t{2}).str("x").obj().end_obj().end_arr().key("c").null().end_obj();
  CHECK(w.str() == R"({"a":1,"b":[2,"x",{}],"c":null})");
}

TEST_CASE("chat request: fields land in the native struct") {
  chat_request r;
  auto err = parse_chat_request(R"({"model":"m","messages":[{"role":"developer","content":[{"type":"text","text":"A"},
      {"type":"input_text","text":"B"}]},{"role":"user","content":"hi"},{"role":"assistant","content":null,
      "reasoning_content":"why","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":{"x":1}}}]},
      {"role":"tool","tool_call_id":"c1","content":"ok"}],"tools":[{"type":"function","function":{"name":"f",
      "parameters":{"type":"object"}}}],"tool_choice":{"type":"function","function":{"name":"f"}},"temperature":0.5,
      "top_p":0.9,"top_k":40,"seed":3,"max_completion_tokens":77,"stop":["END","\n\n"],"logprobs":true,
      "top_logprobs":3,"stream":true,"stream_options":{"include_usage":true},"reasoning_effort":"low",
      "chat_template_kwargs":{"thinking":true},"unknown":{"x":[1,2]}})", r);
  REQUIRE_FALSE(err.has_value());
  REQUIRE(r.messages.size() == 4);
  CHECK(r.messages[0].role == "system");
  CHECK(r.messages[0].content == "A\n\nB");
  CHECK(r.messages[2].reasoning_content == "why");
  REQUIRE(r.messages[2].tool_calls.size() == 1);
  CHECK(r.messages[2].tool_calls[0].arguments == R"({"x":1})");
  CHECK(r.messages[3].tool_call_id == "c1");
  REQUIRE(r.tools.size() == 1);
  CHECK(r.tools[0].name == "f");
  CHECK(r.tool_choice.mode == "function");
  CHECK(r.tool_choice.function == "f");
  CHECK(r.gen.sampling.temperature == doctest::Approx(0.5));
  CHECK(r.gen.sampling.top_k == 40);
  CHECK(r.gen.sampling.has_seed);
  CHECK(r.gen.max_tokens == 77);
  CHECK(r.gen.stop == std::vector<std::string>{"END", "\n\n"});
  CHECK(r.gen.top_logprobs == 3);
  CHECK(r.gen.stream);
  CHECK(r.gen.include_usage);
  CHECK(r.reasoning.thinking);
  CHECK(r.reasoning.effort == 50);
}

TEST_CASE("chat request: each wrongly-typed field is a 400 naming it") {
  const char* base = R"({"messages":[{"role":"user","content":"x"}])";
  struct row { const char* extra; const char* param; };
  row rows[] = {{R"("temperature":"1")", "temperature"}, {R"("temperature":3)", "temperature"},
                {R"("top_p":0)", "top_p"}, {R"("max_tokens":0)", "max_tokens"},
                {R"("max_tokens":1.5)", "max_tokens"}, {R"("stream":1)", "stream"}, {R"("n":2)", "n"},
                {R"("stop":{"a":1})", "stop"}, {R"("tools":[{"type":"function"}])", "tools.function"},
                {R"("tool_choice":"sometimes")", "tool_choice"}, {R"("top_logprobs":30)", "top_logprobs"},
                {R"("reasoning_effort":0)", "reasoning_effort"}, {R"("seed":"s")", "seed"},
                {R"("tool_choice":"required")", "tool_choice"},  // no tools to require
                {R"("tool_choice":{"type":"function","function":{"name":"f"}})", "tool_choice"}};
  for (auto& r : rows) {
    chat_request out;
    std::string body = std::string(base) + "," + r.extra + "}";
    auto err = parse_chat_request(body, out);
    REQUIRE_MESSAGE(err.has_value(), body);
    CHECK_MESSAGE(err->status == 400, body);
    CHECK_MESSAGE(err->param == r.param, body);
  }
  chat_request out;
  // a function tool_choice among the tools is fine; one that is not, is not
  const auto parse = [](const std::string& body) {
    chat_request fresh;
    return parse_chat_request(body, fresh);
  };
  const std::string with_f = std::string(base) + R"(,"tools":[{"type":"function","function":{"name":"f"}}],)";
  CHECK_FALSE(parse(with_f + R"("tool_choice":{"type":"function","function":{"name":"f"}}})"));
  CHECK_FALSE(parse(with_f + R"("tool_choice":"required"})"));
  CHECK(parse(with_f + R"("tool_choice":{"type":"function","function":{"name":"g"}}})")->message ==
        "'tool_choice' names 'g', which is not among the tools");
  // a tool may be named like a mode: chosen by name, it is that function, not the mode
  chat_request named;
  const std::string with_none = std::string(base) + R"(,"tools":[{"type":"function","function":{"name":"none"}}],)";
  CHECK_FALSE(parse_chat_request(with_none + R"("tool_choice":{"type":"function","function":{"name":"none"}}})", named));
  CHECK(named.tool_choice.mode == "function");
  CHECK(named.tool_choice.function == "none");
  CHECK_FALSE(parse_chat_request(with_none + R"("tool_choice":"none"})", named));
  CHECK(named.tool_choice.mode == "none");
  CHECK(parse_chat_request(R"({"messages":[]})", out)->code == "empty_messages");
  // the range as a client reads it, not as "[0.000000, 2.000000]"
  CHECK(parse_chat_request(std::string(base) + R"(,"temperature":3})", out)->message ==
        "'temperature' is out of range [0, 2]");
  CHECK(parse_chat_request("{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", out)->code == "invalid_utf8");
  CHECK(parse_chat_request(R"({"messages":)", out)->code == "invalid_json");
}

TEST_CASE("responses input items map to messages") {
  responses_request r;
  auto err = parse_responses_request(R"({"instructions":"be kind","input":[
      {"role":"user","content":[{"type":"input_text","text":"q"}]},
      {"type":"reasoning","summary":[{"type":"summary_text","text":"think"}]},
      {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
      {"type":"function_call","call_id":"c2","name":"g","arguments":"{}"},
      {"type":"function_call_output","call_id":"c1","output":"r1"}],
      "reasoning":{"effort":"max"},"max_output_tokens":9,"previous_response_id":"resp_1"})", r);
  REQUIRE_FALSE(err.has_value());
  REQUIRE(r.input.size() == 3);
  CHECK(r.input[0].content == "q");
  CHECK(r.input[1].role == "assistant");
  CHECK(r.input[1].reasoning_content == "think");
  REQUIRE(r.input[1].tool_calls.size() == 2);  // consecutive calls are one assistant turn
  CHECK(r.input[1].tool_calls[1].name == "g");
  CHECK(r.input[2].role == "tool");
  CHECK(r.input[2].tool_call_id == "c1");
  CHECK(r.reasoning.effort == 100);
  CHECK(r.gen.max_tokens == 9);
  CHECK(r.previous_response_id == "resp_1");
}

TEST_CASE("responses input items: a turn replayed as message + function_call items is one assistant turn") {
  responses_request r;
  auto err = parse_responses_request(R"({"input":[
      {"role":"user","content":"q"},
      {"type":"reasoning","summary":[{"type":"summary_text","text":"R"}]},
      {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Let me check."}]},
      {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
      {"type":"function_call_output","call_id":"c1","output":"ok"},
      {"type":"reasoning","summary":[{"type":"summary_text","text":"R2"}]},
      {"type":"function_call","call_id":"c2","name":"g","arguments":"{}"}]})", r);
  REQUIRE_FALSE(err.has_value());
  REQUIRE(r.input.size() == 4);
  CHECK(r.input[1].role == "assistant");
  CHECK(r.input[1].reasoning_content == "R");
  CHECK(r.input[1].content == "Let me check.");
  REQUIRE(r.input[1].tool_calls.size() == 1);
  CHECK(r.input[1].tool_calls[0].id == "c1");
  CHECK(r.input[2].role == "tool");
  CHECK(r.input[3].role == "assistant");  // after the tool result, a new turn
  CHECK(r.input[3].reasoning_content == "R2");
  REQUIRE(r.input[3].tool_calls.size() == 1);
}

TEST_CASE("responses: reasoning.effort is echoed as the string OpenAI's clients read") {
  const auto echoed = [](const char* reasoning) {
    responses_request r;
    const std::string body = std::string(R"({"input":"q")") + reasoning + "}";
    REQUIRE_FALSE(parse_responses_request(body, r).has_value());
    return effort_name(r.reasoning);
  };
  CHECK(echoed("") == "medium");  // the default effort, 75
  CHECK(echoed(R"(,"reasoning":{"effort":"low"})") == "low");
  CHECK(echoed(R"(,"reasoning":{"effort":"high"})") == "high");  // the client's word, not 75's name
  CHECK(echoed(R"(,"reasoning":{"effort":"xhigh"})") == "xhigh");
  CHECK(echoed(R"(,"reasoning":{"effort":"none"})") == "none");
  CHECK(echoed(R"(,"reasoning_effort":100)") == "max");  // a number: the nearest name
  CHECK(echoed(R"(,"reasoning_effort":30)") == "low");
}

TEST_CASE("WebSocket events: create (flat or nested) and cancel") {
  ws_client_event e;
  REQUIRE_FALSE(parse_ws_event(R"({"type":"response.create","input":"hi","previous_response_id":null})", e));
  CHECK(e.type == ws_client_event::kind::create);
  CHECK(e.create.previous_response_id.empty());
  ws_client_event nested;
  REQUIRE_FALSE(parse_ws_event(R"({"type":"response.create","response":{"input":"hi"}})", nested));
  CHECK(nested.create.input.size() == 1);
  ws_client_event cancel;
  REQUIRE_FALSE(parse_ws_event(R"({"type":"response.cancel"})", cancel));
  CHECK(cancel.type == ws_client_event::kind::cancel);
  ws_client_event bad;
  CHECK(parse_ws_event(R"({"type":"session.update"})", bad)->code == "unknown_event");
}

TEST_CASE("latency histogram quantiles match sorted samples within a bucket") {
  std::mt19937 rng(11);
  std::lognormal_distribution<double> dist(-7.0, 1.5);  // ~1 ms, spread over decades
  latency_histogram h;
  std::vector<double> samples;
  for (int i = 0; i < 20000; ++i) {
    double x = dist(rng);
    samples.push_back(x);
    h.observe(x);
  }
  std::sort(samples.begin(), samples.end());
  for (double q : {0.5, 0.9, 0.99}) {
    double exact = samples[size_t(q * double(samples.size()))];
    double approx = h.quantile(q);
    CHECK(approx >= exact / 2.0);  // buckets are a factor of 2 wide
    CHECK(approx <= exact * 2.0);
  }
}

TEST_CASE("latency histogram text: each le label is its bucket's exact bound; _count is the +Inf bucket") {
  latency_histogram h;
  std::vector<double> seen;
  for (int i = 0; i < latency_histogram::num_buckets; ++i) {
    const double b = latency_histogram::bound(i);
    for (double x : {b, std::nextafter(b, 1e9)}) h.observe(x), seen.push_back(x);
  }
  std::string text;
  h.render(text, "t", "help");
  std::istringstream lines(text);
  std::string line;
  int buckets = 0;
  int64_t inf = -1, count = -2;
  while (std::getline(lines, line)) {
    if (line.rfind("t_bucket{le=\"+Inf\"} ", 0) == 0) inf = std::stoll(line.substr(line.find("} ") + 2));
    else if (line.rfind("t_bucket{le=\"", 0) == 0) {
      const std::size_t q = line.find('"', 13);
      const double le = std::strtod(line.substr(13, q - 13).c_str(), nullptr);
      const int64_t n = std::stoll(line.substr(line.find("} ") + 2));
      CHECK(le == latency_histogram::bound(buckets));
      // Prometheus' rule: a bucket counts every observation <= its label
      CHECK(n == std::count_if(seen.begin(), seen.end(), [&](double x) { return x <= le; }));
      ++buckets;
    } else if (line.rfind("t_count ", 0) == 0) count = std::stoll(line.substr(8));
  }
  CHECK(buckets == latency_histogram::num_buckets);
  CHECK(inf == int64_t(seen.size()));
  CHECK(count == inf);
}

TEST_CASE("key=value log lines: a newline or a control byte in a value cannot start another line") {
  server_state state;
  state.options.log_json = false;
  std::FILE* capture = std::tmpfile();
  REQUIRE(capture);
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(::fileno(capture), 2);
  state.log({{"path", "/v1/x\nforged"}, {"bytes", std::string("a\x01\xff", 3)}, {"plain", "ok"}});
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::rewind(capture);
  std::string out(4096, '\0');
  out.resize(std::fread(out.data(), 1, out.size(), capture));
  std::fclose(capture);
  CHECK(std::count(out.begin(), out.end(), '\n') == 1);
  CHECK(out.find("path=\"/v1/x\\nforged\"") != std::string::npos);
  CHECK(out.find(" plain=ok") != std::string::npos);
  CHECK(std::none_of(out.begin(), out.end(), [](char c) { return c == '\x01'; }));
}

TEST_CASE("log lines: numbers and booleans are bare JSON values, and an empty value is left out") {
  server_state state;
  state.options.log_json = true;
  const auto json = state.format_log_line(
      "T", {{"status", 200}, {"tokens", int64_t{12}}, {"stream", true}, {"ttft_ms", log_value::millis(1.5)},
            {"error", ""}, {"finish", "stop"}, {"code", "404"}});
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE(parser.parse(json).get(doc) == simdjson::SUCCESS);
  CHECK(doc["status"].get_int64().value() == 200);
  CHECK(doc["tokens"].get_int64().value() == 12);
  CHECK(doc["stream"].get_bool().value() == true);
  CHECK(doc["ttft_ms"].get_double().value() == doctest::Approx(1.5));
  CHECK(doc["finish"].get_string().value() == "stop");
  CHECK(doc["code"].get_string().value() == "404");  // text stays text, even when it looks numeric
  CHECK(doc["error"].error() == simdjson::NO_SUCH_FIELD);
  CHECK(doc["ts"].get_string().value() == "T");

  state.options.log_json = false;
  const auto kv = state.format_log_line("T", {{"status", 200}, {"error", ""}, {"ttft_ms", log_value::millis(2.0)}});
  CHECK(kv == "ts=T status=200 ttft_ms=2.000");
}

TEST_CASE("the Responses store keeps to its memory budget, least recently used first, and always keeps the newest") {
  auto engine = make_null_engine(1000, 1);
  response_store store(100, 1000, engine.get());
  auto turn = [](std::string id, size_t bytes) {
    auto r = std::make_shared<stored_response>();
    r->id = std::move(id);
    r->bytes = bytes;
    return std::shared_ptr<const stored_response>(std::move(r));
  };
  store.put(turn("a", 400));
  store.put(turn("b", 400));
  CHECK(store.get("a"));  // a is now the most recently used
  store.put(turn("c", 400));
  CHECK(store.size() == 2);
  CHECK(store.bytes() == 800);
  CHECK_FALSE(store.get("b"));
  CHECK(store.get("a"));
  store.put(turn("big", 5000));  // over the budget alone: kept, everything older goes
  CHECK(store.size() == 1);
  CHECK(store.bytes() == 5000);
  CHECK(store.get("big"));
  CHECK(store.erase("big"));
  CHECK(store.bytes() == 0);
}
