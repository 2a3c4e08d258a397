// An ordered JSON value for the chat encoding: parsed with simdjson, keys kept in the order
// given, numbers kept as written, and written back exactly as Python's
// json.dumps(v, ensure_ascii=False) does (", " and ": " separators), which is what the model saw
// in training for tool schemas and non-string tool arguments. Plain data; any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cedar::net {

struct json_value {
  enum class kind : uint8_t { null, boolean, integer, real, string, array, object };
  kind type = kind::null;
  bool boolean = false;
  std::string text;  ///< string: its UTF-8 contents; integer/real: the number as written
  std::vector<json_value> items;                             ///< array
  std::vector<std::pair<std::string, json_value>> members;  ///< object, in document order

  static json_value of_string(std::string s) {
    json_value v;
    v.type = kind::string;
    v.text = std::move(s);
    return v;
  }
  bool is_string() const { return type == kind::string; }
  bool is_object() const { return type == kind::object; }
  bool is_array() const { return type == kind::array; }
  bool is_null() const { return type == kind::null; }
  /// Member by key (the last one when a key repeats, as Python keeps it), or nullptr.
  const json_value* find(std::string_view key) const;
};

/// Parses JSON text. A repeated key keeps its first position and its last value (Python's
/// dict). Errors (bad JSON, lone surrogate escapes, invalid UTF-8) come back as nullopt + *error.
std::optional<json_value> parse_json(std::string_view text, std::string* error);

/// Appends json.dumps(v, ensure_ascii=False).
void dump_python_json(const json_value& v, std::string* out);
std::string python_json(const json_value& v);
/// Appends a JSON string literal escaped as Python does with ensure_ascii=False.
void append_python_json_string(std::string* out, std::string_view s);
/// Python's repr() of a float, as json.dumps writes it (Infinity, -Infinity, NaN included).
std::string python_float_repr(double x);

}  // namespace cedar::net
