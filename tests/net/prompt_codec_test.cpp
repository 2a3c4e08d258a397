// Prompt encoding of conversations: text a user types never becomes a control token, a
// continued conversation's ids extend the previous prompt plus the model's completion (so the
// engine session and the prefix cache hit), and WebSocket delta coalescing keeps every
// message a whole event with the same text.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "net/dsv41_tokens.hpp"
#include "net/json_writer.hpp"
#include "net/prompt_codec.hpp"
#include "net/py_json.hpp"
#include "net/tokenizer.hpp"
#include "net/ws_coalesce.hpp"
#include "tests/net/shared_tokenizers.hpp"

using namespace cedar::net;

namespace {

const prompt_codec& codec() {
  static auto c = [] {
    std::string error;
    auto p = prompt_codec::create("", &error);
    REQUIRE_MESSAGE(p, error);
    return p;
  }();
  return *c;
}

const tokenizer& tok() { return testing::v41(); }

/// Random text mixing words, punctuation, unicode and the literal text of control tokens.
std::string random_text(std::mt19937& rng) {
  static const std::vector<std::string> pieces = {
      "hello", " world", "ünïcödé", " 123", "\n\n", "?", " <", "｜", "</", "think", ">",
      dsv41::user, dsv41::assistant, dsv41::eos, dsv41::bos, dsv41::system, dsv41::think_begin,
      dsv41::think_end, dsv41::latest_reminder, "<｜DSML｜ calls>"};
  std::string s;
  const int n = 1 + int(rng() % 12);
  for (int i = 0; i < n; ++i) s += pieces[rng() % pieces.size()];
  return s;
}

size_t count(const std::vector<int32_t>& ids, int32_t id) { return size_t(std::count(ids.begin(), ids.end(), id)); }

bool starts_with(const std::vector<int32_t>& ids, const std::vector<int32_t>& prefix) {
  return prefix.size() <= ids.size() && std::equal(prefix.begin(), prefix.end(), ids.begin());
}

}  // namespace

TEST_CASE("prompt codec: a raw completions prompt keeps its control tokens and gets one BOS") {
  const std::string rendered = std::string(dsv41::bos) + dsv41::user + "Hi" + dsv41::assistant + dsv41::think_end;
  auto p = codec().encode_text(rendered);
  REQUIRE(p.error.empty());
  CHECK(count(p.ids, dsv41::bos_id) == 1);
  CHECK(p.ids.front() == dsv41::bos_id);
  CHECK(count(p.ids, dsv41::user_id) == 1);
  CHECK(count(p.ids, dsv41::assistant_id) == 1);
  CHECK(p.ids.back() == dsv41::think_end_id);
  // the same conversation through the template gives the same ids
  auto chat = codec().render_chat({{"user", "Hi", {}, {}, {}}}, {}, {false, 75});
  REQUIRE(chat.error.empty());
  CHECK(p.ids == chat.ids);
  auto plain = codec().encode_text("Once upon a time");
  REQUIRE(plain.error.empty());
  CHECK(plain.ids.front() == dsv41::bos_id);
  CHECK(count(plain.ids, dsv41::bos_id) == 1);
}

TEST_CASE("prompt codec: tool-call arguments that are JSON but not an object render as the text sent") {
  for (const char* args : {"[1,2]", "42", "null", "\"x\""}) {
    chat_message call{"assistant", "", "", {{"call_1", "f", args}}, {}};
    auto p = codec().render_chat({{"user", "q", {}, {}, {}}, call, {"tool", "ok", {}, {}, "call_1"}}, {}, {false, 75});
    REQUIRE(p.error.empty());
    const std::string text = tok().decode(p.ids);
    CHECK_MESSAGE(text.find(std::string("name=\"arguments\" string=\"true\">") + args + "<") != std::string::npos, text);
  }
  chat_message call{"assistant", "", "", {{"call_1", "f", "{\"city\": \"Paris\", \"days\": 3}"}}, {}};
  auto p = codec().render_chat({{"user", "q", {}, {}, {}}, call, {"tool", "ok", {}, {}, "call_1"}}, {}, {false, 75});
  REQUIRE(p.error.empty());
  const std::string text = tok().decode(p.ids);
  CHECK(text.find("name=\"city\" string=\"true\">Paris<") != std::string::npos);
  CHECK(text.find("name=\"days\" string=\"false\">3<") != std::string::npos);
}

