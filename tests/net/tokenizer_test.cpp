// Tokenizer: the published golden ids, BPE against a naive merge loop, the V4.1 table, the
// incremental decoder at every chunking, and bad input (invalid UTF-8, huge strings).
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <thread>

#include "net/bpe.hpp"
#include "net/dsv41_tokens.hpp"
#include "net/pretokenizer.hpp"
#include "net/tokenizer.hpp"
#include "net/utf8.hpp"
#include "tests/net/shared_tokenizers.hpp"

using namespace cedar::net;
using cedar::net::testing::v3;
using cedar::net::testing::v41;

namespace {

// The obvious BPE: merge the lowest-ranked adjacent pair (leftmost first) until none is left.
std::vector<std::string> naive_bpe(std::string_view piece, const std::vector<std::pair<std::string, std::string>>& merges) {
  std::vector<std::string> syms;
  for (char c : piece) syms.emplace_back(1, c);
  for (;;) {
    size_t best_rank = merges.size(), best_pos = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i)
      for (size_t r = 0; r < best_rank; ++r)
        if (merges[r].first == syms[i] && merges[r].second == syms[i + 1]) {
          best_rank = r;
          best_pos = i;
          break;
        }
    if (best_rank == merges.size()) return syms;
    syms[best_pos] += syms[best_pos + 1];
    syms.erase(syms.begin() + static_cast<ptrdiff_t>(best_pos) + 1);
  }
}

}  // namespace

TEST_CASE("golden ids of the published example") {
  // The example of spec §1 (its "！" is U+FF01, and its last word is the byte-level text of
  // "ÑĤÐ²" as printed by the tokenizer's README).
  std::vector<int32_t> want = {19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20, 6113,
                               257, 76589, 131, 100, 76032, 1628, 76589, 131, 108, 76589, 131, 98};
  std::string text = "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ";
  CHECK(v3().encode(text, false) == want);
  CHECK(v41().encode(text, false) == want);
  CHECK(v3().decode(want) == text);
  auto with_bos = v41().encode(text, true);
  CHECK(with_bos.front() == dsv41::bos_id);
  CHECK(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()) == want);
}

TEST_CASE("BPE equals the naive merge loop on random pieces") {
  // A byte-level vocabulary over "abcd" with random merges.
  std::mt19937 rng(7);
  std::vector<std::pair<std::string, int32_t>> vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(bytes_to_byte_level(std::string(1, static_cast<char>(b))), b);
  std::vector<std::string> known = {"a", "b", "c", "d"};
  std::vector<std::pair<std::string, std::string>> merges, byte_level_merges;
  while (merges.size() < 60) {
    std::string l = known[rng() % known.size()], r = known[rng() % known.size()];
    if (l.size() + r.size() > 6) continue;
    bool dup = false;
    for (auto& [ml, mr] : merges) dup |= (ml == l && mr == r) || ml + mr == l + r;
    if (dup) continue;
    merges.emplace_back(l, r);
    byte_level_merges.emplace_back(bytes_to_byte_level(l), bytes_to_byte_level(r));
    known.push_back(l + r);
    vocab.emplace_back(bytes_to_byte_level(l + r), static_cast<int32_t>(vocab.size()));
  }
  bpe_model bpe;
  std::string error;
  REQUIRE_MESSAGE(bpe.init(vocab, byte_level_merges, &error), error);
  for (int trial = 0; trial < 300; ++trial) {
    std::string piece;
    size_t len = 1 + rng() % (trial < 290 ? 24 : 400);  // the last ones exceed the cache limit
    for (size_t i = 0; i < len; ++i) piece.push_back("abcd"[rng() % 4]);
    std::vector<int32_t> ids;
    bpe.encode_piece(piece, &ids);
    std::vector<std::string> got;
    for (int32_t id : ids) got.emplace_back(bpe.bytes_of(id));
    REQUIRE(got == naive_bpe(piece, merges));
    std::vector<int32_t> again;  // second time from the cache
    bpe.encode_piece(piece, &again);
    CHECK(again == ids);
  }
}

TEST_CASE("pre-tokenizer \\s is Unicode White_Space") {
  std::string error;
  auto pre = pretokenizer::from_json(R"({"type":"Split","pattern":{"Regex":"\\s+"},"behavior":"Isolated","invert":false})", &error);
  REQUIRE(pre);
  std::string text = "a\xC2\x85" "b\xE3\x80\x80\xE3\x80\x80" "c\xEF\xBB\xBF" "d";  // NEL, 2 ideographic spaces, BOM
  std::vector<span> pieces;
  pre->split(text, &pieces);
  std::vector<std::string> got;
  for (auto p : pieces) got.push_back(text.substr(p.offset, p.size));
  CHECK(got == std::vector<std::string>{"a", "\xC2\x85", "b", "\xE3\x80\x80\xE3\x80\x80", "c\xEF\xBB\xBF" "d"});
  CHECK(pretokenizer::rewrite_whitespace_escapes(R"([^\s\]]\\s)") == R"([^\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\]]\\s)");
}

