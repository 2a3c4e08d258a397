// websocket_session: accept, then read events; each response.create starts a generation whose
// frames stream back as text messages.
#include "net/websocket_session.hpp"

#include <boost/asio/dispatch.hpp>
#include <boost/beast/core/buffers_to_string.hpp>

#include "net/api_parse.hpp"
#include "net/handlers.hpp"
#include "net/json_writer.hpp"
#include "net/ws_coalesce.hpp"

namespace cedar::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;

websocket_session::websocket_session(asio::ip::tcp::socket&& socket, std::shared_ptr<server_state> state)
    : ws_(std::move(socket)), state_(std::move(state)) {
  state_->metrics.num_open_connections.fetch_add(1);
  state_->metrics.num_open_websockets.fetch_add(1);
  session_id_ = state_->new_id("ws-");
}

websocket_session::~websocket_session() {
  if (gen_) gen_->detach();
  for (uint64_t id : engine_sessions_) state_->responses->release(id);
  state_->metrics.num_open_websockets.fetch_sub(1);
  state_->metrics.num_open_connections.fetch_sub(1);
  state_->log({{"event", "websocket_closed"}, {"ws_id", session_id_}, {"turns", num_turns_}});
}

void websocket_session::run(beast::http::request<beast::http::string_body> upgrade) {
  auto& o = state_->options;
  websocket::stream_base::timeout t{std::chrono::seconds(10), std::chrono::seconds(o.idle_timeout_s), true};
  ws_.set_option(t);
  ws_.read_message_max(uint64_t(o.max_ws_message_bytes));
  ws_.set_option(websocket::stream_base::decorator([](websocket::response_type& res) {
    res.set(beast::http::field::server, "cedar");
  }));
  auto req = std::make_shared<beast::http::request<beast::http::string_body>>(std::move(upgrade));
  ws_.async_accept(*req, [self = shared_from_this(), req](beast::error_code ec) { self->on_accept(ec); });
}

void websocket_session::on_accept(beast::error_code ec) {
  if (ec) return fail(ec, "accept");
  state_->log({{"event", "websocket_opened"}, {"ws_id", session_id_}});
  do_read();
}

void websocket_session::do_read() {
  ws_.async_read(buffer_, [self = shared_from_this()](beast::error_code ec, size_t n) {
    self->on_read(ec, n);
  });
}

void websocket_session::on_read(beast::error_code ec, size_t) {
  if (ec) {
    if (ec == websocket::error::message_too_big)
      state_->log({{"event", "websocket_message_too_big"}, {"ws_id", session_id_},
                   {"limit", state_->options.max_ws_message_bytes}});
    return fail(ec, "read");
  }
  std::string text = beast::buffers_to_string(buffer_.data());
  buffer_.consume(buffer_.size());
  handle_event(text);
  if (!closed_) do_read();
}

void websocket_session::handle_event(std::string_view text) {
  const clock::time_point received = clock::now();
  ws_client_event event;
  if (auto err = parse_ws_event(text, event)) {
    log_turn_error(*err);
    return send_error(*err);
  }
  if (event.type == ws_client_event::kind::cancel) {
    if (gen_ && !gen_->finished()) {
      auto keep = gen_;  // cancel() ends in generation_done(); keep it alive until it returns
      keep->cancel();
      return;
    }
    // Nothing to cancel (never started, or it ended as the cancel crossed it): an error event
    // says so, and the socket goes on as before.
    return send_error(api_error{400, "invalid_request_error", "no response is in progress on this socket", {},
                                "response_cancel_not_active"});
  }
  if (gen_ && !gen_->finished()) {
    const api_error busy{409, "invalid_request_error",
                         "a response is already in progress on this socket; send "
                         "response.cancel or wait for it to finish", {}, "response_in_progress"};
    log_turn_error(busy);
    return send_error(busy);
  }
  state_->metrics.num_requests_total.fetch_add(1);
  // previous_response_id names the turn to go on from, as over HTTP; this socket's last turn is
  // found even when it was not stored (store:false) or the store has let it go. Without it, the
  // turn starts a conversation of its own.
  std::shared_ptr<const stored_response> previous;
  if (last_ && event.create.previous_response_id == last_->id) {
    previous = last_;
    event.create.previous_response_id.clear();
  }
  event.create.gen.stream = true;
  std::weak_ptr<websocket_session> weak = weak_from_this();
  auto s = start_responses(state_, ws_.get_executor(), std::move(event.create), previous, this,
                           [weak](std::shared_ptr<const stored_response> r) {
                             if (auto self = weak.lock()) self->last_ = std::move(r);
                           });
  if (s.error) {
    state_->metrics.num_requests_failed.fetch_add(1);
    log_turn_error(*s.error);
    return send_error(*s.error);
  }
  if (s.session_id) engine_sessions_.insert(s.session_id);
  gen_ = std::move(s.gen);
  gen_->set_received_at(received);
  gen_->open_stream();
}

