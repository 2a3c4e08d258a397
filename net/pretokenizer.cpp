// Pre-tokenizer steps of tokenizer.json. Supported: Sequence, Split (Regex or String pattern;
// Isolated, Removed, MergedWithPrevious, MergedWithNext) and ByteLevel (its optional GPT-2
// regex). The byte-to-character mapping of ByteLevel is folded into the BPE (net/bpe.cpp).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "net/pretokenizer.hpp"

#include <pcre2.h>
#include <simdjson.h>

namespace cedar::net {

namespace {

// Unicode White_Space, as Rust's regex and Oniguruma define \s.
constexpr std::string_view kWhiteSpaceRanges =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

enum class behavior { isolated, removed, merged_with_previous, merged_with_next };

}  // namespace

struct pretokenizer::step {
  pcre2_code* code = nullptr;
  behavior how = behavior::isolated;

  ~step() { pcre2_code_free(code); }

  /// Splits one piece of `text`, appending the results to *out.
  void apply(std::string_view text, span piece, pcre2_match_data* md, std::vector<span>* out) const {
    auto subject = reinterpret_cast<PCRE2_SPTR>(text.data() + piece.offset);
    PCRE2_SIZE len = piece.size, start = 0, piece_start = 0;
    auto emit = [&](PCRE2_SIZE from, PCRE2_SIZE to) {
      if (to > from) out->push_back(span{piece.offset + static_cast<uint32_t>(from), static_cast<uint32_t>(to - from)});
    };
    while (start < len) {
      int rc = pcre2_jit_match(code, subject, len, start, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_JIT_BADOPTION)
        rc = pcre2_match(code, subject, len, start, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      PCRE2_SIZE m0 = ov[0], m1 = ov[1];
      if (m1 == m0) {  // empty match: step one character and keep looking
        start = m0 + 1;
        while (start < len && (subject[start] & 0xC0) == 0x80) ++start;
        continue;
      }
      switch (how) {
        case behavior::isolated: emit(piece_start, m0); emit(m0, m1); piece_start = m1; break;
        case behavior::removed: emit(piece_start, m0); piece_start = m1; break;
        case behavior::merged_with_previous: emit(piece_start, m1); piece_start = m1; break;
        case behavior::merged_with_next: emit(piece_start, m0); piece_start = m0; break;
      }
      start = m1;
    }
    emit(piece_start, len);
  }
};

std::string pretokenizer::rewrite_whitespace_escapes(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceRanges) : "[" + std::string(kWhiteSpaceRanges) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpaceRanges) + "]";
      } else {
        out.push_back('\\');
        out.push_back(e);
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal member, not the end.
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out.push_back(c);
  }
  return out;
}

namespace {

std::unique_ptr<pretokenizer::step> compile_step(std::string_view pattern, bool literal, behavior how,
                                                 std::string* error) {
  std::string source = literal ? std::string(pattern) : pretokenizer::rewrite_whitespace_escapes(pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  uint32_t flags = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0u);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), flags,
                                   &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    *error = "pre_tokenizer regex does not compile at offset " + std::to_string(err_off) + ": " +
             reinterpret_cast<char*>(msg);
    return nullptr;
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
  auto s = std::make_unique<pretokenizer::step>();
  s->code = code;
  s->how = how;
  return s;
}

bool add_steps(simdjson::dom::element node, std::vector<std::unique_ptr<pretokenizer::step>>* steps,
               std::string* error) {
  if (node.is_null()) return true;
  std::string_view type;
  if (node["type"].get(type)) {
    *error = "pre_tokenizer without a type";
    return false;
  }
  if (type == "Sequence") {
    simdjson::dom::array list;
    if (node["pretokenizers"].get(list)) {
      *error = "pre_tokenizer Sequence without pretokenizers";
      return false;
    }
    for (auto child : list)
      if (!add_steps(child, steps, error)) return false;
    return true;
  }
  if (type == "ByteLevel") {
    bool prefix = false, use_regex = true;
    if (node["add_prefix_space"].get(prefix)) {}  // optional field
    if (node["use_regex"].get(use_regex)) {}  // optional field
    if (prefix) {
      *error = "ByteLevel pre_tokenizer with add_prefix_space=true is not supported";
      return false;
    }
    if (use_regex) {
      auto s = compile_step(kGpt2Pattern, false, behavior::isolated, error);
      if (!s) return false;
      steps->push_back(std::move(s));
    }
    return true;
  }
  if (type == "Split") {
    std::string_view how_name, pattern;
    bool invert = false;
    if (node["behavior"].get(how_name)) {}  // optional field
    if (node["invert"].get(invert)) {}  // optional field
    bool literal = false;
    if (!node["pattern"]["Regex"].get(pattern)) {
      literal = false;
    } else if (!node["pattern"]["String"].get(pattern)) {
      literal = true;
    } else {
      *error = "Split pre_tokenizer without a Regex or String pattern";
      return false;
    }
    behavior how;
    if (how_name == "Isolated") how = behavior::isolated;
    else if (how_name == "Removed") how = behavior::removed;
    else if (how_name == "MergedWithPrevious") how = behavior::merged_with_previous;
    else if (how_name == "MergedWithNext") how = behavior::merged_with_next;
    else {
      *error = "Split behavior '" + std::string(how_name) + "' is not supported";
      return false;
    }
    if (invert) {
      *error = "Split with invert=true is not supported";
      return false;
    }
    auto s = compile_step(pattern, literal, how, error);
    if (!s) return false;
    steps->push_back(std::move(s));
    return true;
  }
  *error = "pre_tokenizer type '" + std::string(type) + "' is not supported";
  return false;
}

}  // namespace

std::unique_ptr<pretokenizer> pretokenizer::from_json(std::string_view json, std::string* error) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(json.data(), json.size()).get(root)) {
    *error = "pre_tokenizer is not valid JSON";
    return nullptr;
  }
  std::unique_ptr<pretokenizer> p(new pretokenizer());
  if (!add_steps(root, &p->steps_, error)) return nullptr;
  return p;
}

pretokenizer::~pretokenizer() = default;

void pretokenizer::split(std::string_view text, std::vector<span>* out) const {
  std::vector<span> cur{span{0, static_cast<uint32_t>(text.size())}}, next;
  if (text.empty()) return;
  for (const auto& s : steps_) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(s->code, nullptr);
    next.clear();
    for (span piece : cur) s->apply(text, piece, md, &next);
    pcre2_match_data_free(md);
    cur.swap(next);
  }
  out->insert(out->end(), cur.begin(), cur.end());
}

}  // namespace cedar::net
