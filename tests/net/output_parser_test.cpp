// Output parser: recovers reasoning, content and tool calls from rendered assistant turns (the
// spec's examples), gives the same result for every way of cutting the stream, accepts the
// older dialects, and turns malformed calls into content.
#include <doctest/doctest.h>

#include <atomic>
#include <random>

#include "net/chat_format.hpp"
#include "net/output_parser.hpp"
#include "net/py_json.hpp"

using namespace cedar::net;

namespace {

std::string calls_of(const output_delta& d) {
  std::string s;
  for (auto& c : d.tool_calls) s += std::to_string(c.index) + ":" + c.name + "=" + c.arguments + ";";
  return s;
}

void check_same(const output_delta& a, const output_delta& b) {
  CHECK(a.reasoning == b.reasoning);
  CHECK(a.content == b.content);
  CHECK(calls_of(a) == calls_of(b));
  CHECK(a.warnings.size() == b.warnings.size());
}

// Parses `text` cut at the given byte positions.
output_delta parse_cut(std::string_view text, bool thinking, const std::vector<size_t>& cuts) {
  output_parser p(thinking);
  output_delta all;
  size_t prev = 0;
  for (size_t c : cuts) {
    all.append(p.feed(text.substr(prev, c - prev)));
    prev = c;
  }
  all.append(p.feed(text.substr(prev)));
  all.append(p.finish());
  return all;
}

// Every single cut, every byte on its own, and random multi-cuts give the whole-text result.
void check_every_cut(std::string_view text, bool thinking) {
  output_delta whole = parse_output(text, thinking);
  for (size_t i = 0; i <= text.size(); ++i) check_same(parse_cut(text, thinking, {i}), whole);
  std::vector<size_t> bytes;
  for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
  check_same(parse_cut(text, thinking, bytes), whole);
  std::mt19937 rng(static_cast<unsigned>(text.size()));
  for (int t = 0; t < 50; ++t) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i)
      if (rng() % 7 == 0) cuts.push_back(i);
    check_same(parse_cut(text, thinking, cuts), whole);
  }
}

// The text the model generates for an assistant message, as the encoder renders it (the
// prompt's header is cut off; tools in the conversation keep the reasoning).
std::string rendered_turn(const chat::message& assistant, bool thinking) {
  std::string error;
  chat::message sys{.role = "system", .content = "s"};
  sys.tools.push_back(*parse_json(R"({"type": "function", "function": {"name": "f"}})", &error));
  chat::render_options opts;
  opts.thinking = thinking;
  chat::conversation conv(opts);
  REQUIRE(conv.append({sys, chat::message{.role = "user", .content = "u"}}, &error));
  auto turn = conv.append({assistant}, &error);
  REQUIRE_MESSAGE(turn, error);
  return *turn;
}

}  // namespace

TEST_CASE("rendered assistant turns parse back to their reasoning, content and calls") {
  std::string error;
  chat::message e3{.role = "assistant", .content = "", .reasoning_content = "The user wants the weather in Beijing. I should call get_weather."};
  e3.tool_calls.push_back({"", "get_weather", "", json_value::of_string(R"({"location": "Beijing", "unit": "celsius"})")});
  chat::message e4{.role = "assistant", .content = "", .reasoning_content = "用户想知道小柴胡冲剂和布洛芬能否一起服用。"};
  e4.tool_calls.push_back({"", "search", "", json_value::of_string(R"({"queries": "小柴胡冲剂 布洛芬 相互作用 一起吃"})")});
  chat::message mixed{.role = "assistant", .content = "Let me check.\n\nTwo calls:", .reasoning_content = "Plan:\n1. read\n2. count </ not a tag"};
  mixed.tool_calls.push_back({"", "fs::read", "", *parse_json(R"({"path": "/tmp/a b", "lines": [1, 2], "opts": {"x": null}, "big": 1.5e300})", &error)});
  mixed.tool_calls.push_back({"", "count", "", *parse_json(R"({"text": "<｜DSML｜ almost a tag\n", "n": -3})", &error)});
  chat::message plain{.role = "assistant", .content = "The weather in Beijing is sunny, 22°C 🌞.", .reasoning_content = "Got the data."};

  for (bool thinking : {true, false}) {
    for (const auto* m : {&e3, &e4, &mixed, &plain}) {
      std::string text = rendered_turn(*m, thinking);
      CAPTURE(text);
      output_delta d = parse_output(text, thinking);
      CHECK(d.reasoning == (thinking ? m->reasoning_content.value_or("") : ""));
      CHECK(d.content == m->content);
      REQUIRE(d.tool_calls.size() == m->tool_calls.size());
      for (size_t i = 0; i < d.tool_calls.size(); ++i) {
        CHECK(d.tool_calls[i].index == i);
        CHECK(d.tool_calls[i].name == m->tool_calls[i].name);
        const json_value& args = m->tool_calls[i].arguments;
        CHECK(d.tool_calls[i].arguments == (args.is_string() ? python_json(*parse_json(args.text, &error)) : python_json(args)));
        CHECK(parse_json(d.tool_calls[i].arguments, &error));
      }
      CHECK(d.warnings.empty());
      check_every_cut(text, thinking);
    }
  }
}

