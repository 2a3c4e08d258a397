// The Responses WebSocket mode on /v1/responses: one socket, many turns. The client sends
// {"type":"response.create", ...} with only the new input and previous_response_id (the socket
// keeps its last turn, so that works with store:false too; without previous_response_id a turn
// starts a new conversation) and {"type":"response.cancel"}; the server answers
// with the same events it streams over SSE, one response in flight per socket. Outgoing frames
// wait in a queue; while a write is in flight, a delta event is merged into the queued delta
// before it (net/ws_coalesce.hpp), so a busy socket sends one message per flush rather than one
// per token. Everything runs on the socket's strand. The socket holds the engine session of its
// last turn; closing it closes that session unless stored turns still use it (a client may
// reconnect and go on with previous_response_id).
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket/stream.hpp>

#include <chrono>
#include <deque>
#include <memory>
#include <set>
#include <string>

#include "net/generation.hpp"
#include "net/server_state.hpp"

namespace cedar::net {

class websocket_session : public std::enable_shared_from_this<websocket_session>, public frame_sink {
 public:
  websocket_session(boost::asio::ip::tcp::socket&& socket, std::shared_ptr<server_state> state);
  ~websocket_session() override;
  /// Accepts the upgrade request, then reads events until the socket closes.
  void run(boost::beast::http::request<boost::beast::http::string_body> upgrade);

  void send_frame(std::string_view event, std::string json,
                  std::chrono::steady_clock::time_point emitted_at) override;
  void generation_done() override;

 private:
  using clock = std::chrono::steady_clock;
  void on_accept(boost::beast::error_code ec);
  void do_read();
  void on_read(boost::beast::error_code ec, size_t bytes);
  void handle_event(std::string_view text);
  void send_error(const api_error& e);
  void log_turn_error(const api_error& e);
  void release_stale_sessions();
  void enqueue(std::string text, clock::time_point emitted_at = {});
  void do_write();
  void on_write(boost::beast::error_code ec, size_t bytes);
  void fail(boost::beast::error_code ec, const char* what);
  void close_now();

  struct out_buffer {
    std::string text;  ///< not changed while it is the front and a write is in flight
    clock::time_point emitted_at;
  };

  boost::beast::websocket::stream<boost::asio::ip::tcp::socket> ws_;
  boost::beast::flat_buffer buffer_;
  std::shared_ptr<server_state> state_;
  std::deque<out_buffer> queue_;
  size_t queued_bytes_ = 0;
  bool writing_ = false;
  bool closed_ = false;
  std::shared_ptr<generation> gen_;
  std::shared_ptr<const stored_response> last_;  ///< this socket's last finished turn
  std::string session_id_;
  std::set<uint64_t> engine_sessions_;  ///< of the running turn and last_, held by this socket
  int num_turns_ = 0;
};

}  // namespace cedar::net
