// Rendering of the V4.1 chat encoding (net/chat_format.hpp): preprocessing (content lists,
// image placeholders, tool results merged into user turns and ordered by call), then each
// message with the header that follows it.
#include "net/chat_format.hpp"

#include <algorithm>

#include "net/dsv41_tokens.hpp"
#include "net/utf8.hpp"

namespace cedar::net::chat {

namespace {

constexpr std::string_view kToolsPreamble =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<｜DSML｜ calls>\" block like the following:\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke "
    "name=\"$TOOL_NAME\">\n<｜DSML｜ parameter name=\"$PARAMETER_NAME\" "
    "string=\"true|false\">$PARAMETER_VALUE</｜DSML｜ parameter>\n...\n</｜DSML｜ invoke>\n<｜DSML｜ invoke "
    "name=\"$TOOL_NAME2\">\n...\n</｜DSML｜ invoke>\n</｜DSML｜ calls>\n\nString parameters should be specified as "
    "is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in "
    "JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST "
    "output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool "
    "Schemas\n\n";
constexpr std::string_view kToolsEpilogue =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
constexpr std::string_view kResponseFormat =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

bool fail(std::string* error, std::string msg) {
  if (error) *error = std::move(msg);
  return false;
}

const char* task_token(std::string_view task) {
  if (task == "action") return "<｜action｜>";
  if (task == "query") return "<｜query｜>";
  if (task == "authority") return "<｜authority｜>";
  if (task == "domain") return "<｜domain｜>";
  if (task == "title") return "<｜title｜>";
  if (task == "read_url") return "<｜read_url｜>";
  return nullptr;
}

bool known_role(std::string_view r) {
  return r == "system" || r == "user" || r == "assistant" || r == "tool" || r == "latest_reminder";
}

// "ns::name" with an optional explicit namespace -> the name the prompt shows.
bool qualified_name(std::string_view name, std::string_view name_space, std::string* out, std::string* error) {
  size_t sep = name.find("::");
  std::string ns(name_space);
  std::string bare(name);
  if (sep != std::string_view::npos) {
    std::string prefix(name.substr(0, sep));
    if (!ns.empty() && ns != prefix) return fail(error, "conflicting tool namespaces: " + ns + " != " + prefix);
    ns = prefix;
    bare = std::string(name.substr(sep + 2));
  }
  if (bare.find("::") != std::string::npos) return fail(error, "tool name must not contain '::': " + bare);
  if (ns.find("::") != std::string::npos) return fail(error, "tool namespace must not contain '::': " + ns);
  *out = ns.empty() ? bare : ns + "::" + bare;
  return true;
}

// Python truthiness of a JSON value (what `if response_format:` tests).
bool truthy(const json_value& v) {
  switch (v.type) {
    case json_value::kind::null: return false;
    case json_value::kind::boolean: return v.boolean;
    case json_value::kind::integer:
    case json_value::kind::real: return std::strtod(v.text.c_str(), nullptr) != 0;
    case json_value::kind::string: return !v.text.empty();
    case json_value::kind::array: return !v.items.empty();
    case json_value::kind::object: return !v.members.empty();
  }
  return false;
}

// The "function" of an OpenAI tool, with its namespace folded into the name (and description).
bool tool_schema(const json_value& tool, std::string* out, std::string* error) {
  const json_value* fn = tool.find("function");
  if (!fn || !fn->is_object()) return fail(error, "tool without a \"function\" object");
  json_value f = *fn;
  const json_value* ns = tool.find("namespace");
  if (!ns || ns->is_null()) ns = fn->find("namespace");
  std::string ns_name;
  const json_value* ns_description = nullptr;
  if (ns && ns->is_string()) ns_name = ns->text;
  if (ns && ns->is_object()) {
    const json_value* n = ns->find("name");
    if (!n || !n->is_string()) return fail(error, "tool namespace object without a name");
    ns_name = n->text;
    ns_description = ns->find("description");
  }
  const json_value* name = f.find("name");
  if (!name || !name->is_string()) return fail(error, "tool function without a name");
  std::string qualified;
  if (!qualified_name(name->text, ns_name, &qualified, error)) return false;
  f.members.erase(std::remove_if(f.members.begin(), f.members.end(), [](auto& m) { return m.first == "namespace"; }),
                  f.members.end());
  for (auto& [k, v] : f.members)
    if (k == "name") v = json_value::of_string(qualified);
  if (ns_description && truthy(*ns_description) && ns_description->is_string()) {
    const json_value* d = f.find("description");
    std::string text = ns_description->text + "\n" + (d && d->is_string() ? d->text : std::string());
    bool set = false;
    for (auto& [k, v] : f.members)
      if (k == "description") v = json_value::of_string(text), set = true;
    if (!set) f.members.emplace_back("description", json_value::of_string(text));
  }
  dump_python_json(f, out);
  return true;
}

// The DSML parameters of one call, appended by `text` (template) and `lit` (message text).
template <class Text, class Lit>
void dsml_arguments(const tool_call& tc, Text text, Lit lit) {
  json_value args = tc.arguments;
  for (int i = 0; i < 2 && args.is_string(); ++i) {  // JSON text, possibly encoded twice
    auto parsed = parse_json(args.text, nullptr);
    if (!parsed) break;
    args = std::move(*parsed);
  }
  if (!args.is_object()) {
    json_value wrapped;
    wrapped.type = json_value::kind::object;
    wrapped.members.emplace_back("arguments", tc.arguments);
    args = std::move(wrapped);
  }
  for (size_t i = 0; i < args.members.size(); ++i) {
    const auto& [key, value] = args.members[i];
    if (i) text("\n");
    text("<｜DSML｜ parameter name=\"");
    lit(key);
    text(value.is_string() ? "\" string=\"true\">" : "\" string=\"false\">");
    lit(value.is_string() ? value.text : python_json(value));
    text("</｜DSML｜ parameter>");
  }
}

// Content list -> blocks with images as placeholder text; content = the text blocks joined.
bool process_images(message* m, std::string* error) {
  if (m->content.find(dsv41::image) != std::string::npos && !m->content_is_list)
    return fail(error, "message content contains the image token " + std::string(dsv41::image) +
                           "; images must be content blocks");
  if (m->reasoning_content && m->reasoning_content->find(dsv41::image) != std::string::npos)
    return fail(error, "reasoning_content contains the image token " + std::string(dsv41::image));
  if (!m->content_is_list) return true;
  auto fix = [&](std::vector<content_block>& blocks, auto& self) -> bool {
    for (auto& b : blocks) {
      if (b.type == "image" || b.type == "image_url") {
        if (!b.has_image_source) return fail(error, "image block does not contain a valid source");
        b = content_block{"text", dsv41::image, {}, {}, false, false, true};
      } else if (b.type == "tool_result" && b.parts_is_list) {
        if (!self(b.parts, self)) return false;
      } else if (b.type == "text" && b.text.find(dsv41::image) != std::string::npos) {
        return fail(error, "text block contains the image token " + std::string(dsv41::image) +
                               "; images must be content blocks");
      }
    }
    return true;
  };
  if (!fix(m->blocks, fix)) return false;
  std::string joined;
  bool first = true;
  for (auto& b : m->blocks)
    if (b.type == "text") {
      if (!first) joined += "\n\n";
      joined += b.text;
      first = false;
    }
  m->content = std::move(joined);
  return true;
}

// Tool messages become user turns of tool_result blocks; consecutive user turns merge.
std::vector<message> merge_tool_messages(std::vector<message> msgs) {
  std::vector<message> merged;
  for (auto& m : msgs) {
    if (m.role == "tool") {
      content_block block{"tool_result", m.content, m.tool_call_id, {}, false, false};
      if (!merged.empty() && merged.back().role == "user") {
        merged.back().blocks.push_back(std::move(block));
      } else {
        message u;
        u.role = "user";
        u.content_is_list = true;
        u.blocks.push_back(std::move(block));
        merged.push_back(std::move(u));
      }
    } else if (m.role == "user") {
      if (!m.content_is_list) {
        m.blocks = {content_block{"text", m.content, {}, {}, false, false}};
        m.content_is_list = true;
      }
      if (!merged.empty() && merged.back().role == "user" && merged.back().task.empty()) {
        auto& dst = merged.back().blocks;
        dst.insert(dst.end(), m.blocks.begin(), m.blocks.end());
      } else {
        merged.push_back(std::move(m));
      }
    } else {
      merged.push_back(std::move(m));
    }
  }
  return merged;
}

bool valid_utf8(std::string_view s) { return valid_utf8_prefix(s) == s.size(); }

bool valid_blocks(const std::vector<content_block>& blocks) {
  for (const auto& b : blocks)
    if (!valid_utf8(b.text) || !valid_utf8(b.type) || !valid_blocks(b.parts)) return false;
  return true;
}

// Every string of a message is valid UTF-8 (so byte ranges survive tokenization unchanged).
bool valid_text(const message& m) {
  if (!valid_utf8(m.content) || !valid_utf8(m.reasoning_content.value_or("")) || !valid_blocks(m.blocks)) return false;
  for (const auto& tc : m.tool_calls)
    if (!valid_utf8(tc.name) || !valid_utf8(tc.name_space) || (tc.arguments.is_string() && !valid_utf8(tc.arguments.text)))
      return false;
  return true;
}

}  // namespace

std::vector<int32_t> conversation::encode_from(const tokenizer& tok, size_t from) const {
  auto it = std::lower_bound(literal_.begin(), literal_.end(), from,
                             [](const text_range& r, size_t off) { return r.offset < off; });
  std::vector<text_range> shifted;
  for (; it != literal_.end(); ++it) shifted.push_back(text_range{it->offset - from, it->size});
  // The text was checked to be valid UTF-8 when it was appended, so this cannot fail.
  return *tok.try_encode_with_literals(std::string_view(text_).substr(from), shifted, false, nullptr);
}

std::optional<int> parse_effort(std::string_view text, std::string* error) {
  if (text == "low") return 50;
  if (text == "high") return 75;
  if (text == "max") return 100;
  int v = 0;
  bool digits = !text.empty() && text.size() <= 3;
  for (char c : text) digits = digits && c >= '0' && c <= '9', v = v * 10 + (c - '0');
  if (digits && v >= 1 && v <= 100) return v;
  fail(error, "reasoning effort must be an integer 1-100 or low, high, max (got '" + std::string(text) + "')");
  return std::nullopt;
}

std::optional<size_t> conversation::last_user_index() const {
  for (size_t i = messages_.size(); i-- > 0;) {
    const auto& r = messages_[i].role;
    if (r == "user" || (r == "system" && i > 0)) return i;
  }
  return std::nullopt;
}

bool conversation::render_one(size_t idx, std::string* out, std::vector<text_range>* literal,
                              std::string* error) const {
  const message& m = messages_[idx];
  const bool thinking = opts_.thinking;
  const bool drop = opts_.drop_thinking && !has_tools_;
  const auto last_user = last_user_index();
  const bool after_last_user = !last_user || idx > *last_user;

  std::string& p = *out;
  auto text = [&](std::string_view s) { p += s; };
  auto lit = [&](std::string_view s) {  // message text: never read as special tokens
    if (!s.empty()) literal->push_back(text_range{p.size(), s.size()});
    p += s;
  };
  auto lit_since = [&](size_t start) {
    if (p.size() > start) literal->push_back(text_range{start, p.size() - start});
  };
  const bool effort_line = idx == 0 && thinking;
  if (idx == 0 && (effort_line || m.role == "system")) p += dsv41::system;
  if (effort_line)
    p += "Reasoning Effort: " + std::to_string(opts_.effort) +
         " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

  if (m.role == "system") {
    if (idx > 0) p += dsv41::system;
    lit(m.content);
    if (!m.tools.empty()) {
      p += "\n\n";
      p += kToolsPreamble;
      for (size_t i = 0; i < m.tools.size(); ++i) {
        if (i) p += '\n';
        size_t start = p.size();
        if (!tool_schema(m.tools[i], &p, error)) return false;
        lit_since(start);
      }
      p += kToolsEpilogue;
    }
    if (m.response_format && truthy(*m.response_format)) {
      p += "\n\n";
      p += kResponseFormat;
      size_t start = p.size();
      dump_python_json(*m.response_format, &p);
      lit_since(start);
    }
  } else if (m.role == "user") {
    p += dsv41::user;
    if (!m.blocks.empty()) {
      for (size_t i = 0; i < m.blocks.size(); ++i) {
        const auto& b = m.blocks[i];
        if (i) p += "\n\n";
        if (b.type == "text") {
          if (b.image_placeholder) text(b.text);
          else lit(b.text);
        } else if (b.type == "tool_result") {
          p += "<tool_result>";
          if (!b.parts_is_list) lit(b.text);
          for (size_t k = 0; b.parts_is_list && k < b.parts.size(); ++k) {
            if (k) p += "\n\n";
            if (b.parts[k].image_placeholder) text(b.parts[k].text);
            else lit(b.parts[k].type == "text" ? b.parts[k].text : "[Unsupported " + b.parts[k].type + "]");
          }
          p += "</tool_result>";
        } else {
          lit("[Unsupported " + b.type + "]");
        }
      }
    } else {
      lit(m.content);
    }
  } else if (m.role == "latest_reminder") {
    p += dsv41::latest_reminder;
    lit(m.content);
  } else if (m.role == "assistant") {
    const bool prev_has_task = idx > 0 && !messages_[idx - 1].task.empty();
    if (thinking && !prev_has_task && (!drop || after_last_user)) {
      lit(m.reasoning_content.value_or(""));
      p += dsv41::think_end;
    }
    lit(m.content);
    if (!m.tool_calls.empty()) {
      p += "\n\n<｜DSML｜ calls>\n";
      for (size_t i = 0; i < m.tool_calls.size(); ++i) {
        std::string name;
        if (!qualified_name(m.tool_calls[i].name, m.tool_calls[i].name_space, &name, error)) return false;
        if (i) p += '\n';
        p += "<｜DSML｜ invoke name=\"";
        lit(name);
        p += "\">\n";
        dsml_arguments(m.tool_calls[i], text, lit);
        p += "\n</｜DSML｜ invoke>";
      }
      p += "\n</｜DSML｜ calls>";
    }
    if (!m.wo_eos) p += dsv41::eos;
  } else {
    return fail(error, "unknown role '" + m.role + "'");
  }

  // The header that opens the next assistant turn (or a task token).
  if (idx + 1 < messages_.size() && messages_[idx + 1].role != "assistant" &&
      messages_[idx + 1].role != "latest_reminder")
    return true;
  if (!m.task.empty()) {
    if (m.task != "action") {
      p += task_token(m.task);
    } else {
      p += dsv41::assistant;
      p += thinking ? dsv41::think_begin : dsv41::think_end;
      p += task_token(m.task);
    }
  } else if (m.role == "user" || (m.role == "system" && idx > 0)) {
    p += dsv41::assistant;
    const bool open = thinking && (!drop || (last_user && idx >= *last_user));
    p += open ? dsv41::think_begin : dsv41::think_end;
  }
  return true;
}

std::optional<std::string> conversation::append(std::vector<message> msgs, std::string* error) {
  if (opts_.effort < 1 || opts_.effort > 100) {
    fail(error, "reasoning effort must be 1-100, got " + std::to_string(opts_.effort));
    return std::nullopt;
  }
  for (auto& m : msgs) {
    if (!known_role(m.role)) {
      fail(error, "unknown role '" + m.role + "' (expected system, user, assistant, tool or latest_reminder)");
      return std::nullopt;
    }
    if (!m.task.empty() && !task_token(m.task)) {
      fail(error, "invalid task '" + m.task + "' (valid: action, query, authority, domain, title, read_url)");
      return std::nullopt;
    }
    if (!valid_text(m)) {
      fail(error, "message text (" + m.role + ") is not valid UTF-8");
      return std::nullopt;
    }
    if (!process_images(&m, error)) return std::nullopt;
  }
  msgs = merge_tool_messages(std::move(msgs));

  // Tool results follow the order of the calls of the latest assistant turn with calls.
  auto order = last_call_order_;
  bool had_tools = has_tools_;
  for (auto& m : msgs) {
    has_tools_ = has_tools_ || !m.tools.empty();
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      order.clear();
      for (size_t i = 0; i < m.tool_calls.size(); ++i)
        if (!m.tool_calls[i].id.empty()) order[m.tool_calls[i].id] = i;
    } else if (m.role == "user" && !order.empty()) {
      std::vector<content_block> results;
      for (auto& b : m.blocks)
        if (b.type == "tool_result") results.push_back(b);
      if (results.size() > 1) {
        auto key = [&](const content_block& b) {
          auto it = order.find(b.tool_use_id);
          return it == order.end() ? size_t{0} : it->second;
        };
        std::stable_sort(results.begin(), results.end(),
                         [&](const auto& a, const auto& b) { return key(a) < key(b); });
        size_t k = 0;
        for (auto& b : m.blocks)
          if (b.type == "tool_result") b = results[k++];
      }
    }
  }

  size_t first = messages_.size();
  for (auto& m : msgs) messages_.push_back(std::move(m));
  std::string added = opts_.add_bos && first == 0 ? std::string(dsv41::bos) : std::string();
  std::vector<text_range> literal;
  for (size_t i = first; i < messages_.size(); ++i) {
    if (!render_one(i, &added, &literal, error)) {
      messages_.resize(first);
      has_tools_ = had_tools;
      return std::nullopt;
    }
  }
  last_call_order_ = std::move(order);
  num_rendered_last_ = messages_.size() - first;
  for (auto r : literal) literal_.push_back(text_range{r.offset + text_.size(), r.size});
  text_ += added;
  return added;
}

std::optional<std::string> render(std::vector<message> msgs, const render_options& opts, std::string* error) {
  conversation c(opts);
  if (!c.append(std::move(msgs), error)) return std::nullopt;
  return c.text();
}

}  // namespace cedar::net::chat
