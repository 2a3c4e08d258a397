// JSON schema -> output_grammar (see response_format.hpp).
#include "net/response_format.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "net/tokenizer.hpp"

namespace cedar::net {

namespace dom = simdjson::dom;

namespace {

/// Most nodes one schema may compile to.
constexpr std::size_t max_nodes = 4096;

const std::set<std::string_view>& annotations() {
  static const std::set<std::string_view> s = {"title", "description", "default", "examples", "$schema",
                                               "$id", "$comment", "$defs", "definitions"};
  return s;
}
const std::set<std::string_view>& keywords() {
  static const std::set<std::string_view> s = {"type", "properties", "required", "additionalProperties", "items",
                                               "minItems", "maxItems", "minLength", "maxLength", "enum",
                                               "const", "anyOf", "oneOf", "$ref"};
  return s;
}

class schema_compiler {
 public:
  schema_compiler(dom::element root, output_grammar& g) : root_(root), g_(g) {}

  std::string run() {
    const int32_t root = compile(root_, "$");
    if (!error_.empty()) return error_;
    for (const auto& [node, path] : any_of_paths_)  // every $ref resolved: the branches' first bytes
      for (int c = 0; c < 256; ++c) {
        int starts = 0;
        for (int32_t b : g_.nodes[std::size_t(node)].children) starts += value_may_start(g_, b, uint8_t(c));
        if (starts > 1)
          return path + ": anyOf / oneOf branches that can begin with the same character ('" +
                 std::string(1, char(c)) + "') are not supported";
      }
    g_.root = root;
    return {};
  }

 private:
  int32_t fail(const std::string& path, const std::string& why) {
    if (error_.empty()) error_ = path + ": " + why;
    return -1;
  }

  int32_t add(grammar_node n, const std::string& path) {
    if (g_.nodes.size() >= max_nodes) return fail(path, "the schema is too large (over 4096 nodes)");
    return g_.add(std::move(n));
  }

  bool get_count(dom::object o, std::string_view key, const std::string& path, int32_t& out) {
    dom::element e;
    if (o.at_key(key).get(e) != simdjson::SUCCESS) return true;
    if (!e.is_int64() || e.get_int64().value_unsafe() < 0 || e.get_int64().value_unsafe() > (1 << 30))
      return fail(path + "." + std::string(key), "must be a non-negative integer"), false;
    out = int32_t(e.get_int64().value_unsafe());
    return true;
  }

  int32_t compile(dom::element e, const std::string& path) {
    if (!error_.empty()) return -1;
    bool b = false;
    if (e.get(b) == simdjson::SUCCESS) return b ? g_.any_value() : fail(path, "the schema false admits no value");
    dom::object o;
    if (e.get(o) != simdjson::SUCCESS) return fail(path, "a schema must be an object or a boolean");
    for (auto [key, value] : o)
      if (!keywords().count(key) && !annotations().count(key))
        return fail(path, "the JSON schema keyword '" + std::string(key) + "' is not supported");
    dom::element x;
    if (o.at_key("$ref").get(x) == simdjson::SUCCESS) return ref(x, path);
    if (o.at_key("enum").get(x) == simdjson::SUCCESS) return literals(x, false, path + ".enum");
    if (o.at_key("const").get(x) == simdjson::SUCCESS) return literals(x, true, path + ".const");
    for (auto key : {"anyOf", "oneOf"})
      if (o.at_key(key).get(x) == simdjson::SUCCESS) return branches(x, path + "." + key);
    if (o.at_key("type").get(x) != simdjson::SUCCESS) {  // no type: what its keywords imply
      if (o.at_key("properties").get(x) == simdjson::SUCCESS) return typed(o, "object", path);
      if (o.at_key("items").get(x) == simdjson::SUCCESS) return typed(o, "array", path);
      return g_.any_value();
    }
    std::string_view t;
    if (x.get(t) == simdjson::SUCCESS) return typed(o, t, path);
    dom::array types;
    if (x.get(types) != simdjson::SUCCESS || types.size() == 0)
      return fail(path + ".type", "must be a type name or a non-empty list of them");
    grammar_node alt;
    alt.kind = grammar_node::any_of;
    bool number = false;
    for (dom::element te : types) {
      if (te.get(t) != simdjson::SUCCESS) return fail(path + ".type", "must list type names");
      if (t == "number" || t == "integer") {  // one number node: integers are numbers
        if (number) continue;
        number = true;
        const bool both = std::any_of(types.begin(), types.end(), [](dom::element y) {
          std::string_view s;
          return y.get(s) == simdjson::SUCCESS && s == "number";
        });
        if (both) t = "number";
      }
      const int32_t n = typed(o, t, path);
      if (n < 0) return -1;
      alt.children.push_back(n);
    }
    if (alt.children.size() == 1) return alt.children[0];
    const int32_t n = add(std::move(alt), path);
    if (n >= 0) any_of_paths_.emplace_back(n, path + ".type");
    return n;
  }

