// Pre-tokenization of a tokenizer.json: the Split regexes (PCRE2, UTF + UCP, JIT-compiled)
// and ByteLevel steps, applied in order to cut text into pieces for BPE. Built once at load;
// split() is const and thread-safe (each call uses its own PCRE2 match data).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cedar::net {

/// A piece of the input: [offset, offset + size) in bytes.
struct span {
  uint32_t offset = 0;
  uint32_t size = 0;
};

class pretokenizer {
 public:
  /// Builds from the JSON text of the "pre_tokenizer" object ("null" for none). Returns
  /// nullptr and sets *error for a kind it does not implement.
  static std::unique_ptr<pretokenizer> from_json(std::string_view json, std::string* error);
  ~pretokenizer();

  /// Cuts valid UTF-8 `text` into pieces, appended to *out in order; they cover the text.
  void split(std::string_view text, std::vector<span>* out) const;

  /// Rewrites \s and \S to Unicode White_Space (what tokenizer.json's Oniguruma/Rust regexes
  /// mean by them; PCRE2's UCP \s leaves out U+0085). Exposed for tests.
  static std::string rewrite_whitespace_escapes(std::string_view pattern);

  struct step;

 private:
  pretokenizer() = default;
  std::vector<std::unique_ptr<step>> steps_;
};

}  // namespace cedar::net