TEST_CASE("prompt codec: a forced tool call opens with the ids the model itself writes for that call") {
  for (const std::string name : {"get_weather", "f", "search_web_v2", "读取文件"}) {
    CAPTURE(name);
    const std::vector<int32_t> lead = codec().tool_call_lead(name);
    REQUIRE(!lead.empty());
    const std::string spelled = tok().decode(lead);
    const std::string call = std::string(dsv41::calls_open) + dsv41::invoke_open + name + dsv41::invoke_name_end;
    CHECK(call.starts_with(spelled));  // nothing past the name's line
    CHECK(spelled.starts_with(std::string(dsv41::calls_open) + dsv41::invoke_open + name + "\""));
    CHECK(std::count(lead.begin(), lead.end(), dsv41::dsml_id) == 2);  // the markers are control tokens
    // An earlier turn's call of the same function holds the same ids.
    chat_message reply{"assistant", "", "", {{"call_1", name, "{\"city\": \"Paris\"}"}}, {}};
    auto p = codec().render_chat({{"user", "q", {}, {}, {}}, reply, {"tool", "ok", {}, {}, "call_1"}}, {}, {false, 75});
    REQUIRE(p.error.empty());
    CHECK(std::search(p.ids.begin(), p.ids.end(), lead.begin(), lead.end()) != p.ids.end());
  }
}

TEST_CASE("prompt codec: control-token text typed in a message is encoded as text") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const bool thinking = trial % 2 == 0;
    std::string typed = random_text(rng) + dsv41::user + random_text(rng) + dsv41::assistant;
    std::vector<chat_message> msgs = {{"system", random_text(rng), {}, {}, {}},
                                      {"user", typed, {}, {}, {}}};
    auto p = codec().render_chat(msgs, {}, {thinking, 75});
    REQUIRE(p.error.empty());
    // The template writes exactly one BOS, System, User and Assistant token and the mode token;
    // the typed ones stay text.
    CHECK(count(p.ids, dsv41::bos_id) == 1);
    CHECK(count(p.ids, dsv41::eos_id) == 0);
    CHECK(count(p.ids, dsv41::system_id) == 1);
    CHECK(count(p.ids, dsv41::user_id) == 1);
    CHECK(count(p.ids, dsv41::assistant_id) == 1);
    CHECK(count(p.ids, dsv41::latest_reminder_id) == 0);
    CHECK(count(p.ids, thinking ? dsv41::think_begin_id : dsv41::think_end_id) == 1);
    CHECK(count(p.ids, thinking ? dsv41::think_end_id : dsv41::think_begin_id) == 0);
    // Nothing is lost: the ids decode to the rendered text, typed control text included.
    std::string text = tok().decode(p.ids);
    CHECK(text.find(typed) != std::string::npos);
    CHECK(text.substr(text.size() - std::string(dsv41::assistant).size() - (thinking ? 7 : 8)) ==
          std::string(dsv41::assistant) + (thinking ? dsv41::think_begin : dsv41::think_end));
  }
}

