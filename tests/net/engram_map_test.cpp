// Engram's compressed token map (spec §2.8): the class count of the V4.1 tokenizer against the
// checkpoint's engram_compressed_vocab_size, the normalizer's rules one by one, which ids fold
// together, and the checks that keep a wrong tokenizer from serving a checkpoint.
#include <doctest/doctest.h>

#include <set>

#include "config/model_config.hpp"
#include "net/bpe.hpp"
#include "net/engram_map.hpp"
#include "net/tokenizer.hpp"
#include "tests/net/shared_tokenizers.hpp"

using namespace cedar;
using namespace cedar::net;
using cedar::net::testing::v41;

namespace {

const engram_token_map& v41_map() {
  static const engram_token_map m = build_engram_token_map(v41());
  return m;
}

int32_t id_of(const std::string& bytes) {
  const auto id = v41().token_to_id(bytes_to_byte_level(bytes));
  REQUIRE_MESSAGE(id, bytes);
  return *id;
}

}  // namespace

TEST_CASE("the V4.1 tokenizer folds into the checkpoint's 99,092 Engram classes") {
  const engram_token_map& m = v41_map();
  REQUIRE(m.map);
  CHECK(m.map->size() == 129280);
  CHECK(m.classes == 99092);
  // Ids are handed out in order of first appearance: dense, and each class starts at a new max.
  int32_t next = 0;
  for (int32_t c : *m.map) {
    CHECK_MESSAGE(c <= next, c);
    if (c == next) ++next;
  }
  CHECK(next == m.classes);
}

TEST_CASE("engram_normalize: NFKC, NFD, no marks, per-character lowercase, folded and stripped spaces") {
  CHECK(engram_normalize("Hello") == "hello");
  CHECK(engram_normalize(" Hello") == "hello");               // leading space stripped
  CHECK(engram_normalize("Caf\xC3\xA9") == "cafe");            // precomposed e-acute loses its accent
  CHECK(engram_normalize("Cafe\xCC\x81") == "cafe");           // so does a combining one
  CHECK(engram_normalize("\xEF\xBC\xA1\xEF\xBC\xA2") == "ab");  // fullwidth letters (NFKC)
  CHECK(engram_normalize("\xEF\xAC\x81") == "fi");             // the fi ligature
  CHECK(engram_normalize("\xCE\xA3") == "\xCF\x83");           // capital sigma -> sigma, never final sigma
  CHECK(engram_normalize("\xC4\xB0") == "i");                  // dotted capital I: NFD, dot dropped
  CHECK(engram_normalize("\xE0\xA4\x95\xE0\xA4\xBE") == "\xE0\xA4\x95");  // a spacing mark (Mc) goes too
  CHECK(engram_normalize(" ") == " ");                         // a lone space stays a space
  CHECK(engram_normalize("\t\n  ") == " ");                    // so does any run of [ \t\r\n]
  CHECK(engram_normalize("\xC2\xA0") == " ");                  // no-break space: NFKC makes it " "
  CHECK(engram_normalize("  a \t b\n") == "a b");
  CHECK(engram_normalize("\x0B") == "");                       // vertical tab: whitespace, not folded
  CHECK(engram_normalize("\xE3\x80\x80x") == "x");             // ideographic space -> " " -> stripped
  CHECK(engram_normalize("") == "");
}

TEST_CASE("the map folds case, accents and a leading space, and keeps the rest apart") {
  const auto& map = *v41_map().map;
  const int32_t hello = id_of("hello");
  CHECK(map[hello] == map[id_of("Hello")]);
  CHECK(map[hello] == map[id_of(" hello")]);
  CHECK(map[hello] == map[id_of(" Hello")]);
  CHECK(map[hello] != map[id_of("help")]);
  CHECK(map[id_of("the")] == map[id_of(" The")]);
  CHECK(map[id_of("\n")] == map[id_of(" ")]);  // both fold to " "
  // Tokens that are not whole UTF-8 keep their own byte-level strings: one class each.
  std::set<int32_t> partial;
  int partial_tokens = 0;
  for (int b = 0x80; b < 0x100; ++b) {
    const auto id = v41().token_to_id(bytes_to_byte_level(std::string(1, char(b))));
    if (!id) continue;
    ++partial_tokens;
    partial.insert(map[*id]);
  }
  CHECK(partial_tokens > 64);
  CHECK(int(partial.size()) == partial_tokens);
  // Control tokens are their own classes, and the pad (id 2) keeps one.
  std::set<int32_t> controls;
  for (int32_t id = 128000; id < 129280; ++id) controls.insert(map[id]);
  CHECK(controls.size() == 1280);
}

TEST_CASE("attach_engram_token_map: the map goes on the model, a mismatch is refused") {
  std::string error;
  auto args = load_model_args("micro", &error);
  REQUIRE_MESSAGE(args, error);
  CHECK_FALSE(args->engram_token_map);  // configs alone hash token ids
  SUBCASE("the tokenizer's map") {
    REQUIRE(attach_engram_token_map(*args, v41(), &error));
    REQUIRE(args->engram_token_map);
    CHECK(*args->engram_token_map == *v41_map().map);
  }
  SUBCASE("a class count other than the config's is refused, naming both") {
    args->engram_compressed_vocab_size = 99000;
    CHECK_FALSE(attach_engram_token_map(*args, v41(), &error));
    CHECK(error.find("99092") != std::string::npos);
    CHECK(error.find("99000") != std::string::npos);
    CHECK_FALSE(args->engram_token_map);
  }
  SUBCASE("a tokenizer smaller than the model's vocabulary is refused") {
    args->vocab_size = 200000;
    CHECK_FALSE(attach_engram_token_map(*args, v41(), &error));
    CHECK(error.find("200000") != std::string::npos);
  }
  SUBCASE("a model without Engram needs no map") {
    args->engram_layer_ids.clear();
    CHECK(attach_engram_token_map(*args, v41(), &error));
    CHECK_FALSE(args->engram_token_map);
  }
}
