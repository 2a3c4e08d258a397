// One HTTP/1.1 connection: reads requests (with header/body limits and an idle timeout), routes
// them, and writes answers from a queue of immutable buffers. A generating request streams SSE
// over chunked encoding or collects one JSON body; while it runs, a read on the socket notices a
// client that goes away and cancels the generation at once. A WebSocket upgrade on
// /v1/responses hands the socket to websocket_session. Every handler runs on the socket's strand.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "net/generation.hpp"
#include "net/handlers.hpp"
#include "net/server_state.hpp"

namespace cedar::net {

class http_session : public std::enable_shared_from_this<http_session>, public frame_sink {
 public:
  http_session(boost::asio::ip::tcp::socket&& socket, std::shared_ptr<server_state> state);
  ~http_session() override;
  void run();

  void send_frame(std::string_view event, std::string json,
                  std::chrono::steady_clock::time_point emitted_at) override;
  void generation_done() override;

 private:
  using request_parser = boost::beast::http::request_parser<boost::beast::http::string_body>;
  using clock = std::chrono::steady_clock;

  void do_read();
  void on_read(boost::beast::error_code ec, size_t bytes);
  void handle_request();
  bool authorised(std::string_view target);
  void start_generation(std::string_view path, const std::string& body);
  void switch_layout(const std::string& body);
  /// Answers, logs the request and counts a /v1/ one answered >= 400 as failed; `detail` is
  /// the log's error field.
  void respond(const simple_response& r, bool close_after = false, const std::string& detail = {});
  void respond_error(const api_error& e, bool close_after = false);
  void enqueue(std::string bytes, clock::time_point emitted_at = {});
  void do_write();
  void on_write(boost::beast::error_code ec, size_t bytes, size_t num_buffers);
  void watch_disconnect();
  void arm_timer(int seconds);
  void disarm_timer();
  void linger_close();
  void close();
  void fail(boost::beast::error_code ec, const char* what);
  void log_request(int status, const std::string& error_code);

  struct out_buffer {
    std::shared_ptr<const std::string> bytes;
    clock::time_point emitted_at;  ///< when the engine produced the token it carries (or epoch)
  };

  boost::asio::ip::tcp::socket socket_;
  boost::beast::flat_buffer buffer_;
  std::optional<request_parser> parser_;
  boost::asio::steady_timer timer_;
  uint64_t timer_gen_ = 0;
  std::shared_ptr<server_state> state_;
  std::deque<out_buffer> queue_;
  size_t queued_bytes_ = 0;
  bool writing_ = false;
  bool closed_ = false;
  bool close_after_write_ = false;
  bool keep_alive_ = true;
  bool watching_ = false;      ///< a disconnect-watch read is pending
  bool read_after_watch_ = false;
  bool streaming_ = false;     ///< SSE: frames go out as chunks
  bool named_events_ = false;  ///< SSE "event:" lines (Responses)
  bool is_api_ = false;        ///< the request's path is under /v1/
  std::shared_ptr<generation> gen_;
  /// This session, while a generation runs with no read pending to keep it alive (the client
  /// pipelined more than the watch buffers); released when the generation ends or on close.
  std::shared_ptr<http_session> hold_;
  std::string body_;           ///< non-streaming: the whole answer
  std::string method_, path_, request_id_;
  clock::time_point request_start_;
  std::string remote_;
};

}  // namespace cedar::net
