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
};

/// Result of rendering a conversation: prompt ids, or an error message for a 400.
struct rendered_prompt {
  std::vector<int32_t> ids;
  std::string error;
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
  /// Plain text -> ids (no chat template, BOS first), for /v1/completions.
  rendered_prompt encode_text(const std::string& text) const;
  /// Parser for chat output (starts inside reasoning when thinking is on).
  std::unique_ptr<output_stream> chat_output(bool thinking) const;
  /// Plain text output (special tokens dropped), for /v1/completions.
  std::unique_ptr<output_stream> text_output() const;
  /// The text of one token (for logprobs).
  std::string token_text(int32_t id) const;
  /// Ids that end a generation (EOS).
  std::vector<int32_t> stop_ids() const;
  /// A token id whose text is a short word (the null engine's fixed token).
  int32_t filler_token_id() const;
  int32_t vocab_size() const;

 private:
  explicit prompt_codec(std::unique_ptr<tokenizer> tok);
  std::unique_ptr<tokenizer> tok_;
};

}  // namespace cedar::net