TEST_CASE("V4.1 added-token table replaces V3's") {
  const auto& t = v41();
  CHECK(t.added_tokens().size() == 1283);
  CHECK(t.vocab_size() == 129280);
  CHECK(t.added_token_id("<think>") == 128821);
  CHECK(t.added_token_id("</think>") == 128822);
  CHECK(t.added_token_id("｜DSML｜") == 128825);
  CHECK(t.added_token_id("<｜System｜>") == 128799);
  CHECK(t.added_token_id("<｜place▁holder▁no▁799｜>") == std::nullopt);  // V3's 128799 is gone
  CHECK(v3().added_token_id("<｜place▁holder▁no▁799｜>") == 128799);
  auto ids = t.encode("<｜User｜>hi<｜Assistant｜><think>", true);
  CHECK(ids == std::vector<int32_t>{0, 128803, v3().encode("hi", false)[0], 128804, 128821});
  // The DSML marker is one token; the brackets around it are ordinary BPE.
  auto dsml = t.encode("<｜DSML｜ calls>", false);
  CHECK(std::count(dsml.begin(), dsml.end(), 128825) == 1);
  CHECK(t.decode(dsml) == "<｜DSML｜ calls>");
  // Special-token matching can be turned off (user text stays text).
  auto plain = t.encode("<｜User｜>", false, /*match_added=*/false);
  CHECK(std::find(plain.begin(), plain.end(), 128803) == plain.end());
  CHECK(t.decode(plain) == "<｜User｜>");
  CHECK(t.decode({1, 128821}, /*skip_special=*/true).empty());
  std::string why;
  CHECK(dsv41::check_token_ids(t, &why));
  CHECK_FALSE(dsv41::check_token_ids(v3(), &why));
  CHECK(why.find("<｜System｜>") != std::string::npos);
}

TEST_CASE("incremental decoder: whole characters only, nothing lost, at every split") {
  const auto& t = v41();
  std::string text = "naïve 毕老师 👨‍👩‍👧 ok</think>\n\n<｜DSML｜ calls>ÿ€𝄞";
  auto ids = t.encode(text, false);
  for (size_t chunk = 1; chunk <= 4; ++chunk) {
    incremental_decoder dec(t);
    std::string out;
    for (size_t i = 0; i < ids.size(); i += chunk) {
      std::vector<int32_t> part(ids.begin() + static_cast<ptrdiff_t>(i),
                                ids.begin() + static_cast<ptrdiff_t>(std::min(ids.size(), i + chunk)));
      std::string piece = dec.push(part);
      CHECK(valid_utf8_prefix(piece) == piece.size());
      out += piece;
    }
    out += dec.finish();
    CHECK(out == text);
  }
  // A lone byte token that never completes comes out as U+FFFD at the end, not dropped.
  incremental_decoder dec(t);
  auto e4 = t.token_to_id(bytes_to_byte_level("\xE4"));
  REQUIRE(e4);
  CHECK(dec.push(*e4).empty());
  CHECK(dec.num_pending_bytes() == 1);
  CHECK(dec.push(t.encode("a", false)) == "\xEF\xBF\xBD" "a");
}

TEST_CASE("bad input: invalid UTF-8, huge strings, bad files") {
  const auto& t = v3();
  std::string error;
  std::string bad = "ok \xC3\x28 \xED\xA0\x80 \xFF";
  CHECK_FALSE(t.try_encode(bad, false, &error));
  CHECK(error.find("byte 3") != std::string::npos);
  CHECK(t.decode(t.encode(bad, false)) == sanitize_utf8(bad));
  CHECK(sanitize_utf8(bad) == "ok \xEF\xBF\xBD( \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD \xEF\xBF\xBD");

  std::string big;
  std::mt19937 rng(1);
  const char* words[] = {"the ", "模型 ", "données, ", "123456 ", "\n\n", "🙂 "};
  while (big.size() < 10u << 20) big += words[rng() % 6];
  auto ids = t.encode(big, false);
  CHECK(ids.size() > big.size() / 8);
  CHECK(t.decode(ids) == big);
  std::string run(1u << 20, 'a');  // one 1 MiB piece: the heap keeps BPE O(n log n)
  CHECK(t.decode(t.encode(run, false)) == run);

  CHECK_FALSE(tokenizer::load("/nonexistent/tokenizer.json", &error));
  CHECK(error.find("cannot read") != std::string::npos);
  CHECK(t.decode({-5, 1 << 30}).empty());
}

TEST_CASE("one tokenizer, many threads: the same ids as one thread") {
  const auto& t = v41();
  std::vector<std::string> texts;
  std::mt19937 rng(9);
  const char* parts[] = {"hello", " world", "模型", "<｜User｜>", "123456", "\n\n", "😀", " ünïcödé", "</think>", "ab"};
  for (int i = 0; i < 400; ++i) {
    std::string s;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 30); ++k) s += parts[rng() % 10];
    texts.push_back(s + std::string(rng() % 2 ? 300 : 0, 'q'));  // some pieces skip the cache
  }
  std::vector<std::vector<int32_t>> want;
  for (auto& s : texts) want.push_back(t.encode(s, false));
  std::vector<int> num_bad(4, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w)
    threads.emplace_back([&, w] {
      for (int round = 0; round < 3; ++round)
        for (size_t i = w; i < texts.size(); i += 1 + w) num_bad[w] += t.encode(texts[i], false) != want[i];
    });
  for (auto& th : threads) th.join();
  CHECK(num_bad == std::vector<int>(4, 0));
  incremental_decoder dec(t, /*skip_special=*/true);
  CHECK(dec.push(t.encode("<｜User｜>hi</think>", false)) == "hi");
}
