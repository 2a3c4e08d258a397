// Structured output: response formats compiled from JSON (net/response_format.cpp), the byte
// matcher that follows a completion through them, and the token masks built from the served
// vocabulary (actors/output_grammar.cpp). A random walk over allowed tokens must always end in
// a value the schema admits.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <chrono>
#include <random>
#include <string>

#include "net/response_format.hpp"
#include "shared_tokenizers.hpp"

namespace cedar::net {
namespace {

output_grammar schema(const std::string& json, std::string* error = nullptr) {
  static simdjson::dom::parser parser;  // one document at a time: compile copies what it needs
  simdjson::dom::element e;
  REQUIRE(parser.parse(json).get(e) == simdjson::SUCCESS);
  output_grammar g;
  const std::string why = compile_json_schema(e, g);
  if (error) *error = why;
  else REQUIRE_MESSAGE(why.empty(), why);
  return g;
}

output_grammar json_object() {
  simdjson::dom::parser parser;
  simdjson::dom::element e;
  REQUIRE(parser.parse(std::string(R"({"type":"json_object"})")).get(e) == simdjson::SUCCESS);
  output_grammar g;
  REQUIRE_FALSE(parse_response_format(e, true, "response_format", g));
  return g;
}

/// Whether `text` is a whole value of g; `prefix`: only that no byte of it was refused.
bool accepts(const output_grammar& g, std::string_view text, bool prefix = false) {
  json_matcher m;
  for (char c : text)
    if (!m.feed(g, uint8_t(c))) return false;
  return prefix || m.can_end(g);
}

std::string compile_error(const std::string& json) {
  std::string why;
  schema(json, &why);
  return why;
}

TEST_CASE("json_object admits one JSON object and nothing else") {
  const auto g = json_object();
  CHECK(accepts(g, "{}"));
  CHECK(accepts(g, R"({"a": [1, -2.5e3, 0, "x\n\u00e9", true, null, {"b": {}}], "c": "d"})"));
  CHECK(accepts(g, "{\n  \"a\": {\n    \"b\": 1\n  }\n}"));  // pretty-printed
  CHECK_FALSE(accepts(g, "[]"));
  CHECK_FALSE(accepts(g, R"("x")"));
  CHECK_FALSE(accepts(g, R"({"a"})"));
  CHECK_FALSE(accepts(g, R"({"a":1,})"));
  CHECK_FALSE(accepts(g, R"({"a":01})"));
  CHECK_FALSE(accepts(g, R"({"a":tru})"));
  CHECK_FALSE(accepts(g, R"({"a":1})" " "));   // nothing after the value: the end token follows
  CHECK_FALSE(accepts(g, " {}"));               // nor before it
  CHECK_FALSE(accepts(g, "{\"a\":\"\x01\"}"));  // a raw control byte in a string
  CHECK_FALSE(accepts(g, "{" + std::string(10, ' ') + "}"));  // whitespace past pretty-printing
  CHECK(accepts(g, R"({"a":1)", true));
  CHECK_FALSE(accepts(g, R"({"a":1)"));  // a prefix is not a whole value
  std::string deep = "{\"a\":";
  for (int i = 0; i < 40; ++i) deep += "[";
  CHECK_FALSE(accepts(g, deep, true));  // nesting is bounded (output_grammar::max_depth)
}

TEST_CASE("a schema's properties, required keys, enums and types") {
  const auto g = schema(R"({"type":"object","properties":{"ok":{"type":"boolean"},
      "level":{"enum":["low","high"]},"n":{"type":"integer"}},"required":["ok","level"]})");
  CHECK(accepts(g, R"({"ok":true,"level":"low"})"));
  CHECK(accepts(g, R"({"level":"high","n":-12,"ok":false})"));  // any order
  CHECK_FALSE(accepts(g, R"({"ok":true})"));                      // a required key missing
  CHECK_FALSE(accepts(g, R"({"ok":true,"level":"mid"})"));        // not in the enum
  CHECK_FALSE(accepts(g, R"({"ok":1,"level":"low"})"));           // wrong type
  CHECK_FALSE(accepts(g, R"({"ok":true,"level":"low","n":1.5})"));  // an integer
  CHECK_FALSE(accepts(g, R"({"ok":true,"level":"low","x":1})"));  // no other key by default
  CHECK_FALSE(accepts(g, R"({"ok":true,"ok":true,"level":"low"})"));  // a key twice
  const auto open = schema(R"({"type":"object","properties":{"a":{"type":"null"}},"additionalProperties":true})");
  CHECK(accepts(open, R"({"a":null,"x":[1,{"y":"z"}]})"));
  const auto typed_extra = schema(R"({"type":"object","additionalProperties":{"type":"number"}})");
  CHECK(accepts(typed_extra, R"({"p":1.5e-3,"q":2})"));
  CHECK_FALSE(accepts(typed_extra, R"({"p":"1"})"));
}

