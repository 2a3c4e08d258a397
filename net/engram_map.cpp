// Engram's compressed token map (net/engram_map.hpp), with ICU's normalization and properties.
#include "net/engram_map.hpp"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <stdexcept>
#include <unordered_map>

#include "net/bpe.hpp"
#include "net/tokenizer.hpp"
#include "net/utf8.hpp"

namespace cedar::net {
namespace {

bool is_mark(UChar32 c) {
  const int8_t t = u_charType(c);
  return t == U_NON_SPACING_MARK || t == U_ENCLOSING_MARK || t == U_COMBINING_SPACING_MARK;
}

bool is_collapsed_space(UChar32 c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/// What decode([id]) gives for an added token: the byte-level decoder maps its text to bytes
/// when every character is in the byte alphabet, else keeps the text as it is.
std::string added_token_text(const std::string& content) {
  if (auto bytes = byte_level_to_bytes(content)) return *bytes;
  return content;
}

}  // namespace

std::string engram_normalize(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfkc = icu::Normalizer2::getNFKCInstance(status);
  const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(status);
  if (U_FAILURE(status)) throw std::runtime_error(std::string("ICU normalizers: ") + u_errorName(status));
  icu::UnicodeString s = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), int32_t(text.size())));
  s = nfkc->normalize(s, status);
  s = nfd->normalize(s, status);
  if (U_FAILURE(status)) throw std::runtime_error(std::string("ICU normalize: ") + u_errorName(status));
  // Marks dropped, each character lowercased on its own (no context), whitespace runs folded.
  icu::UnicodeString folded;
  bool in_run = false;
  for (int32_t i = 0; i < s.length(); i = s.moveIndex32(i, 1)) {
    const UChar32 c = s.char32At(i);
    if (is_mark(c)) continue;
    icu::UnicodeString one(c);
    one.toLower(icu::Locale::getRoot());
    for (int32_t j = 0; j < one.length(); j = one.moveIndex32(j, 1)) {
      const UChar32 l = one.char32At(j);
      if (is_collapsed_space(l)) {
        if (!in_run) folded.append(UChar32(' '));
        in_run = true;
      } else {
        folded.append(l);
        in_run = false;
      }
    }
  }
  if (folded != icu::UnicodeString(u" ")) {
    int32_t begin = 0, end = folded.length();
    while (begin < end && u_isUWhiteSpace(folded.char32At(begin))) begin = folded.moveIndex32(begin, 1);
    while (end > begin && u_isUWhiteSpace(folded.char32At(folded.moveIndex32(end, -1))))
      end = folded.moveIndex32(end, -1);
    folded = icu::UnicodeString(folded, begin, end - begin);
  }
  std::string out;
  folded.toUTF8String(out);
  return out;
}

engram_token_map build_engram_token_map(const tokenizer& tok) {
  const int32_t n = tok.vocab_size();
  std::vector<const std::string*> added(std::size_t(n), nullptr);
  for (const added_token& t : tok.added_tokens()) {
    if (t.id >= 0 && t.id < n) added[std::size_t(t.id)] = &t.content;
  }
  auto map = std::make_shared<std::vector<int32_t>>(std::size_t(n));
  std::unordered_map<std::string, int32_t> ids_by_key;
  ids_by_key.reserve(std::size_t(n));
  for (int32_t id = 0; id < n; ++id) {
    const std::string* content = added[std::size_t(id)];
    const std::string bytes = content ? added_token_text(*content) : std::string(tok.token_bytes(id));
    const std::string text = sanitize_utf8(bytes);
    std::string key;
    if (text.find("\xEF\xBF\xBD") != std::string::npos) {
      key = content ? *content : bytes_to_byte_level(bytes);  // the token's own string
    } else {
      key = engram_normalize(text);
      if (key.empty()) key = text;
    }
    const auto [it, fresh] = ids_by_key.try_emplace(std::move(key), int32_t(ids_by_key.size()));
    (*map)[std::size_t(id)] = it->second;
  }
  return {std::move(map), int32_t(ids_by_key.size())};
}

bool attach_engram_token_map(model_args& args, const tokenizer& tok, std::string* error) {
  if (args.engram_layer_ids.empty()) return true;
  if (tok.vocab_size() < args.vocab_size) {
    *error = "Engram token map: the tokenizer has " + std::to_string(tok.vocab_size()) + " ids, the model " +
             std::to_string(args.vocab_size);
    return false;
  }
  engram_token_map built = build_engram_token_map(tok);
  if (built.classes != args.engram_compressed_vocab_size) {
    *error = "Engram token map: the tokenizer folds into " + std::to_string(built.classes) +
             " classes, config.json says engram_compressed_vocab_size " +
             std::to_string(args.engram_compressed_vocab_size) + " (is this the checkpoint's tokenizer?)";
    return false;
  }
  args.engram_token_map = std::move(built.map);
  return true;
}

}  // namespace cedar::net
