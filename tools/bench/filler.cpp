// Filler words: a fixed list of short common words, each one BPE token with its leading space.
#include "tools/bench/filler.hpp"

#include <cstdio>

#include "kernels/fnv1a.hpp"

namespace cedar::bench {
namespace {

constexpr const char* kWords[] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "that",  "for",   "it",    "as",
    "was",   "with",  "be",    "by",    "on",    "not",   "he",    "this",  "are",   "or",
    "his",   "from",  "at",    "which", "but",   "have",  "an",    "had",   "they",  "you",
    "were",  "their", "one",   "all",   "we",    "can",   "her",   "has",   "there", "been",
    "if",    "more",  "when",  "will",  "would", "who",   "so",    "no",    "out",   "up",
    "into",  "do",    "any",   "your",  "what",  "some",  "about", "than",  "them",  "then",
    "time",  "only",  "new",   "like",  "other", "could", "our",   "my",    "also",  "may",
    "these", "two",   "first", "after", "most",  "over",  "made",  "such",  "where", "many",
    "must",  "through", "back", "years", "work", "well",  "way",   "even",  "because", "good",
    "each",  "those", "people", "very", "make",  "should", "still", "world", "own",  "see",
    "state", "just",  "both",  "use",   "used",  "year",  "how",   "long",  "said",  "down",
    "under", "last",  "never", "day",   "same",  "another", "know", "while", "might", "great",
    "old",   "off",   "come",  "since", "against", "go",  "came",  "right", "three", "take",
};
constexpr uint64_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

void append_words(std::string& out, uint64_t seed, int64_t num_words) {
  uint64_t state = seed;
  for (int64_t i = 0; i < num_words; ++i) {
    out += ' ';
    out += kWords[splitmix64(state) % kNumWords];
  }
}

void append_block(std::string& out, uint64_t scope, int64_t id) {
  uint64_t seed = scope ^ (uint64_t(id) * 0x2545f4914f6cdd1dULL);
  append_words(out, seed, kWordsPerBlock);
}

int64_t count_words(std::string_view text) {
  int64_t n = 0;
  bool in_word = false;
  for (char c : text) {
    bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    if (!space && !in_word) ++n;
    in_word = !space;
  }
  return n;
}

uint64_t hash_string(std::string_view s) { return fnv1a().add(s.data(), s.size()).value(); }

std::string session_marker(uint64_t seed) {
  uint64_t state = seed;
  char buf[32];
  std::snprintf(buf, sizeof buf, "[rid:%012llx]",
                (unsigned long long)(splitmix64(state) & 0xffffffffffffULL));
  return buf;
}

}  // namespace cedar::bench