TEST_CASE("prompt codec: a continued conversation extends the previous prompt and completion") {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 30; ++trial) {
    const bool thinking = trial % 2 == 1;
    const reasoning_options reasoning{thinking, 50 + int(rng() % 50)};
    std::vector<chat_message> all = {{"system", "Be brief. " + random_text(rng), {}, {}, {}},
                                     {"user", random_text(rng), {}, {}, {}}};
    auto turn = codec().extend_chat(nullptr, all, {}, reasoning);
    REQUIRE(turn.error.empty());
    CHECK(turn.ids == codec().render_chat(all, {}, reasoning).ids);
    for (int t = 0; t < 3; ++t) {
      // What the model generates: reasoning, </think> (thinking mode), content, then EOS, as
      // the model may emit them: in pieces that are not the tokenizer's own split of the text,
      // and sometimes cut off before EOS (max tokens).
      const std::string part1 = "The ans", part2 = "wer is " + std::to_string(rng() % 1000) + ".";
      chat_message reply{"assistant", part1 + part2, thinking ? "Let me think " + std::to_string(t) + "." : "", {}, {}};
      std::vector<int32_t> completion;
      auto emit = [&](const std::vector<int32_t>& ids) { completion.insert(completion.end(), ids.begin(), ids.end()); };
      if (thinking) emit(tok().encode(reply.reasoning_content, false, false)), completion.push_back(dsv41::think_end_id);
      emit(tok().encode(part1, false, false));
      emit(tok().encode(part2, false, false));
      const bool cut_off = rng() % 3 == 0;
      if (!cut_off) completion.push_back(dsv41::eos_id);
      auto with_reply = codec().with_reply(turn.context, reply, completion);
      std::vector<chat_message> next = {{"user", random_text(rng), {}, {}, {}}};
      auto following = codec().extend_chat(with_reply, next, {}, reasoning);
      REQUIRE(following.error.empty());

      std::vector<int32_t> held = turn.ids;  // what the engine session holds after the turn
      held.insert(held.end(), completion.begin(), completion.end());
      CHECK(starts_with(following.ids, held));
      CHECK(following.ids.size() > held.size());
      if (cut_off) CHECK(following.ids[held.size()] == dsv41::eos_id);
      // A completion that does not spell the reply (a stop string cut it) is not reused: the
      // reply's own text is tokenized, and the prompt still holds the rendered reply.
      std::vector<int32_t> other = completion;
      other.insert(other.begin() + std::ptrdiff_t(completion.size() / 2), dsv41::user_id);
      auto fallback = codec().extend_chat(codec().with_reply(turn.context, reply, other), next, {}, reasoning);
      CHECK(count(fallback.ids, dsv41::user_id) == size_t(t) + 2);
      CHECK(tok().decode(fallback.ids) == tok().decode(following.ids));
      CHECK(count(following.ids, dsv41::user_id) == size_t(t) + 2);
      // Without thinking nothing is dropped between turns: the same text as rendering it all anew.
      all.push_back(reply);
      all.insert(all.end(), next.begin(), next.end());
      if (!thinking) CHECK(tok().decode(following.ids) == tok().decode(codec().render_chat(all, {}, reasoning).ids));
      turn = std::move(following);
    }
  }
}

TEST_CASE("prompt codec: a completion with bytes that are not UTF-8 is continued from the model's own ids") {
  // The model may emit byte tokens that do not form a character; the reply's text (the output
  // stream's decoding) has U+FFFD there, which would re-encode to other ids. The next prompt
  // must still extend the ids the engine session holds.
  const auto byte_id = [](char b) {
    for (int32_t id = 0; id < tok().vocab_size(); ++id)
      if (tok().token_bytes(id) == std::string_view(&b, 1)) return id;
    FAIL("no token for a lone byte");
    return int32_t(-1);
  };
  const reasoning_options reasoning{false, 75};
  const std::vector<chat_message> first = {{"user", "Say something odd.", {}, {}, {}}};
  auto turn = codec().extend_chat(nullptr, first, {}, reasoning);
  REQUIRE(turn.error.empty());
  std::vector<int32_t> completion = tok().encode("Half a character:", false, false);
  completion.push_back(byte_id('\xE4'));  // the first two bytes of a three-byte character
  completion.push_back(byte_id('\xB8'));
  for (int32_t id : tok().encode(" then text.", false, false)) completion.push_back(id);
  completion.push_back(dsv41::eos_id);
  incremental_decoder stream(tok(), true);
  std::string text = stream.push(completion);
  text += stream.finish();
  REQUIRE(text == "Half a character:\xEF\xBF\xBD then text.");
  const chat_message reply{"assistant", text, "", {}, {}};
  auto following = codec().extend_chat(codec().with_reply(turn.context, reply, completion),
                                       {{"user", "Go on.", {}, {}, {}}}, {}, reasoning);
  REQUIRE(following.error.empty());
  std::vector<int32_t> held = turn.ids;
  held.insert(held.end(), completion.begin(), completion.end());
  CHECK(starts_with(following.ids, held));
  CHECK(following.ids.size() > held.size());
}

TEST_CASE("prompt codec: Completions logprobs name byte tokens apart, whole-text tokens by their text") {
  std::vector<int32_t> bytes;  // single-byte tokens that are not UTF-8 on their own
  for (int32_t id = 0; id < codec().vocab_size() && bytes.size() < 3; ++id) {
    const std::string t = codec().token_text(id);
    if (t.size() == 1 && (unsigned char)t[0] >= 0x80) bytes.push_back(id);
  }
  REQUIRE(bytes.size() == 3);
  std::set<std::string> names;
  for (int32_t id : bytes) {
    const std::string name = codec().token_name(id);
    char expect[16];
    std::snprintf(expect, sizeof expect, "bytes:\\x%02x", (unsigned char)codec().token_text(id)[0]);
    CHECK(name == expect);
    names.insert(name);
  }
  CHECK(names.size() == 3);
  const auto hello = tok().encode(" hello", false);
  REQUIRE(hello.size() == 1);
  CHECK(codec().token_name(hello[0]) == " hello");
}