  int32_t typed(dom::object o, std::string_view type, const std::string& path) {
    grammar_node n;
    if (type == "object") return object(o, path);
    if (type == "array") {
      n.kind = grammar_node::array;
      dom::element items;
      const int32_t item = o.at_key("items").get(items) == simdjson::SUCCESS ? compile(items, path + ".items")
                                                                             : g_.any_value();
      if (item < 0) return -1;
      n.children = {item};
      if (!get_count(o, "minItems", path, n.min_count) || !get_count(o, "maxItems", path, n.max_count)) return -1;
    } else if (type == "string") {
      n.kind = grammar_node::string;
      if (!get_count(o, "minLength", path, n.min_count) || !get_count(o, "maxLength", path, n.max_count)) return -1;
    } else if (type == "number" || type == "integer") {
      n.kind = type == "number" ? grammar_node::number : grammar_node::integer;
    } else if (type == "boolean" || type == "null") {
      n.kind = grammar_node::literal;
      n.names = type == "null" ? std::vector<std::string>{"null"} : std::vector<std::string>{"true", "false"};
    } else {
      return fail(path + ".type", "unknown type '" + std::string(type) + "'");
    }
    if (n.max_count >= 0 && n.min_count > n.max_count)
      return fail(path, "the minimum count is above the maximum");
    return add(std::move(n), path);
  }

  int32_t object(dom::object o, const std::string& path) {
    grammar_node n;
    n.kind = grammar_node::object;
    dom::element x;
    dom::object props;
    if (o.at_key("properties").get(x) == simdjson::SUCCESS) {
      if (x.get(props) != simdjson::SUCCESS) return fail(path + ".properties", "must be an object");
      for (auto [name, schema] : props) {
        if (n.names.size() == std::size_t(output_grammar::max_names))
          return fail(path + ".properties", "more than 64 properties are not supported");
        if (std::any_of(name.begin(), name.end(), [](char c) { return c == '"' || c == '\\' || uint8_t(c) < 0x20; }))
          return fail(path + ".properties", "a property name with a quote, backslash or control character is not supported");
        const int32_t child = compile(schema, path + ".properties." + std::string(name));
        if (child < 0) return -1;
        n.names.emplace_back(name);
        n.children.push_back(child);
      }
    }
    if (o.at_key("required").get(x) == simdjson::SUCCESS) {
      dom::array req;
      if (x.get(req) != simdjson::SUCCESS) return fail(path + ".required", "must be an array of property names");
      for (dom::element r : req) {
        std::string_view name;
        if (r.get(name) != simdjson::SUCCESS) return fail(path + ".required", "must be an array of property names");
        const auto it = std::find(n.names.begin(), n.names.end(), name);
        if (it == n.names.end())
          return fail(path + ".required", "'" + std::string(name) + "' is not one of the properties");
        n.required |= uint64_t{1} << (it - n.names.begin());
      }
    }
    if (o.at_key("additionalProperties").get(x) == simdjson::SUCCESS) {
      bool allowed = false;
      if (x.get(allowed) != simdjson::SUCCESS || allowed) {
        n.extra = compile(x, path + ".additionalProperties");
        if (n.extra < 0) return -1;
      }
    } else if (n.names.empty()) {
      n.extra = g_.any_value();  // {"type": "object"} alone: any object
    }
    return add(std::move(n), path);
  }

  int32_t literals(dom::element x, bool one, const std::string& path) {
    grammar_node n;
    n.kind = grammar_node::literal;
    dom::array values;
    if (one) {
      n.names.push_back(simdjson::minify(x));
    } else {
      if (x.get(values) != simdjson::SUCCESS || values.size() == 0) return fail(path, "must be a non-empty array");
      for (dom::element v : values) n.names.push_back(simdjson::minify(v));
    }
    if (n.names.size() > std::size_t(output_grammar::max_names)) return fail(path, "more than 64 values are not supported");
    return add(std::move(n), path);
  }