TEST_CASE("string lengths, array bounds, nullable types, const") {
  const auto s = schema(R"({"type":"string","minLength":2,"maxLength":3})");
  CHECK(accepts(s, R"("ab")"));
  CHECK(accepts(s, "\"\xc3\xa9" "bc\""));  // characters, not bytes
  CHECK(accepts(s, R"("\u00e9\n")"));     // an escape is one character
  CHECK_FALSE(accepts(s, R"("a")"));
  CHECK_FALSE(accepts(s, R"("abcd")"));
  const auto a = schema(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":2})");
  CHECK(accepts(a, "[1]"));
  CHECK(accepts(a, "[1, 2]"));
  CHECK_FALSE(accepts(a, "[]"));
  CHECK_FALSE(accepts(a, "[1,2,3]"));
  CHECK_FALSE(accepts(a, "[1.5]"));
  const auto n = schema(R"({"type":["string","null"]})");
  CHECK(accepts(n, R"("x")"));
  CHECK(accepts(n, "null"));
  CHECK_FALSE(accepts(n, "1"));
  const auto c = schema(R"({"const":{"v":[1, 2]}})");
  CHECK(accepts(c, R"({"v":[1,2]})"));
  CHECK_FALSE(accepts(c, R"({"v":[1,3]})"));
  const auto num = schema(R"({"anyOf":[{"type":"number"},{"type":"boolean"}]})");
  CHECK(accepts(num, "-0.5E+2"));
  CHECK(accepts(num, "true"));
  CHECK_FALSE(accepts(num, "-"));
  CHECK_FALSE(accepts(num, "1."));
}

TEST_CASE("$ref into $defs, recursion included") {
  const auto g = schema(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}},
      "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v"]}},
      "$ref":"#/$defs/node"})");
  CHECK(accepts(g, R"({"v":1,"kids":[{"v":2,"kids":[]},{"v":3}],"next":{"v":4,"next":null}})"));
  CHECK_FALSE(accepts(g, R"({"kids":[]})"));
  CHECK_FALSE(accepts(g, R"({"v":1,"kids":[{"w":2}]})"));
}

