// prompt_codec over the tokenizer and the V4.1 chat encoding (net/chat_format.hpp): request
// messages and tools become chat::messages appended to a chat::conversation; only the new text
// is tokenized, with special tokens matched in the template alone (never in message text).
#include "net/prompt_codec.hpp"

#include "net/dsv41_tokens.hpp"

#include "net/chat_format.hpp"
#include "net/py_json.hpp"
#include "net/tokenizer.hpp"
#include "net/utf8.hpp"

namespace cedar::net {

namespace {

chat::message to_chat(const chat_message& m) {
  chat::message out;
  out.role = m.role;
  out.content = m.content;
  if (m.role == "assistant") out.reasoning_content = m.reasoning_content;
  out.tool_call_id = m.tool_call_id;
  // the arguments as the client sent them, a string: the encoder reads an object out of it, and
  // wraps anything else whole as {"arguments": text} (a string parameter), as the reference does
  for (auto& c : m.tool_calls) out.tool_calls.push_back({c.id, c.name, {}, json_value::of_string(c.arguments)});
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

/// What fixes a conversation's rendering besides its messages: tools and reasoning options.
std::string options_key(const std::vector<tool_def>& tools, const reasoning_options& reasoning) {
  std::string key = std::to_string(int(reasoning.thinking)) + ":" + std::to_string(reasoning.effort);
  for (auto& t : tools) key += "\n" + t.name + "\n" + t.function_json;
  return key;
}

}  // namespace

struct chat_context {
  chat::conversation conversation;
  std::vector<int32_t> ids;  ///< ids of conversation.text()
  std::string key;           ///< options_key of the first turn
};

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
  auto p = extend_chat(nullptr, input, tools, reasoning);
  return {std::move(p.ids), std::move(p.error)};
}

context_prompt prompt_codec::extend_chat(const std::shared_ptr<const chat_context>& previous,
                                         const std::vector<chat_message>& input,
                                         const std::vector<tool_def>& tools,
                                         const reasoning_options& reasoning) const {
  if (input.empty()) return {nullptr, {}, "there are no messages"};
  if (input.back().role == "assistant")
    return {nullptr, {}, "the last message must not be an assistant message"};
  std::vector<chat::message> msgs;
  msgs.reserve(input.size() + 1);
  for (auto& m : input) msgs.push_back(to_chat(m));
  auto next = std::make_shared<chat_context>();
  if (previous) {
    if (!can_continue(*previous, tools, reasoning))
      return {nullptr, {}, "tools or reasoning differ from the conversation's"};
    *next = *previous;
  } else {
    if (auto err = attach_tools(msgs, tools)) return {nullptr, {}, *err};
    chat::render_options opts;
    opts.thinking = reasoning.thinking;
    opts.effort = reasoning.effort;
    next->conversation = chat::conversation(opts);
    next->key = options_key(tools, reasoning);
  }
  const size_t from = next->conversation.text().size();
  std::string error;
  if (!next->conversation.append(std::move(msgs), &error)) return {nullptr, {}, error};
  auto added = next->conversation.encode_from(*tok_, from);
  next->ids.insert(next->ids.end(), added.begin(), added.end());
  auto ids = next->ids;
  return {std::move(next), std::move(ids), {}};
}

bool prompt_codec::can_continue(const chat_context& context, const std::vector<tool_def>& tools,
                                const reasoning_options& reasoning) const {
  return context.key == options_key(tools, reasoning);
}

std::shared_ptr<const chat_context> prompt_codec::with_reply(const std::shared_ptr<const chat_context>& context,
                                                             const chat_message& reply,
                                                             const std::vector<int32_t>& generated) const {
  if (!context) return nullptr;
  auto next = std::make_shared<chat_context>(*context);
  const size_t from = next->conversation.text().size();
  std::string error;
  if (!next->conversation.append({to_chat(reply)}, &error)) return nullptr;
  std::vector<int32_t> added = generated;
  if (!added.empty() && added.back() != tok_->eos_id()) added.push_back(tok_->eos_id());
  // the reply's text is the generated bytes as the output stream decoded them: an invalid
  // sequence there became U+FFFD, which re-encodes to other ids than the ones the model made
  if (added.empty() || sanitize_utf8(tok_->decode(added)) != std::string_view(next->conversation.text()).substr(from))
    added = next->conversation.encode_from(*tok_, from);
  next->ids.insert(next->ids.end(), added.begin(), added.end());
  return next;
}

const std::vector<int32_t>& prompt_codec::context_ids(const chat_context& context) { return context.ids; }

size_t prompt_codec::context_bytes(const chat_context& context) {
  // the messages hold about the text again
  return 2 * context.conversation.text().size() + context.ids.size() * sizeof(int32_t) + context.key.size();
}

rendered_prompt prompt_codec::encode_text(const std::string& text) const {
  // A raw prompt is the model's text as written, control tokens included (a prompt rendered by
  // the reference encoder comes through whole); it gets a BOS unless it spells one itself.
  std::string error;
  const bool spells_bos = std::string_view(text).starts_with(dsv41::bos);
  auto ids = tok_->try_encode(text, !spells_bos, &error, true);
  if (!ids) return {{}, "prompt is not valid UTF-8: " + error};
  return {std::move(*ids), {}};
}

std::vector<int32_t> prompt_codec::tool_call_lead(const std::string& name) const {
  const std::string head = std::string(dsv41::calls_open) + dsv41::invoke_open;
  const std::string lead = head + name + dsv41::invoke_name_end;
  // The call as the model writes it goes on with a parameter; BPE may join the lead's last
  // bytes with what follows, so the lead ends at the last token boundary inside it.
  const std::string call = lead + "<｜DSML｜ parameter name=\"";
  const std::vector<text_range> literal = {text_range{head.size(), name.size()}};
  const size_t must_cover = head.size() + name.size() + 1;  // the name and its closing quote
  if (auto ids = tok_->try_encode_with_literals(call, literal, false, nullptr)) {
    size_t keep = 0, spelled = 0;
    for (; keep < ids->size(); ++keep) {
      const std::string_view piece = tok_->token_bytes((*ids)[keep]);
      if (spelled + piece.size() > lead.size() || lead.compare(spelled, piece.size(), piece) != 0) break;
      spelled += piece.size();
    }
    if (spelled >= must_cover) return std::vector<int32_t>(ids->begin(), ids->begin() + long(keep));
  }
  return tok_->try_encode_with_literals(lead, literal, false, nullptr).value_or(std::vector<int32_t>{});
}

std::string prompt_codec::token_text(int32_t id) const { return std::string(tok_->token_bytes(id)); }

std::string prompt_codec::token_name(int32_t id) const {
  std::string text = token_text(id);
  if (valid_utf8_prefix(text) == text.size()) return text;
  static constexpr char hex[] = "0123456789abcdef";
  std::string name = "bytes:";
  for (unsigned char c : text) {
    name += "\\x";
    name += hex[c >> 4];
    name += hex[c & 15];
  }
  return name;
}
std::vector<int32_t> prompt_codec::stop_ids() const { return {tok_->eos_id()}; }
int32_t prompt_codec::vocab_size() const { return tok_->vocab_size(); }

int32_t prompt_codec::filler_token_id() const {
  auto ids = tok_->encode(" hi", false, false);
  return ids.empty() ? 3 : ids.front();
}

}  // namespace cedar::net
