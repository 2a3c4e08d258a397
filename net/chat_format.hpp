// DeepSeek-V4.1 chat encoding: conversations as native structs, rendered into the exact prompt
// text of the model's reference encoder (docs: spec/dsv41-chat-format.md §2). A `conversation`
// grows by appending turns without re-rendering what it already holds, so a long agent session
// costs time proportional to each new turn. Plain data; one conversation per session thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/py_json.hpp"
#include "net/tokenizer.hpp"

namespace cedar::net::chat {

/// One part of a message's content list (OpenAI/Anthropic style).
struct content_block {
  std::string type;         ///< "text", "image_url", "image", "tool_result", or any other (rendered "[Unsupported X]")
  std::string text;         ///< text; for tool_result, its content when that is a string
  std::string tool_use_id;  ///< tool_result: the call it answers
  std::vector<content_block> parts;  ///< tool_result content given as a list
  bool parts_is_list = false;
  bool has_image_source = false;  ///< image blocks: a url/data/source was given
  bool image_placeholder = false; ///< set by the encoder: this text is the image token itself
};

/// A tool call of an assistant message.
struct tool_call {
  std::string id;
  std::string name;       ///< may be "ns::name"
  std::string name_space; ///< explicit namespace, or empty
  json_value arguments;   ///< an object, or a string holding JSON (possibly double-encoded)
};

/// One message. `role` is kept as text so that an unknown role is reported, not guessed.
struct message {
  std::string role;  ///< system, user, assistant, tool, latest_reminder
  std::string content;
  bool content_is_list = false;
  std::vector<content_block> blocks;  ///< the content list, when content_is_list
  std::optional<std::string> reasoning_content;
  std::vector<json_value> tools;            ///< system only: OpenAI tool objects {"type","function"}
  std::optional<json_value> response_format;  ///< system only
  std::vector<tool_call> tool_calls;          ///< assistant only
  std::string tool_call_id;                   ///< tool only
  std::string task;                           ///< internal task: action, query, authority, domain, title, read_url
  bool wo_eos = false;                        ///< assistant without the closing EOS (a prefill)
};

struct render_options {
  bool thinking = true;        ///< thinking mode (prompt ends "<think>") or chat ("</think>")
  int effort = 75;             ///< reasoning effort 1-100 (rendered in thinking mode only)
  bool drop_thinking = true;   ///< drop reasoning of turns before the last user (off when tools exist)
  bool add_bos = true;
};

/// Reasoning effort from text: an integer 1-100, or low (50), high (75), max (100).
std::optional<int> parse_effort(std::string_view text, std::string* error);

/// A rendered conversation that only ever grows. append() preprocesses and renders just the
/// new messages (the reference encoder's `context` mode): text() before the call is a prefix
/// of text() after it, byte for byte.
class conversation {
 public:
  explicit conversation(render_options opts = {}) : opts_(opts) {}

  /// Renders `msgs` after what is already there. On error (unknown role, bad task, image
  /// placeholder in text, bad tool name) nothing changes and nullopt comes back. Returns the
  /// text added.
  std::optional<std::string> append(std::vector<message> msgs, std::string* error);

  const std::string& text() const { return text_; }
  size_t num_messages() const { return messages_.size(); }
  /// How many messages the last append rendered (the new ones only).
  size_t num_rendered_last_append() const { return num_rendered_last_; }
  const render_options& options() const { return opts_; }
  /// Byte ranges of text() that hold message text rather than template (sorted).
  const std::vector<text_range>& literal_ranges() const { return literal_; }
  /// Ids of text() from byte `from` on (the size of text() before some append), with special
  /// tokens matched only in the template: a user's "<｜User｜>" stays text (as DeepSeek's own
  /// serving stack does; the reference tokenizes the whole string and differs only there).
  std::vector<int32_t> encode_from(const tokenizer& tok, size_t from = 0) const;

 private:
  bool render_one(size_t idx, std::string* out, std::vector<text_range>* literal, std::string* error) const;
  std::optional<size_t> last_user_index() const;

  render_options opts_;
  std::vector<message> messages_;  // preprocessed: tool results merged into user turns
  std::string text_;
  std::vector<text_range> literal_;  // message text inside text_
  bool has_tools_ = false;
  std::map<std::string, size_t> last_call_order_;  // tool_call id -> position, of the latest assistant
  size_t num_rendered_last_ = 0;
};

/// Renders a whole conversation (conversation{opts}.append(msgs)).
std::optional<std::string> render(std::vector<message> msgs, const render_options& opts, std::string* error);

/// A chat request as JSON: either an array of messages or an object with "messages" and
/// optionally "tools" (put on the first system message, or on a new empty one at index 0),
/// "thinking" (bool) or "thinking_mode" ("thinking"/"chat"), and "reasoning_effort".
struct parsed_request {
  std::vector<message> messages;
  std::optional<bool> thinking;
  std::optional<int> effort;
};
std::optional<parsed_request> parse_request_json(std::string_view json, std::string* error);
/// One message object as JSON.
std::optional<message> parse_message(const json_value& v, std::string* error);

}  // namespace cedar::net::chat