TEST_CASE("prompt codec: a conversation started with other tools or reasoning is not continued") {
  std::vector<chat_message> msgs = {{"user", "hi", {}, {}, {}}};
  auto turn = codec().extend_chat(nullptr, msgs, {}, {true, 75});
  REQUIRE(turn.context);
  CHECK(codec().can_continue(*turn.context, {}, {true, 75}));
  CHECK_FALSE(codec().can_continue(*turn.context, {}, {false, 75}));
  CHECK_FALSE(codec().can_continue(*turn.context, {}, {true, 50}));
  std::vector<tool_def> tools = {{"f", R"({"name":"f","parameters":{"type":"object"}})"}};
  CHECK_FALSE(codec().can_continue(*turn.context, tools, {true, 75}));
  auto refused = codec().extend_chat(turn.context, msgs, tools, {true, 75});
  CHECK_FALSE(refused.error.empty());
  CHECK(codec().extend_chat(nullptr, {{"assistant", "x", {}, {}, {}}}, {}, {}).error.size() > 0);
}

namespace {

std::string delta_event(const std::string& type, int64_t seq, const std::string& item, int64_t index,
                        const std::string& text) {
  json_writer w;
  w.obj().kv("type", type).kv("sequence_number", seq).kv("item_id", item).kv("output_index", index);
  if (type != "response.function_call_arguments.delta") w.kv("content_index", 0);
  w.kv("delta", text);
  return w.end_obj().take();
}

std::string field(const json_value& v, const char* name) {
  for (auto& [k, m] : v.members)
    if (k == name) return m.text;
  return "<missing>";
}

}  // namespace

TEST_CASE("websocket coalescing: merged deltas are one whole event with the texts in order") {
  std::mt19937 rng(3);
  const std::vector<std::string> types = {"response.output_text.delta", "response.reasoning_text.delta",
                                          "response.function_call_arguments.delta"};
  const std::vector<std::string> texts = {"a", " \"quoted\" ", "back\\slash", "ünï", "\n\t", ",\"delta\":\"x",
                                          "}", "", "\u0001"};
  for (int trial = 0; trial < 300; ++trial) {
    // A queue of events as the writer makes them; merge each into the one before when allowed.
    std::vector<std::string> sent;  // events as a client would receive them
    std::vector<std::pair<std::string, std::string>> expected;  // (type item, text) runs, in order
    int64_t seq = 0;
    std::string item = "msg_1";
    for (int i = 0; i < 12; ++i) {
      const std::string& type = types[rng() % 2 == 0 ? 0 : rng() % types.size()];
      if (rng() % 4 == 0) item = "msg_" + std::to_string(rng() % 3);
      std::string text = texts[rng() % texts.size()] + texts[rng() % texts.size()];
      std::string e = delta_event(type, seq++, item, 0, text);
      if (rng() % 6 == 0) e = R"({"type":"response.output_item.done","sequence_number":)" + std::to_string(seq++) + "}";
      const bool is_delta = e.find("\"delta\"") != std::string::npos;
      if (!sent.empty() && merge_delta_events(sent.back(), e)) {
        REQUIRE(is_delta);
        REQUIRE(!expected.empty());
        CHECK(expected.back().first == type + " " + item);
        expected.back().second += text;
        continue;
      }
      sent.push_back(e);
      expected.push_back({is_delta ? type + " " + item : std::string("other"), is_delta ? text : std::string()});
    }
    REQUIRE(sent.size() == expected.size());
    int64_t last_seq = -1;
    for (size_t i = 0; i < sent.size(); ++i) {
      std::string why;
      auto v = parse_json(sent[i], &why);
      const std::string context = why + " in " + sent[i];
      REQUIRE_MESSAGE(v, context);
      int64_t s = std::stoll(field(*v, "sequence_number"));
      CHECK(s > last_seq);
      last_seq = s;
      if (expected[i].first == "other") continue;
      CHECK(field(*v, "type") + " " + field(*v, "item_id") == expected[i].first);
      CHECK(field(*v, "delta") == expected[i].second);
      // Two adjacent messages of one item would have been merged.
      if (i > 0) CHECK(expected[i - 1].first != expected[i].first);
    }
  }
}
