// Conversation -> prompt token ids, and generated ids -> output deltas (reasoning, content, tool
// calls). The handlers only see this interface; it is built over the tokenizer, the V4.1 chat
// encoding and the streaming output parser. One codec per server (thread-safe, read-only); one
// output_stream per generation (used on that generation's strand only).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "net/api_types.hpp"

namespace cedar::net {

class tokenizer;

/// One piece of parsed model output.
struct stream_delta {
  enum class kind : uint8_t { reasoning, content, tool_call_begin, tool_call_args };
  kind type = kind::content;
  std::string text;         ///< reasoning/content text, or an arguments fragment
  int tool_index = -1;      ///< for tool-call kinds: 0, 1, ... in order of appearance
  std::string tool_name;    ///< for tool_call_begin
};

/// Turns one generation's token ids into deltas.
class output_stream {
 public:
  virtual ~output_stream() = default;
  /// Appends deltas for `ids` to `out`; text split across ids is held until it is whole.
  virtual void push(const std::vector<int32_t>& ids, std::vector<stream_delta>& out) = 0;
  /// Flushes whatever is held (the generation ended).
  virtual void finish(std::vector<stream_delta>& out) = 0;
  /// True while the ids pushed so far are inside the reasoning: the next id counts as a
  /// reasoning token (text held back, such as a paragraph break, included).
  virtual bool in_reasoning() const { return false; }
};

/// Result of rendering a conversation: prompt ids, or an error message for a 400.
struct rendered_prompt {
  std::vector<int32_t> ids;
  std::string error;
};

/// A conversation rendered so far, with its ids (defined in prompt_codec.cpp). Immutable: a
/// Responses chain shares it between turns, and each turn copies it to grow it.
struct chat_context;

/// A prompt that starts or continues a conversation.
struct context_prompt {
  std::shared_ptr<const chat_context> context;  ///< the conversation up to the assistant header
  std::vector<int32_t> ids;                     ///< the whole prompt (context's ids)
  std::string error;                            ///< set instead of the above (a 400)
};

class prompt_codec {
 public:
  /// Loads the tokenizer (path empty = the default); on failure returns nullptr and sets error.
  static std::unique_ptr<prompt_codec> create(const std::string& tokenizer_path, std::string* error);
  ~prompt_codec();

  /// The V4.1 chat encoding of messages with tools, ending with the assistant header.
  rendered_prompt render_chat(const std::vector<chat_message>& messages,
                              const std::vector<tool_def>& tools,
                              const reasoning_options& reasoning) const;
  /// Starts (previous null) or continues a conversation with `messages`, rendering and
  /// tokenizing only the new turns. Control tokens come only from the template: a message
  /// that types "<｜User｜>" gets the ids of that text. Tools and reasoning are fixed when the
  /// conversation starts; continuing one whose tools or reasoning differ is an error (check
  /// with can_continue and start over from the messages instead).
  context_prompt extend_chat(const std::shared_ptr<const chat_context>& previous,
                             const std::vector<chat_message>& messages, const std::vector<tool_def>& tools,
                             const reasoning_options& reasoning) const;
  /// Whether `context` was started with these tools and reasoning options.
  bool can_continue(const chat_context& context, const std::vector<tool_def>& tools,
                    const reasoning_options& reasoning) const;
  /// `context` followed by the assistant's reply (the next turn extends this); null when the
  /// reply cannot be rendered. `generated` (the ids the model emitted for it) become the reply's
  /// ids when they spell the rendered reply as the output stream decodes them (bytes that are
  /// not UTF-8 as U+FFFD; an end token is added when the reply was cut short), so the next
  /// prompt extends what the engine holds; else the text is tokenized.
  std::shared_ptr<const chat_context> with_reply(const std::shared_ptr<const chat_context>& context,
                                                 const chat_message& reply,
                                                 const std::vector<int32_t>& generated = {}) const;
  /// The ids of a context (prompt and replies so far).
  static const std::vector<int32_t>& context_ids(const chat_context& context);
  /// About the memory a context takes: its messages, its text and its ids.
  static size_t context_bytes(const chat_context& context);
  /// A raw prompt -> ids for /v1/completions: no chat template, control-token text (the chat
  /// markers, "</think>") encoded as those tokens, one BOS first (added unless the text starts
  /// with it).
  rendered_prompt encode_text(const std::string& text) const;
  /// The ids that open an assistant turn's tool call of function `name` (the calls block and the
  /// invoke up to its name, as the chat encoding writes them): a forced tool_choice makes the
  /// reply start with them. Tokenized as the same text inside a whole call is, so the model
  /// goes on from where its own ids would stand.
  std::vector<int32_t> tool_call_lead(const std::string& name) const;
  /// Parser for chat output (starts inside reasoning when thinking is on).
  std::unique_ptr<output_stream> chat_output(bool thinking) const;
  /// Plain text output for /v1/completions: every token spelled out but BOS and EOS.
  std::unique_ptr<output_stream> text_output() const;
  /// The text of one token (for logprobs).
  std::string token_text(int32_t id) const;
  /// A token as the Completions logprobs name it: its text when that is whole UTF-8, else
  /// "bytes:\xe4..." (so two byte tokens are never the same key of a top_logprobs object).
  std::string token_name(int32_t id) const;
  /// Ids that end a generation (EOS).
  std::vector<int32_t> stop_ids() const;
  /// A token id whose text is a short word (the null engine's fixed token).
  int32_t filler_token_id() const;
  int32_t vocab_size() const;
  /// The tokenizer everything above is built on.
  const tokenizer& text_tokenizer() const { return *tok_; }

 private:
  explicit prompt_codec(std::unique_ptr<tokenizer> tok);
  std::unique_ptr<tokenizer> tok_;
};

}  // namespace cedar::net
