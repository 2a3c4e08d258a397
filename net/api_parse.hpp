// JSON in: parses request bodies with simdjson into the native structs of api_types.hpp and
// validates every field a handler reads. Unknown fields are ignored. Each function returns an
// api_error (400, naming the field) or nothing on success. Thread-compatible: one parser per call.
#pragma once

#include <optional>
#include <string_view>

#include "net/api_error.hpp"
#include "net/api_types.hpp"

namespace cedar::net {

std::optional<api_error> parse_chat_request(std::string_view body, chat_request& out);
std::optional<api_error> parse_completion_request(std::string_view body, completion_request& out);
std::optional<api_error> parse_responses_request(std::string_view body, responses_request& out);

/// A client event on the Responses WebSocket.
struct ws_client_event {
  enum class kind { create, cancel } type = kind::create;
  responses_request create;          ///< when type == create
};

/// Parses {"type":"response.create", ...fields | "response":{...}} or {"type":"response.cancel"}.
std::optional<api_error> parse_ws_event(std::string_view text, ws_client_event& out);

/// POST /admin/layout: {"layout":"tp4"|"dep2"|...}.
std::optional<api_error> parse_layout_request(std::string_view body, std::string& layout);

/// A 400 for a tool_choice the tools offered cannot meet: "required" with no tools, or a function
/// not among them (Responses: after a chained turn has taken its previous turn's tools).
std::optional<api_error> check_tool_choice(const tool_choice_spec& choice, const std::vector<tool_def>& tools);

/// Maps reasoning_effort values to 1-100: "low" 50, "medium"/"high"/"xhigh" 75, "max" 100;
/// "none" turns thinking off. Returns false for anything else.
bool parse_effort(std::string_view name, reasoning_options& out);

/// The effort as a Responses object echoes it (a string, as OpenAI's clients read it): "none"
/// with thinking off, else the client's own word, else the nearest of "low" (50), "medium" (75,
/// the default) and "max" (100).
std::string effort_name(const reasoning_options& r);

}  // namespace cedar::net