  int32_t branches(dom::element x, const std::string& path) {
    dom::array list;
    if (x.get(list) != simdjson::SUCCESS || list.size() == 0) return fail(path, "must be a non-empty array of schemas");
    grammar_node n;
    n.kind = grammar_node::any_of;
    std::size_t i = 0;
    for (dom::element b : list) {
      const int32_t child = compile(b, path + "[" + std::to_string(i++) + "]");
      if (child < 0) return -1;
      n.children.push_back(child);
    }
    if (n.children.size() == 1) return n.children[0];
    const int32_t node = add(std::move(n), path);
    if (node >= 0) any_of_paths_.emplace_back(node, path);
    return node;
  }

  /// "#", "#/$defs/NAME" or "#/definitions/NAME": one node per target, reserved before the
  /// target compiles so that a schema may refer to itself.
  int32_t ref(dom::element x, const std::string& path) {
    std::string_view r;
    if (x.get(r) != simdjson::SUCCESS) return fail(path + ".$ref", "must be a string");
    if (auto it = refs_.find(std::string(r)); it != refs_.end()) return it->second;
    dom::element target = root_;
    if (r != "#") {
      std::string_view name;
      for (auto prefix : {"#/$defs/", "#/definitions/"})
        if (r.substr(0, std::string_view(prefix).size()) == prefix) name = r.substr(std::string_view(prefix).size());
      if (name.empty() || name.find('/') != std::string_view::npos)
        return fail(path + ".$ref", "only '#', '#/$defs/NAME' and '#/definitions/NAME' are supported");
      const std::string_view defs = r[2] == '$' ? "$defs" : "definitions";
      if (root_.at_key(defs).at_key(name).get(target) != simdjson::SUCCESS)
        return fail(path + ".$ref", "'" + std::string(r) + "' names no schema");
    }
    const int32_t slot = add({}, path);
    if (slot < 0) return -1;
    refs_.emplace(std::string(r), slot);
    const int32_t body = compile(target, std::string(r));
    if (body < 0) return -1;
    g_.nodes[std::size_t(slot)] = g_.nodes[std::size_t(body)];
    const std::size_t known = any_of_paths_.size();
    for (std::size_t i = 0; i < known; ++i)
      if (any_of_paths_[i].first == body) any_of_paths_.emplace_back(slot, any_of_paths_[i].second);
    return slot;
  }

  dom::element root_;
  output_grammar& g_;
  std::string error_;
  std::map<std::string, int32_t> refs_;
  std::vector<std::pair<int32_t, std::string>> any_of_paths_;
};

}  // namespace

std::shared_ptr<const token_vocab> make_token_vocab(const tokenizer& tok, int32_t eos_id) {
  const int32_t n = tok.vocab_size();
  std::vector<std::string> bytes(static_cast<std::size_t>(n));
  std::vector<bool> added(static_cast<std::size_t>(n), false);
  for (int32_t id = 0; id < n; ++id) bytes[std::size_t(id)] = std::string(tok.token_bytes(id));
  for (const added_token& t : tok.added_tokens())
    if (t.id >= 0 && t.id < n) added[std::size_t(t.id)] = true;
  return std::make_shared<const token_vocab>(std::move(bytes), added, eos_id);
}

std::string compile_json_schema(dom::element schema, output_grammar& g) { return schema_compiler(schema, g).run(); }

std::optional<api_error> parse_response_format(dom::element format, bool nested, std::string_view param,
                                               output_grammar& out) {
  const std::string p(param);
  if (format.is_null()) return {};
  dom::object o;
  std::string_view type;
  if (format.get(o) != simdjson::SUCCESS || o.at_key("type").get(type) != simdjson::SUCCESS)
    return bad_request("'" + p + "' must be an object with a 'type'", p, "invalid_type");
  if (type == "text") return {};
  if (type == "json_object") {
    grammar_node obj;
    obj.kind = grammar_node::object;
    obj.extra = out.any_value();
    out.root = out.add(std::move(obj));
    return {};
  }
  if (type != "json_schema")
    return bad_request("'" + p + ".type' must be text, json_object or json_schema", p + ".type");
  dom::object holder = o;
  if (nested && o.at_key("json_schema").get(holder) != simdjson::SUCCESS)
    return bad_request("'" + p + ".json_schema' is required for type json_schema", p + ".json_schema",
                       "missing_required_parameter");
  const std::string where = nested ? p + ".json_schema.schema" : p + ".schema";
  dom::element schema;
  if (holder.at_key("schema").get(schema) != simdjson::SUCCESS)
    return bad_request("'" + where + "' is required for type json_schema", where, "missing_required_parameter");
  if (std::string why = compile_json_schema(schema, out); !why.empty())
    return bad_request("response schema: " + why, where, "unsupported_schema");
  return {};
}

}  // namespace cedar::net