TEST_CASE("deltas stream as they form; partial markers are held back") {
  output_parser p(true);
  CHECK(p.feed("Let me think").reasoning == "Let me think");
  auto d = p.feed(" more</thi");
  CHECK(d.reasoning == " more");
  d = p.feed("nk>Answer: 4");
  CHECK(d.reasoning.empty());
  CHECK(d.content == "Answer: 4");
  CHECK(p.feed("\n\n").content.empty());  // may be the separator before a tool block
  CHECK(p.feed("More.").content == "\n\nMore.");
  CHECK(p.feed("\xE4\xB8").content.empty());  // half a character
  CHECK(p.feed("\xAD").content == "中");
  d = p.feed("\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"false\">1</｜DSML｜ parameter>\n</｜DSML｜ invoke>");
  CHECK(d.content.empty());
  REQUIRE(d.tool_calls.size() == 1);  // delivered when its invoke closes, before the block ends
  CHECK(d.tool_calls[0].arguments == "{\"a\": 1}");
  CHECK(p.feed("\n</｜DSML｜ calls><｜end▁of▁sentence｜>").empty());
  CHECK(p.saw_eos());
  CHECK(p.finish().empty());
}

TEST_CASE("dialects, calls before </think>, stray markers") {
  auto v4 = parse_output("r</think>ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get\">\n<｜DSML｜parameter name=\"k\" string=\"true\">v</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", true);
  CHECK(v4.reasoning == "r");
  CHECK(v4.content == "ok");
  CHECK(calls_of(v4) == "0:get={\"k\": \"v\"};");
  auto v32 = parse_output("<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"a\">\n<｜DSML｜parameter name=\"n\" string=\"false\">[1,2]</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"b\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>", false);
  CHECK(calls_of(v32) == "0:a={\"n\": [1,2]};1:b={};");
  // The block before </think> ends the reasoning (pitfall 1), and the call is not lost.
  auto early = parse_output("thinking...\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"x\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>", true);
  CHECK(early.reasoning == "thinking...");
  CHECK(calls_of(early) == "0:x={};");
  // Bare invokes with no block; then text.
  auto bare = parse_output("<｜DSML｜ invoke name=\"y\">\n<｜DSML｜ parameter name=\"q\" string=\"true\">z</｜DSML｜ parameter>\n</｜DSML｜ invoke>\ndone", false);
  CHECK(calls_of(bare) == "0:y={\"q\": \"z\"};");
  CHECK(bare.content == "\ndone");  // the line break after the calls stays, as after a block
  auto between = parse_output("ok\n<｜DSML｜ invoke name=\"y\">\n</｜DSML｜ invoke>\ntrailing", false);
  CHECK(calls_of(between) == "0:y={};");
  CHECK(between.content == "ok\ntrailing");
  auto after_block = parse_output("ok\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"y\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>\nmore", false);
  CHECK(after_block.content == "ok\nmore");
  auto stray = parse_output("<think>a<think>b</think>c</think>d<think>e", true);
  CHECK(stray.reasoning == "ab");
  CHECK(stray.content == "cde");
  auto not_tag = parse_output("see <｜DSML｜ table> and <｜DSML｜", false);
  CHECK(not_tag.content == "see <｜DSML｜ table> and <｜DSML｜");
  auto after_eos = parse_output("x<｜end▁of▁sentence｜>ignored", false);
  CHECK(after_eos.content == "x");
  for (auto* s : {"r</think>ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
                  "<think>a<think>b</think>c</think>d<think>e", "see <｜DSML｜ table> and <｜DSML｜"})
    check_every_cut(s, true);
  check_every_cut("ok\n<｜DSML｜ invoke name=\"y\">\n</｜DSML｜ invoke>\ntrailing", false);
}

namespace {
std::atomic<int> g_num_logged{0};
void count_warning(std::string_view) { ++g_num_logged; }
}  // namespace

TEST_CASE("malformed calls come back as content with a warning") {
  set_output_warning_log(&count_warning);  // logged (and kept quiet here)
  g_num_logged = 0;
  const char* no_name = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  auto d = parse_output(no_name, false);
  CHECK(d.tool_calls.empty());
  CHECK(d.content == "<｜DSML｜ invoke>\n</｜DSML｜ invoke>");
  CHECK(d.warnings.size() == 1);
  const char* dup = "<｜DSML｜ calls><｜DSML｜ invoke name=\"f\"><｜DSML｜ parameter name=\"a\" string=\"true\">1</｜DSML｜ parameter><｜DSML｜ parameter name=\"a\" string=\"true\">2</｜DSML｜ parameter></｜DSML｜ invoke></｜DSML｜ calls>";
  d = parse_output(dup, false);
  CHECK(d.tool_calls.empty());
  CHECK(d.warnings.size() == 1);
  CHECK(d.content.find("name=\"a\"") != std::string::npos);
  const char* cut_off = "ok\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">1";
  d = parse_output(cut_off, false);
  CHECK(d.tool_calls.empty());
  CHECK(d.content == "ok<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">1");
  CHECK(d.warnings.size() == 1);
  const char* junk = "<｜DSML｜ calls>\nhello";
  d = parse_output(junk, false);
  CHECK(d.content == "hello");
  CHECK(d.warnings.size() == 1);
  const char* bad_json = "<｜DSML｜ calls><｜DSML｜ invoke name=\"f\"><｜DSML｜ parameter name=\"a\" string=\"false\">{oops</｜DSML｜ parameter></｜DSML｜ invoke></｜DSML｜ calls>";
  CHECK(calls_of(parse_output(bad_json, false)) == "0:f={\"a\": \"{oops\"};");
  CHECK(g_num_logged == 4);
  for (auto* s : {no_name, dup, cut_off, junk, bad_json}) check_every_cut(s, false);
}

TEST_CASE("an invoke without its closing tag ends at the next marker; a false value with trailing text stays text") {
  set_output_warning_log(&count_warning);
  const std::string p1 = "<｜DSML｜ parameter name=\"a\" string=\"false\">1</｜DSML｜ parameter>";
  const std::string p2 = "<｜DSML｜ parameter name=\"b\" string=\"true\">x</｜DSML｜ parameter>";
  // closed by the block's end, then EOS: the call is kept and nothing of the markers leaks
  const std::string by_block = "ok\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n" + p1 + "\n</｜DSML｜ calls><｜end▁of▁sentence｜>";
  auto d = parse_output(by_block, false);
  CHECK(calls_of(d) == "0:f={\"a\": 1};");
  CHECK(d.content == "ok");
  CHECK(d.warnings.size() == 1);
  // closed by the next invoke, which has its own closing tag
  const std::string by_next = "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n" + p1 + "\n<｜DSML｜ invoke name=\"g\">\n" + p2 +
                              "\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  d = parse_output(by_next, false);
  CHECK(calls_of(d) == "0:f={\"a\": 1};1:g={\"b\": \"x\"};");
  CHECK(d.content.empty());
  // a bare invoke closed by EOS
  const std::string by_eos = "r</think><｜DSML｜ invoke name=\"f\">\n" + p1 + "<｜end▁of▁sentence｜>after";
  d = parse_output(by_eos, true);
  CHECK(d.reasoning == "r");
  CHECK(calls_of(d) == "0:f={\"a\": 1};");
  CHECK(d.content.empty());
  // string="false" values must be whole JSON values: "[1, 2]]" and "1],[2" are text
  const std::string trailing = "<｜DSML｜ calls><｜DSML｜ invoke name=\"f\"><｜DSML｜ parameter name=\"a\" string=\"false\">[1, 2]]"
                               "</｜DSML｜ parameter><｜DSML｜ parameter name=\"b\" string=\"false\">1],[2</｜DSML｜ parameter>"
                               "</｜DSML｜ invoke></｜DSML｜ calls>";
  d = parse_output(trailing, false);
  CHECK(calls_of(d) == "0:f={\"a\": \"[1, 2]]\", \"b\": \"1],[2\"};");
  CHECK(parse_json(d.tool_calls.at(0).arguments, nullptr));
  for (const auto& s : {by_block, by_next, trailing}) check_every_cut(s, false);
  check_every_cut(by_eos, true);
}

TEST_CASE("random streams of marker fragments: never a crash, cut-independent") {
  const char* parts[] = {"<｜DSML｜", " calls>", "</｜DSML｜", " invoke", " name=\"f\"", ">", "\n", "\n\n", "</think>",
                         "<think>", " parameter", " string=\"true\"", "text", "中", "\xE4", "<｜end▁of▁sentence｜>",
                         "tool_calls>", "<", "｜", "\""};
  std::mt19937 rng(5);
  for (int t = 0; t < 300; ++t) {
    std::string s;
    for (int k = 0; k < 12; ++k) s += parts[rng() % (sizeof parts / sizeof *parts)];
    output_delta whole = parse_output(s, t % 2);
    std::vector<size_t> cuts;
    for (size_t i = 1; i < s.size(); ++i)
      if (rng() % 3 == 0) cuts.push_back(i);
    check_same(parse_cut(s, t % 2, cuts), whole);
  }
}
