// prompt_codec over the tokenizer: the V4.1 chat rendering (spec §2.2) and a streaming output
// splitter (spec §3: reasoning up to </think>, content, then a DSML tool block).
#include "net/prompt_codec.hpp"

#include "net/dsv41_tokens.hpp"
#include "net/json_writer.hpp"
#include "net/tokenizer.hpp"

namespace cedar::net {

namespace {

const char* const tools_preamble =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can "
    "invoke tools by writing a \"<｜DSML｜ calls>\" block like the following:\n\n<｜DSML｜ calls>\n"
    "<｜DSML｜ invoke name=\"$TOOL_NAME\">\n<｜DSML｜ parameter name=\"$PARAMETER_NAME\" "
    "string=\"true|false\">$PARAMETER_VALUE</｜DSML｜ parameter>\n...\n</｜DSML｜ invoke>\n"
    "<｜DSML｜ invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜ invoke>\n</｜DSML｜ calls>\n\nString "
    "parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output "
    "your complete reasoning inside <think>...</think> BEFORE any tool calls or final response."
    "\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### "
    "Available Tool Schemas\n\n";
const char* const tools_epilogue =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
    "tool calls.\n";

std::string tools_text(const std::vector<tool_def>& tools) {
  std::string s = tools_preamble;
  for (size_t i = 0; i < tools.size(); ++i) s += (i ? "\n" : "") + tools[i].function_json;
  return s + tools_epilogue;
}

/// A DSML block for an assistant's tool calls; arguments are rendered as string="false" JSON.
std::string tool_calls_text(const std::vector<tool_call>& calls) {
  if (calls.empty()) return {};
  std::string s = "\n\n<｜DSML｜ calls>\n";
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i) s += "\n";
    s += "<｜DSML｜ invoke name=\"" + calls[i].name + "\">\n";
    s += "<｜DSML｜ parameter name=\"arguments\" string=\"false\">" + calls[i].arguments +
         "</｜DSML｜ parameter>\n</｜DSML｜ invoke>";
  }
  return s + "\n</｜DSML｜ calls>";
}

/// Tool messages and user messages that follow one another become one user turn.
std::vector<chat_message> merge_user_turns(const std::vector<chat_message>& in) {
  std::vector<chat_message> out;
  for (const auto& m : in) {
    bool userish = m.role == "user" || m.role == "tool";
    std::string text = m.role == "tool" ? "<tool_result>" + m.content + "</tool_result>" : m.content;
    if (userish && !out.empty() && out.back().role == "user") {
      out.back().content += "\n\n" + text;
      continue;
    }
    chat_message copy = m;
    if (userish) { copy.role = "user"; copy.content = std::move(text); }
    out.push_back(std::move(copy));
  }
  return out;
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
  std::vector<chat_message> msgs = merge_user_turns(input);
  bool tools_placed = tools.empty();
  if (!tools.empty() && msgs.front().role != "system")
    msgs.insert(msgs.begin(), chat_message{"system", "", {}, {}, {}});
  const bool thinking = reasoning.thinking, drop_thinking = tools.empty();
  int last_user = -1;
  for (int i = 0; i < int(msgs.size()); ++i)
    if (msgs[i].role == "user" || (msgs[i].role == "system" && i > 0)) last_user = i;
  std::string s = dsv41::bos;
  for (int i = 0; i < int(msgs.size()); ++i) {
    const auto& m = msgs[i];
    if (m.content.find(dsv41::image) != std::string::npos)
      return {{}, "message text must not contain the image placeholder token"};
    if (i == 0 && (m.role == "system" || thinking)) {
      s += dsv41::system;
      if (thinking)
        s += "Reasoning Effort: " + std::to_string(reasoning.effort) +
             " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
    }
    if (m.role == "system") {
      if (i > 0) s += dsv41::system;
      s += m.content;
      if (!tools_placed) { s += "\n\n" + tools_text(tools); tools_placed = true; }
    } else if (m.role == "user") {
      s += dsv41::user + m.content;
    } else if (m.role == "latest_reminder") {
      s += dsv41::latest_reminder + m.content;
    } else {  // assistant
      if (thinking && (!drop_thinking || i > last_user)) s += m.reasoning_content + dsv41::think_end;
      s += m.content + tool_calls_text(m.tool_calls) + dsv41::eos;
    }
    bool header_after = m.role == "user" || (m.role == "system" && i > 0);
    bool next_ok = i + 1 == int(msgs.size()) || msgs[i + 1].role == "assistant" ||
                   msgs[i + 1].role == "latest_reminder";
    if (header_after && next_ok)
      s += std::string(dsv41::assistant) +
           (thinking && (!drop_thinking || i >= last_user) ? dsv41::think_begin : dsv41::think_end);
  }
  if (msgs.back().role == "assistant")
    return {{}, "the last message must not be an assistant message"};
  return {tok_->encode(s, false), {}};
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