TEST_CASE("what the compiler refuses, with the path at fault") {
  CHECK(compile_error(R"({"type":"object","properties":{"x":{"type":"string","pattern":"^a"}}})")
            .find("$.properties.x: the JSON schema keyword 'pattern' is not supported") != std::string::npos);
  CHECK(compile_error(R"({"anyOf":[{"type":"object"},{"type":"object","properties":{}}]})").find("anyOf") !=
        std::string::npos);
  CHECK(compile_error(R"({"type":"strnig"})").find("unknown type 'strnig'") != std::string::npos);
  CHECK(compile_error(R"({"type":"object","properties":{"a":{}},"required":["b"]})").find("'b'") !=
        std::string::npos);
  CHECK(compile_error(R"({"$ref":"#/$defs/missing"})").find("names no schema") != std::string::npos);
  CHECK(compile_error(R"({"$ref":"http://example.com/s"})").find("only '#'") != std::string::npos);
  CHECK(compile_error(R"({"type":"string","minLength":3,"maxLength":2})").find("minimum") != std::string::npos);
  CHECK(compile_error("false").find("admits no value") != std::string::npos);
  CHECK(compile_error(R"({"title":"T","description":"d","type":"integer"})").empty());  // annotations pass
}

TEST_CASE("response_format objects: text, json_object, json_schema and their errors") {
  simdjson::dom::parser parser;
  const auto parse = [&](const std::string& json, bool nested, output_grammar& g) {
    simdjson::dom::element e;
    REQUIRE(parser.parse(json).get(e) == simdjson::SUCCESS);
    return parse_response_format(e, nested, nested ? "response_format" : "text.format", g);
  };
  output_grammar g;
  CHECK_FALSE(parse(R"({"type":"text"})", true, g));
  CHECK_FALSE(g.active());
  CHECK_FALSE(parse(R"({"type":"json_schema","json_schema":{"name":"a","schema":{"type":"integer"},"strict":true}})",
                    true, g));
  CHECK(g.active());
  output_grammar r;
  CHECK_FALSE(parse(R"({"type":"json_schema","name":"a","schema":{"type":"integer"}})", false, r));
  CHECK(r.active());
  output_grammar bad;
  auto err = parse(R"({"type":"xml"})", true, bad);
  REQUIRE(err);
  CHECK(err->param == "response_format.type");
  err = parse(R"({"type":"json_schema"})", true, bad);
  REQUIRE(err);
  CHECK(err->code == "missing_required_parameter");
  err = parse(R"({"type":"json_schema","schema":{"type":"string","format":"email"}})", false, bad);
  REQUIRE(err);
  CHECK(err->status == 400);
  CHECK(err->param == "text.format.schema");
  CHECK(err->message.find("'format' is not supported") != std::string::npos);
}

/// Token bits of a mask.
bool has(const std::vector<uint64_t>& mask, int32_t id) { return mask[std::size_t(id) / 64] >> (id % 64) & 1; }

TEST_CASE("token masks on a small vocabulary") {
  // ids: 0 end, 1 "{", 2 "}", 3 "\"", 4 "\"ok", 5 "\":", 6 "true", 7 "tr", 8 ",", 9 "abc", 10 "a\"", 11 " ", 12 an added token
  std::vector<std::string> bytes = {"", "{", "}", "\"", "\"ok", "\":", "true", "tr", ",", "abc", "a\"", " ", "<x>"};
  std::vector<bool> added(bytes.size(), false);
  added[12] = true;
  const token_vocab vocab(bytes, added, 0);
  const auto g = schema(R"({"type":"object","properties":{"ok":{"type":"boolean"},"s":{"type":"string"}},"required":["ok"]})");
  json_matcher m;
  auto mask = vocab.allowed(g, m);
  CHECK(has(mask, 1));
  for (int32_t id : {0, 2, 3, 4, 6, 9, 11, 12}) CHECK_FALSE(has(mask, id));
  REQUIRE(m.feed(g, '{'));
  mask = vocab.allowed(g, m);
  CHECK(has(mask, 3));      // a key begins
  CHECK(has(mask, 4));      // "ok
  CHECK(has(mask, 11));     // indentation
  CHECK_FALSE(has(mask, 2));  // "ok" is required
  for (char c : std::string("\"s\":\"")) REQUIRE(m.feed(g, uint8_t(c)));
  mask = vocab.allowed(g, m);  // inside a free string: any plain token, and those that end it
  for (int32_t id : {1, 2, 3, 6, 8, 9, 10, 11}) CHECK(has(mask, id));
  CHECK_FALSE(has(mask, 4));   // "ok would end the string, then 'o' cannot follow
  CHECK_FALSE(has(mask, 12));
  CHECK_FALSE(has(mask, 0));
  for (char c : std::string("x\",\"ok\":true}")) REQUIRE(m.feed(g, uint8_t(c)));
  mask = vocab.allowed(g, m);
  CHECK(has(mask, 0));  // done: only the end
  for (int32_t id = 1; id < vocab.size(); ++id) CHECK_FALSE(has(mask, id));
}

TEST_CASE("the mask is exactly the tokens a matcher takes, tried one by one") {
  const tokenizer& tok = testing::v41();
  const auto vocab = make_token_vocab(tok, tok.eos_id());
  const auto g = schema(R"({"type":"object","properties":{"name":{"type":"string","maxLength":5},
      "n":{"type":"integer"},"any":{}},"required":["name"]})");
  for (const std::string prefix : {"{", "{\"na", "{\"name\":\"", "{\"name\":\"ab\xc3", "{\"name\":\"abcd",
                                   "{\"name\":\"\\u00", "{\"name\":\"x\",\n  \"n\":12", "{\"name\":\"x\",\"any\":[{\"",
                                   "{\"name\":\"x\"}"}) {
    json_matcher m;
    for (char c : prefix) REQUIRE_MESSAGE(m.feed(g, uint8_t(c)), prefix);
    const auto mask = vocab->allowed(g, m);
    int differ = 0;
    for (int32_t id = 0; id < vocab->size(); ++id) {
      bool takes = false;
      if (id == tok.eos_id()) {
        takes = m.can_end(g);
      } else if (!tok.added_token_id(tok.token_bytes(id)) && !vocab->bytes(id).empty()) {
        json_matcher t = m;
        takes = true;
        for (char c : vocab->bytes(id)) takes = takes && t.feed(g, uint8_t(c));
      }
      differ += takes != has(mask, id);
    }
    CHECK_MESSAGE(differ == 0, prefix);
  }
}

/// Random walks over the allowed tokens of the served vocabulary: each ends (the end token
/// allowed only once the value is whole) in a text the schema admits.
TEST_CASE("random walks over V4.1's vocabulary end in values the schema admits") {
  const tokenizer& tok = testing::v41();
  const auto vocab = make_token_vocab(tok, tok.eos_id());
  const auto g = schema(R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},
      "tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":3},"score":{"enum":[0.5,-2]},
      "ok":{"type":"boolean"}},"required":["name","tags","ok"]})");
  std::mt19937 rng(7);
  double mask_ms = 0, worst_ms = 0;
  int masks = 0;
  for (int walk = 0; walk < 20; ++walk) {
    json_matcher m;
    std::string text;
    bool ended = false;
    for (int step = 0; step < 400 && !ended; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto mask = vocab->allowed(g, m);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      mask_ms += ms, worst_ms = std::max(worst_ms, ms);
      ++masks;
      std::vector<int32_t> ids;
      for (int32_t id = 0; id < vocab->size(); ++id)
        if (has(mask, id)) ids.push_back(id);
      REQUIRE_FALSE(ids.empty());
      // prefer closing moves now and then, so that walks end well inside 400 steps
      int32_t pick = ids[std::uniform_int_distribution<std::size_t>(0, ids.size() - 1)(rng)];
      if (step > 30 && rng() % 3 == 0)
        for (int32_t id : ids)
          if (id == tok.eos_id() || vocab->bytes(id).find_first_of("]}\"") != std::string::npos) { pick = id; break; }
      if (pick == tok.eos_id()) {
        ended = true;
        break;
      }
      for (char c : vocab->bytes(pick)) REQUIRE(m.feed(g, uint8_t(c)));
      text += vocab->bytes(pick);
    }
    REQUIRE_MESSAGE(ended, text);
    CHECK(accepts(g, text));
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    REQUIRE_MESSAGE(parser.parse(text).get(doc) == simdjson::SUCCESS, text);
    CHECK(doc["ok"].is_bool());
    CHECK(doc["tags"].is_array());
    std::string_view name;
    REQUIRE(doc["name"].get(name) == simdjson::SUCCESS);
  }
  MESSAGE("token mask: " << mask_ms / masks << " ms on average over " << masks << " masks, " << worst_ms
                          << " ms at most");
}

}  // namespace
}  // namespace cedar::net