void websocket_session::send_error(const api_error& e) {
  json_writer w;
  w.obj().kv("type", "error").kv("status", int64_t{e.status}).key("error").obj()
      .kv("type", e.type).kv("code", e.code).kv("message", e.message);
  w.key("param");
  if (e.param.empty()) w.null(); else w.str(e.param);
  enqueue(w.end_obj().end_obj().take());
}

void websocket_session::send_frame(std::string_view, std::string json, clock::time_point emitted_at) {
  enqueue(std::move(json), emitted_at);
}

void websocket_session::generation_done() {
  ++num_turns_;
  release_stale_sessions();
  auto& r = gen_->result();
  const double seconds = std::chrono::duration<double>(clock::now() - gen_->started_at()).count();
  state_->metrics.request_duration.observe(seconds);
  const auto ttft = log_value::millis(gen_->ttft_seconds() * 1e3);
  const auto dur = log_value::millis(seconds * 1e3);
  if (state_->options.log_requests)
    state_->log({{"ws_id", session_id_}, {"method", "WS"}, {"path", "/v1/responses"},
                 {"turn", num_turns_},
                 {"prompt_tokens", r.num_prompt_tokens},
                 {"cached_tokens", r.num_cached_tokens},
                 {"completion_tokens", r.num_completion_tokens},
                 {"finish", r.finish_reason_text()}, {"ttft_ms", ttft}, {"duration_ms", dur}});
}

void websocket_session::release_stale_sessions() {
  // Only the last finished turn can be continued from this socket; the engine sessions of the
  // others (cancelled, failed, or followed by a turn of another conversation) go, unless a
  // stored turn still uses them.
  const uint64_t keep = last_ ? last_->session_id : 0;
  for (auto it = engine_sessions_.begin(); it != engine_sessions_.end();) {
    if (*it == keep) { ++it; continue; }
    state_->responses->release(*it);
    it = engine_sessions_.erase(it);
  }
}

void websocket_session::log_turn_error(const api_error& e) {
  if (state_->options.log_requests)
    state_->log({{"ws_id", session_id_}, {"method", "WS"}, {"path", "/v1/responses"},
                 {"status", e.status}, {"error", e.code}});
}

void websocket_session::enqueue(std::string text, clock::time_point emitted_at) {
  if (closed_) return;
  queued_bytes_ += text.size();
  if (int64_t(queued_bytes_) > state_->options.max_queued_bytes) {
    state_->log({{"event", "slow_client_closed"}, {"ws_id", session_id_}});
    return close_now();
  }
  // The back may take this event unless it is the front being written.
  constexpr size_t max_merged_bytes = 64 << 10;
  if (queue_.size() > (writing_ ? 1u : 0u) && queue_.back().text.size() < max_merged_bytes) {
    auto& back = queue_.back().text;
    const size_t old_size = back.size();
    if (merge_delta_events(back, text)) {
      queued_bytes_ = queued_bytes_ - text.size() - old_size + back.size();
      state_->metrics.num_ws_merged_events.fetch_add(1);
      return;
    }
  }
  queue_.push_back({std::move(text), emitted_at});
  if (!writing_) do_write();
}

void websocket_session::do_write() {
  if (closed_ || queue_.empty()) return;
  writing_ = true;
  ws_.text(true);
  ws_.async_write(asio::buffer(queue_.front().text),
                  [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_write(ec, n); });
}

void websocket_session::on_write(beast::error_code ec, size_t) {
  writing_ = false;
  if (ec) return fail(ec, "write");
  auto& front = queue_.front();
  if (front.emitted_at != clock::time_point{})
    state_->metrics.server_added.observe(std::chrono::duration<double>(clock::now() - front.emitted_at).count());
  queued_bytes_ -= front.text.size();
  queue_.pop_front();
  do_write();
}

void websocket_session::fail(beast::error_code ec, const char* what) {
  if (ec != websocket::error::closed && ec != asio::error::operation_aborted &&
      ec != asio::error::eof && ec != asio::error::connection_reset && ec != beast::error::timeout &&
      ec != websocket::error::message_too_big)
    state_->log({{"event", "io_error"}, {"what", what}, {"error", ec.message()}, {"ws_id", session_id_}});
  close_now();
}

void websocket_session::close_now() {
  if (closed_) return;
  closed_ = true;
  if (gen_) { gen_->detach(); }
  beast::error_code ec;
  ws_.next_layer().shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  ws_.next_layer().close(ec);
}

}  // namespace cedar::net
