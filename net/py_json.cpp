// Ordered JSON parse (simdjson on-demand, raw number text kept) and Python-exact json.dumps.
#include "net/py_json.hpp"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "net/utf8.hpp"

namespace cedar::net {

const json_value* json_value::find(std::string_view key) const {
  for (auto it = members.rbegin(); it != members.rend(); ++it)
    if (it->first == key) return &it->second;
  return nullptr;
}

namespace {

namespace od = simdjson::ondemand;

bool fail(std::string* error, std::string msg) {
  if (error) *error = std::move(msg);
  return false;
}

// JSON's number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
bool is_json_number(std::string_view s) {
  size_t i = 0;
  auto digits = [&] {
    size_t from = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i > from;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') ++i;
  else if (!digits()) return false;
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == s.size();
}

bool convert_number(std::string_view raw, json_value* out, std::string* error) {
  while (!raw.empty() && (raw.back() == ' ' || raw.back() == '\n' || raw.back() == '\r' || raw.back() == '\t'))
    raw.remove_suffix(1);
  if (!is_json_number(raw)) return fail(error, "invalid JSON number '" + std::string(raw.substr(0, 40)) + "'");
  bool real = raw.find_first_of(".eE") != std::string_view::npos;
  out->type = real ? json_value::kind::real : json_value::kind::integer;
  out->text = raw == "-0" ? "0" : std::string(raw);  // Python's int has no negative zero
  return true;
}

bool convert(od::value v, json_value* out, std::string* error, int depth) {
  if (depth > 512) return fail(error, "JSON nested too deeply");
  od::json_type t;
  if (v.type().get(t)) return fail(error, "invalid JSON value");
  switch (t) {
    case od::json_type::null: {
      bool is_null = false;
      if (v.is_null().get(is_null) || !is_null) return fail(error, "invalid JSON literal");
      out->type = json_value::kind::null;
      return true;
    }
    case od::json_type::boolean: {
      bool b;
      if (v.get_bool().get(b)) return fail(error, "invalid JSON literal");
      out->type = json_value::kind::boolean;
      out->boolean = b;
      return true;
    }
    case od::json_type::number: {
      // Kept as written: big integers stay exact (Python ints), reals are printed by repr.
      return convert_number(v.raw_json_token(), out, error);
    }
    case od::json_type::string: {
      std::string_view s;
      if (v.get_string().get(s)) return fail(error, "invalid JSON string (bad escape or lone surrogate)");
      if (valid_utf8_prefix(s) != s.size()) return fail(error, "JSON string is not valid UTF-8");
      out->type = json_value::kind::string;
      out->text = std::string(s);
      return true;
    }
    case od::json_type::array: {
      od::array arr;
      if (v.get_array().get(arr)) return fail(error, "invalid JSON array");
      out->type = json_value::kind::array;
      for (auto item : arr) {
        od::value iv;
        if (item.get(iv)) return fail(error, "invalid JSON array item");
        out->items.emplace_back();
        if (!convert(iv, &out->items.back(), error, depth + 1)) return false;
      }
      return true;
    }
    case od::json_type::object: {
      od::object obj;
      if (v.get_object().get(obj)) return fail(error, "invalid JSON object");
      out->type = json_value::kind::object;
      for (auto field : obj) {
        std::string_view key;
        od::value fv;
        if (field.unescaped_key().get(key) || field.value().get(fv)) return fail(error, "invalid JSON object member");
        if (valid_utf8_prefix(key) != key.size()) return fail(error, "JSON key is not valid UTF-8");
        json_value member;
        if (!convert(fv, &member, error, depth + 1)) return false;
        bool replaced = false;
        for (auto& [k, existing] : out->members)
          if (k == key) {
            existing = std::move(member);
            replaced = true;
            break;
          }
        if (!replaced) out->members.emplace_back(std::string(key), std::move(member));
      }
      return true;
    }
  }
  return fail(error, "invalid JSON value");
}

}  // namespace

std::optional<json_value> parse_json(std::string_view text, std::string* error) {
  // Wrapped in [ ] so that scalar documents read like any value. The on-demand parser stops at
  // the end of its first value, so the whole text is validated first: "[1, 2]]" and "1],[2"
  // are not JSON values.
  std::string wrapped;
  wrapped.reserve(text.size() + 2 + simdjson::SIMDJSON_PADDING);
  wrapped.append("[").append(text).append("]");
  od::parser parser;
  simdjson::padded_string padded(wrapped);
  od::document doc;
  od::value root;
  json_value out;
  std::string why;
  bool ok = false;
  try {  // simdjson reports through error codes here; a throw would be its bug, still not a crash
    simdjson::dom::parser validator;
    if (validator.parse(padded).error()) {
      fail(error, "invalid JSON");
      return std::nullopt;
    }
    ok = !parser.iterate(padded).get(doc) && !doc.get_value().get(root) && convert(root, &out, &why, -1) &&
         out.items.size() == 1;
  } catch (const std::exception& e) {
    why = std::string("invalid JSON: ") + e.what();
  }
  if (!ok) {
    fail(error, why.empty() ? "invalid JSON" : why);
    return std::nullopt;
  }
  return std::move(out.items[0]);
}

void append_python_json_string(std::string* out, std::string_view s) {
  out->push_back('"');
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

std::string python_float_repr(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // shortest round-trip digits: "-d.ddde+XX"
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exp10 = std::atoi(sci.c_str() + e + 1);
  int decpt = exp10 + 1;  // digits "d1d2..." mean 0.d1d2... x 10^decpt
  std::string out = negative ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += ebuf;
  }
  return out;
}

void dump_python_json(const json_value& v, std::string* out) {
  switch (v.type) {
    case json_value::kind::null: *out += "null"; return;
    case json_value::kind::boolean: *out += v.boolean ? "true" : "false"; return;
    case json_value::kind::integer: *out += v.text; return;
    case json_value::kind::real: *out += python_float_repr(std::strtod(v.text.c_str(), nullptr)); return;
    case json_value::kind::string: append_python_json_string(out, v.text); return;
    case json_value::kind::array:
      out->push_back('[');
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (i) *out += ", ";
        dump_python_json(v.items[i], out);
      }
      out->push_back(']');
      return;
    case json_value::kind::object:
      out->push_back('{');
      for (size_t i = 0; i < v.members.size(); ++i) {
        if (i) *out += ", ";
        append_python_json_string(out, v.members[i].first);
        *out += ": ";
        dump_python_json(v.members[i].second, out);
      }
      out->push_back('}');
      return;
  }
}

std::string python_json(const json_value& v) {
  std::string out;
  dump_python_json(v, &out);
  return out;
}

}  // namespace cedar::net
