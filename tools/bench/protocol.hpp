// The OpenAI wire protocol as `cedar bench` speaks it, kept free of I/O so it can be tested: request
// bodies (Chat Completions, Responses over HTTP, Responses WebSocket `response.create`), the SSE
// framing, and the stream events reduced to what the benchmark measures.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/json_writer.hpp"
#include "tools/bench/conversation.hpp"

namespace cedar::bench {

enum class api_kind { chat, responses, ws };

const char* api_name(api_kind api);
std::optional<api_kind> parse_api(std::string_view name);

/// {"model","messages":[all],"stream":true,"stream_options":{"include_usage":true},"max_tokens"}
std::string chat_body(const std::string& model, const std::vector<message>& messages,
                      int64_t max_tokens);

/// Responses create body with the items messages[first_idx..] as input, chained to
/// `previous_response_id` when it is not empty. Over WebSocket the body is a `response.create`
/// event and carries no "stream" field.
std::string responses_body(const std::string& model, const std::vector<message>& messages,
                           size_t first_idx, const std::string& previous_response_id,
                           int64_t max_tokens, bool websocket);

/// One stream event, reduced.
struct stream_event {
  bool has_tokens = false;        ///< carried generated text (content or reasoning)
  std::string text;               ///< visible content delta (the reply kept in history)
  std::optional<int64_t> num_prompt_tokens, num_output_tokens, num_cached_tokens;  ///< usage
  std::string response_id;        ///< Responses: id from response.created / completed
  bool done = false;              ///< terminal: [DONE] or response.completed
  std::string error;              ///< the server reported an error (terminal)
};

/// Parses one Chat Completions SSE data payload ("[DONE]" included). False if not JSON.
bool parse_chat_event(std::string_view data, stream_event& out);

/// Parses one Responses event (SSE data payload or WebSocket text frame). False if not JSON.
bool parse_responses_event(std::string_view data, stream_event& out);

/// Splits a byte stream into SSE events; returns the data payloads of the events completed by
/// `bytes` (multi-line data joined with '\n'; comments and other fields ignored).
class sse_parser {
 public:
  std::vector<std::string> feed(std::string_view bytes);

 private:
  std::string pending_;   ///< bytes of an incomplete line
  std::string data_;      ///< data lines of the event being read
  bool has_data_ = false;
};

/// The first model id of a GET /v1/models answer ({"data":[{"id":...}]}); empty if none.
std::string first_model_id(std::string_view models_json);

/// Appends `s` as a JSON string literal (quoted, escaped): the server's own writer.
using net::append_json_string;

}  // namespace cedar::bench
