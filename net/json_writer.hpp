// A small JSON writer for everything net/ sends: appends to one std::string, escapes strings
// (invalid UTF-8 becomes U+FFFD, so output is always valid JSON). Used on connection strands;
// one writer per message, no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace cedar::net {

/// Appends `text` to `out` as a JSON string literal (with quotes).
void append_json_string(std::string& out, std::string_view text);

/// Streaming builder: obj()/end_obj(), arr()/end_arr(), key(), and value calls. Commas are
/// inserted automatically.
class json_writer {
 public:
  json_writer& obj() { sep(); out_ += '{'; first_ = true; return *this; }
  json_writer& end_obj() { out_ += '}'; first_ = false; return *this; }
  json_writer& arr() { sep(); out_ += '['; first_ = true; return *this; }
  json_writer& end_arr() { out_ += ']'; first_ = false; return *this; }
  json_writer& key(std::string_view k) {
    sep(); append_json_string(out_, k); out_ += ':'; after_key_ = true; return *this;
  }
  json_writer& str(std::string_view v) { sep(); append_json_string(out_, v); return *this; }
  json_writer& num(int64_t v) { sep(); out_ += std::to_string(v); return *this; }
  json_writer& num(double v);
  json_writer& boolean(bool v) { sep(); out_ += v ? "true" : "false"; return *this; }
  json_writer& null() { sep(); out_ += "null"; return *this; }
  /// Inserts already-serialized JSON.
  json_writer& raw(std::string_view json) { sep(); out_ += json; return *this; }

  json_writer& kv(std::string_view k, std::string_view v) { return key(k).str(v); }
  json_writer& kv(std::string_view k, const char* v) { return key(k).str(v); }
  json_writer& kv(std::string_view k, int64_t v) { return key(k).num(v); }
  json_writer& kv(std::string_view k, int v) { return key(k).num(int64_t{v}); }
  json_writer& kv(std::string_view k, double v) { return key(k).num(v); }
  json_writer& kv(std::string_view k, bool v) { return key(k).boolean(v); }

  const std::string& str() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void sep() {
    if (after_key_) { after_key_ = false; first_ = false; return; }
    if (!first_ && !out_.empty()) out_ += ',';
    first_ = false;
  }
  std::string out_;
  bool first_ = true;
  bool after_key_ = false;
};

}  // namespace cedar::net
