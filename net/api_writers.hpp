// The three OpenAI response shapes, each a response_writer: Chat Completions (chat.completion /
// chat.completion.chunk), Completions (text_completion), and Responses (response object and its
// streaming events). Writers are per generation and run on its strand.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "net/generation.hpp"
#include "net/server_state.hpp"

namespace cedar::net {

/// What every writer needs to name its output.
struct writer_context {
  std::string id;          ///< chatcmpl-..., cmpl-..., resp_...
  std::string model;
  int64_t created = 0;     ///< unix seconds
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  const prompt_codec* codec = nullptr;
};

std::unique_ptr<response_writer> make_chat_writer(writer_context ctx);
std::unique_ptr<response_writer> make_completion_writer(writer_context ctx, std::string echo_text);

/// A Responses turn: what is stored when it ends (for previous_response_id).
struct responses_turn {
  std::shared_ptr<server_state> state;
  std::vector<chat_message> conversation;  ///< prior turns + this turn's input
  std::vector<tool_def> tools;
  std::string instructions;
  std::string previous_response_id;
  tool_choice_spec tool_choice;
  bool parallel_tool_calls = true;
  reasoning_options reasoning;
  sampling_params sampling;
  int max_output_tokens = 0;
  std::string format_json;  ///< text.format as asked (empty: plain text), echoed in the response
  std::string metadata_json = "{}";  ///< echoed in the response
  uint64_t session_id = 0;
  std::shared_ptr<const chat_context> context;  ///< the prompt as rendered; the reply extends it
  bool store = true;
  bool truncation_auto = false;
  /// Called with the stored turn when the response completes (the WebSocket keeps its last one).
  std::function<void(std::shared_ptr<const stored_response>)> on_stored;
};

std::unique_ptr<response_writer> make_responses_writer(writer_context ctx, responses_turn turn);

/// The usage object of Chat Completions and Completions.
void write_chat_usage(class json_writer& w, const turn_result& r);

}  // namespace cedar::net
