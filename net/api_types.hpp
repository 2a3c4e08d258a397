// The OpenAI-compatible requests as native structs: what net/api_parse.cpp fills from JSON at the
// edge and what the handlers read. No JSON types leak past this point.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "net/bridge.hpp"

namespace cedar::net {

/// A tool call as the client or the model states it.
struct tool_call {
  std::string id;
  std::string name;
  std::string arguments;  ///< a JSON text, as OpenAI carries it
};

/// One chat message after normalisation (content lists joined, Responses items mapped).
struct chat_message {
  std::string role;  ///< system, user, assistant, tool, latest_reminder (developer -> system)
  std::string content;
  std::string reasoning_content;
  std::vector<tool_call> tool_calls;
  std::string tool_call_id;  ///< role tool
};

/// A function tool offered to the model.
struct tool_def {
  std::string name;
  std::string function_json;  ///< the "function" object, re-serialized compactly
};

/// tool_choice: auto, none or required, or one function by name (kept apart, so that a tool
/// named "none" can be chosen).
struct tool_choice_spec {
  std::string mode = "auto";  ///< auto, none, required, or function
  std::string function;       ///< mode function: the tool's name

  bool names_function() const { return mode == "function"; }
};

/// Reasoning on/off and effort (1-100).
struct reasoning_options {
  bool thinking = true;
  int effort = 75;
  /// the effort as the client named it ("low", "high", ...); empty: given as a number, or not given
  std::string effort_name;
};

/// Everything a generation needs beyond the conversation.
struct generation_options {
  sampling_params sampling;
  int max_tokens = 0;  ///< 0 = server default
  std::vector<std::string> stop;
  bool logprobs = false;
  int top_logprobs = 0;
  bool stream = false;
  bool include_usage = false;
  output_grammar format;    ///< response_format / text.format compiled (inactive: plain text)
  std::string format_json;  ///< Responses: text.format as given, compact (empty: {"type":"text"})
  bool parallel_tool_calls = true;  ///< false: the reply ends with its first tool call
  // vLLM's extras, which benchmark clients send:
  bool ignore_eos = false;               ///< the end token does not end the answer
  int min_tokens = 0;                    ///< no end token or stop token id before this many tokens
  std::vector<int32_t> stop_token_ids;   ///< these end the answer too
};

/// POST /v1/chat/completions
struct chat_request {
  std::string model;
  std::vector<chat_message> messages;
  std::vector<tool_def> tools;
  tool_choice_spec tool_choice;
  reasoning_options reasoning;
  generation_options gen;
  std::string user;
};

/// POST /v1/completions
struct completion_request {
  std::string model;
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;
  bool echo = false;
  generation_options gen;
};

/// POST /v1/responses (also the body of a WebSocket response.create event).
struct responses_request {
  std::string model;
  std::string instructions;
  std::vector<chat_message> input;  ///< the new items, mapped to messages
  std::string previous_response_id;
  std::vector<tool_def> tools;
  tool_choice_spec tool_choice;
  reasoning_options reasoning;
  generation_options gen;
  bool store = true;
  /// "auto": when the conversation outgrows the context window, its oldest turns are dropped
  /// (not the instructions, nor the newest turn); "disabled" (default): such a request is a 400.
  bool truncation_auto = false;
  std::string metadata_json = "{}";  ///< metadata as given (string values), echoed back
};

}  // namespace cedar::net
