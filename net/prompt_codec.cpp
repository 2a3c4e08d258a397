// prompt_codec over the tokenizer and the V4.1 chat encoding (net/chat_format.hpp): request
// messages and tools become chat::messages, rendered and tokenized.
#include "net/prompt_codec.hpp"

#include "net/chat_format.hpp"
#include "net/py_json.hpp"
#include "net/tokenizer.hpp"

namespace cedar::net {

namespace {

/// Arguments text -> the JSON value the encoder renders (a non-JSON text stays a string).
json_value arguments_value(const std::string& text) {
  std::string error;
  if (auto v = parse_json(text, &error)) return *v;
  return json_value::of_string(text);
}

chat::message to_chat(const chat_message& m) {
  chat::message out;
  out.role = m.role;
  out.content = m.content;
  if (m.role == "assistant") out.reasoning_content = m.reasoning_content;
  out.tool_call_id = m.tool_call_id;
  for (auto& c : m.tool_calls) out.tool_calls.push_back({c.id, c.name, {}, arguments_value(c.arguments)});
  return out;
}

/// Request tools go on the first system message, or on a new empty one at index 0.
std::optional<std::string> attach_tools(std::vector<chat::message>& msgs, const std::vector<tool_def>& tools) {
  if (tools.empty()) return {};
  if (msgs.empty() || msgs.front().role != "system") {
    chat::message sys;
    sys.role = "system";
    msgs.insert(msgs.begin(), std::move(sys));
  }
  for (auto& t : tools) {
    std::string error;
    auto fn = parse_json(t.function_json, &error);
    if (!fn) return "tool '" + t.name + "': " + error;
    json_value tool;
    tool.type = json_value::kind::object;
    tool.members.emplace_back("type", json_value::of_string("function"));
    tool.members.emplace_back("function", std::move(*fn));
    msgs.front().tools.push_back(std::move(tool));
  }
  return {};
}

}  // namespace

std::unique_ptr<prompt_codec> prompt_codec::create(const std::string& path, std::string* error) {
  auto tok = tokenizer::load_dsv41(path.empty() ? tokenizer::default_path() : path, error);
  if (!tok) return nullptr;
  return std::unique_ptr<prompt_codec>(new prompt_codec(std::move(tok)));
}

prompt_codec::prompt_codec(std::unique_ptr<tokenizer> tok) : tok_(std::move(tok)) {}
prompt_codec::~prompt_codec() = default;

rendered_prompt prompt_codec::render_chat(const std::vector<chat_message>& input,
                                          const std::vector<tool_def>& tools,
                                          const reasoning_options& reasoning) const {
  if (input.back().role == "assistant")
    return {{}, "the last message must not be an assistant message"};
  std::vector<chat::message> msgs;
  msgs.reserve(input.size() + 1);
  for (auto& m : input) msgs.push_back(to_chat(m));
  if (auto err = attach_tools(msgs, tools)) return {{}, *err};
  chat::render_options opts;
  opts.thinking = reasoning.thinking;
  opts.effort = reasoning.effort;
  std::string error;
  auto text = chat::render(std::move(msgs), opts, &error);
  if (!text) return {{}, error};
  return {tok_->encode(*text, false), {}};
}

rendered_prompt prompt_codec::encode_text(const std::string& text) const {
  std::string error;
  auto ids = tok_->try_encode(text, true, &error, false);
  if (!ids) return {{}, "prompt is not valid UTF-8: " + error};
  return {std::move(*ids), {}};
}

std::string prompt_codec::token_text(int32_t id) const { return std::string(tok_->token_bytes(id)); }
std::vector<int32_t> prompt_codec::stop_ids() const { return {tok_->eos_id()}; }
int32_t prompt_codec::vocab_size() const { return tok_->vocab_size(); }

int32_t prompt_codec::filler_token_id() const {
  auto ids = tok_->encode(" hi", false, false);
  return ids.empty() ? 3 : ids.front();
}

}  // namespace cedar::net
