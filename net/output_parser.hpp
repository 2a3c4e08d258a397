// Splits DeepSeek-V4.1 generated text into reasoning_content, content and tool calls while it
// streams (docs: spec/dsv41-chat-format.md §3). Text goes in as it is decoded; deltas come out
// as soon as they are certain, with partial markers and incomplete UTF-8 held back. Accepts the
// V4.1 (`<｜DSML｜ calls>`), V4 (`tool_calls`) and V3.2 (`function_calls`) dialects and bare
// invokes. A malformed call comes back as plain content with a warning, never an error.
// One parser per generation; not thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace cedar::net {

/// A complete tool call: delivered once, when its invoke closes.
struct parsed_tool_call {
  size_t index = 0;       ///< 0, 1, ... in the order the model wrote them
  std::string name;       ///< as written (may be "ns::name")
  std::string arguments;  ///< a JSON object text, json.dumps style: {"k": "v", "n": 3}
};

/// What one feed() or finish() adds. Concatenating the deltas of any chunking of a stream gives
/// the same result as parsing it whole.
struct output_delta {
  std::string reasoning;
  std::string content;
  std::vector<parsed_tool_call> tool_calls;
  std::vector<std::string> warnings;  ///< malformed calls turned into content (for the log)

  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  void append(output_delta&& d);
};

class output_parser {
 public:
  /// thinking: the prompt ended with "<think>", so the output starts inside reasoning.
  explicit output_parser(bool thinking) : state_(thinking ? state::reasoning : state::content) {}

  /// Adds generated text (any split, even inside a UTF-8 character or a marker).
  output_delta feed(std::string_view text);
  /// Ends the stream: everything held back is resolved (an unfinished call becomes content).
  output_delta finish();

  /// True once the end-of-sentence marker was seen in the text.
  bool saw_eos() const { return state_ == state::done; }
  /// True while the text so far is inside the reasoning (before "</think>").
  bool in_reasoning() const { return state_ == state::reasoning; }
  size_t num_tool_calls() const { return num_calls_; }

 private:
  enum class state { reasoning, content, tool_block, bare_invokes, done };

  void run(bool final, output_delta* out);
  bool step_text(bool final, output_delta* out);
  bool step_tool(bool final, output_delta* out);
  void emit_text(std::string_view text, output_delta* out);
  void emit_call_or_content(std::string_view raw, output_delta* out);
  static void warn(std::string warning, output_delta* out);

  state state_;
  std::string buf_;  // received, not yet resolved
  size_t num_calls_ = 0;
};

/// Where warnings about malformed output are logged, besides output_delta::warnings (default:
/// one line on stderr). The function must be thread-safe; nullptr turns logging off.
using warning_log_fn = void (*)(std::string_view warning);
void set_output_warning_log(warning_log_fn fn);

/// Parses a whole output at once.
output_delta parse_output(std::string_view text, bool thinking);

}  // namespace cedar::net
