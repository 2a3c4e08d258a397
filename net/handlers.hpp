// What each endpoint does, independent of the transport: the GET pages (models, health, metrics,
// the chat page) as whole responses, and the three generating endpoints as generations started
// against a frame_sink. http_session and websocket_session call these on their strands.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "net/api_parse.hpp"
#include "net/generation.hpp"
#include "net/server_state.hpp"

namespace cedar::net {

/// A complete non-streaming HTTP answer.
struct simple_response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

simple_response error_response(const api_error& e);

/// GET routes and other bodiless answers; nullopt if `target` is not one of them.
std::optional<simple_response> handle_get(server_state& state, std::string_view target);
/// /admin/* (already authorised): GET /admin/state. (POST /admin/layout is in http_session.)
simple_response handle_admin(server_state& state, std::string_view method, std::string_view target);

/// A started generation, or why none was started.
struct started {
  std::shared_ptr<generation> gen;
  std::optional<api_error> error;
  bool stream = false;
  uint64_t session_id = 0;  ///< Responses: the engine session the chain runs in
};

started start_chat(const std::shared_ptr<server_state>& state, boost::asio::any_io_executor strand,
                   std::string_view body, frame_sink* sink);
started start_completion(const std::shared_ptr<server_state>& state,
                         boost::asio::any_io_executor strand, std::string_view body, frame_sink* sink);

/// Responses from an already-parsed request. `implicit_previous` (the WebSocket's last turn) is
/// used when the request names no previous_response_id. on_stored receives the finished turn.
started start_responses(const std::shared_ptr<server_state>& state,
                        boost::asio::any_io_executor strand, responses_request request,
                        std::shared_ptr<const stored_response> implicit_previous, frame_sink* sink,
                        std::function<void(std::shared_ptr<const stored_response>)> on_stored = {});

/// The embedded chat page (net/chat_page.cpp).
std::string_view chat_page_html();

}  // namespace cedar::net
