// Conversations from JSON (OpenAI Chat Completions messages, plus the reference encoder's
// fields: reasoning_content, task, wo_eos, tools and response_format on system messages).
#include <algorithm>

#include "net/chat_format.hpp"

namespace cedar::net::chat {

namespace {

bool fail(std::string* error, std::string msg) {
  if (error) *error = std::move(msg);
  return false;
}

bool get_string(const json_value& obj, std::string_view key, std::string* out, std::string* error, bool* present = nullptr) {
  const json_value* v = obj.find(key);
  if (present) *present = v && !v->is_null();
  if (!v || v->is_null()) return true;
  if (!v->is_string()) return fail(error, "\"" + std::string(key) + "\" must be a string");
  *out = v->text;
  return true;
}

bool parse_block(const json_value& v, content_block* b, std::string* error) {
  if (v.is_string()) {  // a bare string in a content list reads as text
    *b = content_block{"text", v.text, {}, {}, false, false};
    return true;
  }
  if (!v.is_object()) return fail(error, "content list items must be objects");
  if (!get_string(v, "type", &b->type, error)) return false;
  if (b->type == "input_text" || b->type == "output_text") b->type = "text";
  if (b->type == "text") return get_string(v, "text", &b->text, error);
  if (b->type == "image_url") {
    const json_value* u = v.find("image_url");
    if (u && u->is_string()) b->has_image_source = !u->text.empty();
    if (u && u->is_object()) {
      const json_value* url = u->find("url");
      b->has_image_source = url && url->is_string() && !url->text.empty();
    }
    return true;
  }
  if (b->type == "image") {
    for (const char* k : {"source", "url", "data"}) {
      const json_value* s = v.find(k);
      b->has_image_source = b->has_image_source || (s && !s->is_null() && !(s->is_string() && s->text.empty()));
    }
    return true;
  }
  if (b->type == "tool_result") {
    if (!get_string(v, "tool_use_id", &b->tool_use_id, error)) return false;
    const json_value* c = v.find("content");
    if (c && c->is_array()) {
      b->parts_is_list = true;
      for (const auto& item : c->items) {
        b->parts.emplace_back();
        if (!parse_block(item, &b->parts.back(), error)) return false;
      }
      return true;
    }
    return get_string(v, "content", &b->text, error);
  }
  return true;  // other types render as "[Unsupported TYPE]"
}

bool parse_tool_call(const json_value& v, tool_call* tc, std::string* error) {
  if (!v.is_object()) return fail(error, "tool_calls items must be objects");
  if (!get_string(v, "id", &tc->id, error)) return false;
  const json_value* fn = v.find("function");
  if (!fn || !fn->is_object()) return fail(error, "tool call without a \"function\" object");
  if (tc->id.empty() && !get_string(*fn, "id", &tc->id, error)) return false;
  if (!get_string(*fn, "name", &tc->name, error)) return false;
  if (tc->name.empty()) return fail(error, "tool call without a function name");
  if (!get_string(v, "namespace", &tc->name_space, error)) return false;
  if (tc->name_space.empty() && !get_string(*fn, "namespace", &tc->name_space, error)) return false;
  const json_value* args = fn->find("arguments");
  if (!args) return fail(error, "tool call without arguments");
  tc->arguments = *args;
  return true;
}

}  // namespace

std::optional<message> parse_message(const json_value& v, std::string* error) {
  if (!v.is_object()) {
    fail(error, "each message must be a JSON object");
    return std::nullopt;
  }
  message m;
  bool has_reasoning = false;
  std::string reasoning;
  if (!get_string(v, "role", &m.role, error)) return std::nullopt;
  if (m.role.empty()) {
    fail(error, "message without a role");
    return std::nullopt;
  }
  const json_value* content = v.find("content");
  if (content && content->is_array()) {
    m.content_is_list = true;
    for (const auto& item : content->items) {
      m.blocks.emplace_back();
      if (!parse_block(item, &m.blocks.back(), error)) return std::nullopt;
    }
  } else if (!get_string(v, "content", &m.content, error)) {
    return std::nullopt;
  }
  if (!get_string(v, "reasoning_content", &reasoning, error, &has_reasoning)) return std::nullopt;
  if (!has_reasoning && !get_string(v, "reasoning", &reasoning, error, &has_reasoning)) return std::nullopt;
  if (has_reasoning) m.reasoning_content = reasoning;
  if (const json_value* tools = v.find("tools"); tools && !tools->is_null()) {
    if (!tools->is_array()) {
      fail(error, "\"tools\" must be an array");
      return std::nullopt;
    }
    m.tools = tools->items;
  }
  if (const json_value* rf = v.find("response_format"); rf && !rf->is_null()) m.response_format = *rf;
  if (const json_value* calls = v.find("tool_calls"); calls && !calls->is_null()) {
    if (!calls->is_array()) {
      fail(error, "\"tool_calls\" must be an array");
      return std::nullopt;
    }
    for (const auto& c : calls->items) {
      m.tool_calls.emplace_back();
      if (!parse_tool_call(c, &m.tool_calls.back(), error)) return std::nullopt;
    }
  }
  if (!get_string(v, "tool_call_id", &m.tool_call_id, error) || !get_string(v, "task", &m.task, error))
    return std::nullopt;
  if (const json_value* w = v.find("wo_eos"); w && w->type == json_value::kind::boolean) m.wo_eos = w->boolean;
  return m;
}

std::optional<parsed_request> parse_request_json(std::string_view json, std::string* error) {
  auto root = parse_json(json, error);
  if (!root) return std::nullopt;
  parsed_request req;
  const json_value* messages = root->is_array() ? &*root : root->find("messages");
  if (!messages || !messages->is_array()) {
    fail(error, "expected an array of messages or an object with \"messages\"");
    return std::nullopt;
  }
  for (const auto& v : messages->items) {
    auto m = parse_message(v, error);
    if (!m) return std::nullopt;
    req.messages.push_back(std::move(*m));
  }
  if (!root->is_object()) return req;
  if (const json_value* tools = root->find("tools"); tools && tools->is_array() && !tools->items.empty()) {
    auto sys = std::find_if(req.messages.begin(), req.messages.end(), [](auto& m) { return m.role == "system"; });
    if (sys == req.messages.end()) {
      message s;
      s.role = "system";
      sys = req.messages.insert(req.messages.begin(), std::move(s));
    }
    sys->tools.insert(sys->tools.end(), tools->items.begin(), tools->items.end());
  }
  if (const json_value* t = root->find("thinking"); t && t->type == json_value::kind::boolean) req.thinking = t->boolean;
  if (const json_value* t = root->find("thinking_mode"); t && t->is_string()) {
    if (t->text != "thinking" && t->text != "chat") {
      fail(error, "thinking_mode must be \"thinking\" or \"chat\"");
      return std::nullopt;
    }
    req.thinking = t->text == "thinking";
  }
  if (const json_value* e = root->find("reasoning_effort"); e && !e->is_null()) {
    // Strict, as the reference: an integer 1-100 or low/high/max; not 1.5, true or "75".
    bool named = e->is_string() && (e->text == "low" || e->text == "high" || e->text == "max");
    if (!named && e->type != json_value::kind::integer) {
      fail(error, "reasoning_effort must be an integer 1-100 or low, high, max");
      return std::nullopt;
    }
    auto effort = parse_effort(e->text, error);
    if (!effort) return std::nullopt;
    req.effort = *effort;
  }
  return req;
}

}  // namespace cedar::net::chat
