// Rendering of the V4.1 chat encoding (net/chat_format.hpp): preprocessing (content lists,
// image placeholders, tool results merged into user turns and ordered by call), then each
// message with the header that follows it.
#include "net/chat_format.hpp"

#include <algorithm>

#include "net/chat_preprocess.hpp"
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

// Appends template text and message text to a prompt, noting where message text lies (so the
// tokenizer never reads control tokens inside it).
struct prompt_writer {
  std::string& out;
  std::vector<text_range>& literal;

  void text(std::string_view s) { out += s; }
  void lit(std::string_view s) {
    if (!s.empty()) literal.push_back(text_range{out.size(), s.size()});
    out += s;
  }
  void lit_since(size_t start) {
    if (out.size() > start) literal.push_back(text_range{start, out.size() - start});
  }
};

// The DSML parameters of one call.
void write_dsml_arguments(const tool_call& tc, prompt_writer& w) {
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
    if (i) w.text("\n");
    w.text("<｜DSML｜ parameter name=\"");
    w.lit(key);
    w.text(value.is_string() ? "\" string=\"true\">" : "\" string=\"false\">");
    w.lit(value.is_string() ? value.text : python_json(value));
    w.text("</｜DSML｜ parameter>");
  }
}

bool write_system(const message& m, size_t idx, prompt_writer& w, std::string* error) {
  if (idx > 0) w.text(dsv41::system);
  w.lit(m.content);
  if (!m.tools.empty()) {
    w.text("\n\n");
    w.text(kToolsPreamble);
    for (size_t i = 0; i < m.tools.size(); ++i) {
      if (i) w.text("\n");
      size_t start = w.out.size();
      if (!tool_schema(m.tools[i], &w.out, error)) return false;
      w.lit_since(start);
    }
    w.text(kToolsEpilogue);
  }
  if (m.response_format && truthy(*m.response_format)) {
    w.text("\n\n");
    w.text(kResponseFormat);
    size_t start = w.out.size();
    dump_python_json(*m.response_format, &w.out);
    w.lit_since(start);
  }
  return true;
}

void write_block(const content_block& b, prompt_writer& w) {
  if (b.image_placeholder) w.text(b.text);
  else w.lit(b.type == "text" ? b.text : "[Unsupported " + b.type + "]");
}

void write_user(const message& m, prompt_writer& w) {
  w.text(dsv41::user);
  if (m.blocks.empty()) return w.lit(m.content);
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    const auto& b = m.blocks[i];
    if (i) w.text("\n\n");
    if (b.type != "tool_result") {
      write_block(b, w);
      continue;
    }
    w.text("<tool_result>");
    if (!b.parts_is_list) w.lit(b.text);
    for (size_t k = 0; b.parts_is_list && k < b.parts.size(); ++k) {
      if (k) w.text("\n\n");
      write_block(b.parts[k], w);
    }
    w.text("</tool_result>");
  }
}

bool write_assistant(const message& m, bool with_reasoning, prompt_writer& w, std::string* error) {
  if (with_reasoning) {
    w.lit(m.reasoning_content.value_or(""));
    w.text(dsv41::think_end);
  }
  w.lit(m.content);
  if (!m.tool_calls.empty()) {
    w.text(dsv41::calls_open);
    for (size_t i = 0; i < m.tool_calls.size(); ++i) {
      std::string name;
      if (!qualified_name(m.tool_calls[i].name, m.tool_calls[i].name_space, &name, error)) return false;
      if (i) w.text("\n");
      w.text(dsv41::invoke_open);
      w.lit(name);
      w.text(dsv41::invoke_name_end);
      write_dsml_arguments(m.tool_calls[i], w);
      w.text("\n</｜DSML｜ invoke>");
    }
    w.text("\n</｜DSML｜ calls>");
  }
  if (!m.wo_eos) w.text(dsv41::eos);
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
  prompt_writer w{*out, *literal};

  const bool effort_line = idx == 0 && thinking;
  if (idx == 0 && (effort_line || m.role == "system")) w.text(dsv41::system);
  if (effort_line)
    w.text("Reasoning Effort: " + std::to_string(opts_.effort) +
           " (range 1-100, the higher the value, the more thorough the reasoning)\n\n");
  bool ok = true;
  if (m.role == "system") {
    ok = write_system(m, idx, w, error);
  } else if (m.role == "user") {
    write_user(m, w);
  } else if (m.role == "latest_reminder") {
    w.text(dsv41::latest_reminder);
    w.lit(m.content);
  } else if (m.role == "assistant") {
    // A task's answer has no reasoning; with drop_thinking only turns after the last user keep it.
    const bool prev_has_task = idx > 0 && !messages_[idx - 1].task.empty();
    const bool after_last_user = !last_user || idx > *last_user;
    ok = write_assistant(m, thinking && !prev_has_task && (!drop || after_last_user), w, error);
  } else {
    return fail(error, "unknown role '" + m.role + "'");
  }
  if (!ok) return false;

  // The header that opens the next assistant turn (or a task token), unless a turn that is
  // neither an assistant nor a reminder follows.
  if (idx + 1 < messages_.size() && messages_[idx + 1].role != "assistant" &&
      messages_[idx + 1].role != "latest_reminder")
    return true;
  if (m.task == "action") {
    w.text(dsv41::assistant);
    w.text(thinking ? dsv41::think_begin : dsv41::think_end);
    w.text(task_token(m.task));
  } else if (!m.task.empty()) {
    w.text(task_token(m.task));
  } else if (m.role == "user" || (m.role == "system" && idx > 0)) {
    w.text(dsv41::assistant);
    w.text(thinking && (!drop || (last_user && idx >= *last_user)) ? dsv41::think_begin : dsv41::think_end);
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
  for (const auto& m : msgs) has_tools_ = has_tools_ || !m.tools.empty();
  sort_tool_results(&msgs, &order);

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
