// http_session: read -> route -> answer (whole, or streamed as SSE chunks) -> read again.
#include "net/http_session.hpp"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/websocket/rfc6455.hpp>

#include "net/admin_layout.hpp"
#include "net/api_parse.hpp"
#include "net/websocket_session.hpp"

namespace cedar::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

std::string head(int status, std::string_view content_type, std::optional<size_t> length,
                 bool keep_alive, const std::string& request_id) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " +
                  std::string(http::obsolete_reason(http::status(status))) + "\r\n";
  h += "Server: cedar\r\nContent-Type: ";
  h += content_type;
  h += "\r\n";
  if (length) h += "Content-Length: " + std::to_string(*length) + "\r\n";
  else h += "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\n";
  if (!request_id.empty()) h += "X-Request-Id: " + request_id + "\r\n";
  h += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return h;
}

std::string chunk(std::string_view data) {
  char size[20];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string c = size;
  c += data;
  c += "\r\n";
  return c;
}

bool bearer_matches(std::string_view header, const std::string& key) {
  constexpr std::string_view prefix = "Bearer ";
  if (header.size() != prefix.size() + key.size() || header.substr(0, prefix.size()) != prefix)
    return false;
  unsigned diff = 0;  // no early exit: the time taken does not reveal the matching prefix
  for (size_t i = 0; i < key.size(); ++i) diff |= unsigned(header[prefix.size() + i] ^ key[i]);
  return diff == 0;
}

}  // namespace

http_session::http_session(asio::ip::tcp::socket&& socket, std::shared_ptr<server_state> state)
    : socket_(std::move(socket)), timer_(socket_.get_executor()), state_(std::move(state)) {
  state_->metrics.num_open_connections.fetch_add(1);
  beast::error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
}

http_session::~http_session() {
  if (gen_) gen_->detach();
  state_->metrics.num_open_connections.fetch_sub(1);
}

void http_session::run() {
  asio::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->do_read(); });
}

void http_session::do_read() {
  if (closed_) return;
  parser_.emplace();
  parser_->header_limit(uint32_t(state_->options.max_header_bytes));
  parser_->body_limit(uint64_t(state_->options.max_body_bytes));
  arm_timer(state_->options.idle_timeout_s);
  http::async_read(socket_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_read(ec, n); });
}

void http_session::on_read(beast::error_code ec, size_t) {
  disarm_timer();
  if (closed_) return;
  request_start_ = clock::now();
  if (ec == http::error::end_of_stream || ec == asio::error::connection_reset) return close();
  // A request refused before handle_request: its method and path when the header was read.
  is_api_ = false;
  method_ = path_ = "?";
  if (parser_->is_header_done()) {
    method_ = std::string(parser_->get().method_string());
    const auto target = parser_->get().target();
    path_ = std::string(target.substr(0, target.find('?')));
  }
  if (ec == http::error::body_limit) {
    request_id_ = state_->new_id("req-");
    return respond_error({413, "invalid_request_error", "request body exceeds the limit of " +
                          std::to_string(state_->options.max_body_bytes) + " bytes", {}, "body_too_large"}, true);
  }
  if (ec == http::error::header_limit) {
    request_id_ = state_->new_id("req-");
    return respond_error({431, "invalid_request_error", "request headers are too large", {}, "headers_too_large"},
                         true);
  }
  if (ec == asio::error::operation_aborted) return close();
  if (ec) {
    if (buffer_.size() == 0 && !parser_->got_some()) return close();
    request_id_ = state_->new_id("req-");
    return respond_error(bad_request(std::string("malformed HTTP request: ") + ec.message(), {}, "bad_http"), true);
  }
  handle_request();
}

bool http_session::authorised(std::string_view target) {
  auto& req = parser_->get();
  auto field = req[http::field::authorization];
  std::string_view auth(field.data(), field.size());
  if (target.substr(0, 7) == "/admin/") return bearer_matches(auth, state_->options.admin_key);
  if (target.substr(0, 4) != "/v1/" || state_->options.api_key.empty()) return true;
  if (bearer_matches(auth, state_->options.api_key)) return true;
  // Browsers cannot set headers on a WebSocket: the page may pass the key as a query parameter.
  auto q = target.find("api_key=");
  return beast::websocket::is_upgrade(req) && q != std::string_view::npos &&
         target.substr(q + 8, target.find('&', q) - q - 8) == state_->options.api_key;
}

void http_session::handle_request() {
  auto& req = parser_->get();
  method_ = std::string(req.method_string());
  std::string target(req.target());
  path_ = target.substr(0, target.find('?'));
  request_id_ = state_->new_id("req-");
  keep_alive_ = req.keep_alive();
  // Every /v1/ request counts in the total, and each one answered >= 400 as failed (respond);
  // a WebSocket counts its turns instead.
  is_api_ = path_.rfind("/v1/", 0) == 0 && !beast::websocket::is_upgrade(req);
  if (is_api_) state_->metrics.num_requests_total.fetch_add(1);
  if (path_.rfind("/admin/", 0) == 0 && state_->options.admin_key.empty())
    return respond_error(not_found("Unknown path " + path_, {}, "unknown_url"));
  if (!authorised(target)) return respond_error(unauthorized());
  if (!state_->loaded.load(std::memory_order_acquire)) {  // the model is still loading
    if (path_ == "/health") return respond({503, "application/json", R"({"status":"loading"})"}, false, "loading");
    return respond_error(not_ready("the model is still loading; retry shortly"));
  }
  if (beast::websocket::is_upgrade(req)) {
    if (path_ != "/v1/responses")
      return respond_error(not_found("no WebSocket endpoint at " + path_, {}, "unknown_url"), true);
    closed_ = true;  // the socket now belongs to the WebSocket session
    log_request(101, {});
    std::make_shared<websocket_session>(std::move(socket_), state_)->run(parser_->release());
    return;
  }
  if (req.method() == http::verb::post && path_ == "/admin/layout") return switch_layout(req.body());
  if (auto r = path_.rfind("/admin/", 0) == 0 ? handle_admin_layout(*state_, method_, path_, req.body()) : std::nullopt)
    return respond(*r);
  if (path_.rfind("/admin/", 0) == 0) return respond(handle_admin(*state_, method_, path_));
  if (req.method() == http::verb::post &&
      (path_ == "/v1/chat/completions" || path_ == "/v1/completions" || path_ == "/v1/responses"))
    return start_generation(path_, req.body());
  if (req.method() == http::verb::delete_ && path_.rfind("/v1/responses/", 0) == 0) {
    std::string id = path_.substr(14);
    if (!state_->responses->erase(id))
      return respond_error(not_found("No response with id '" + id + "'", "response_id", "response_not_found"));
    return respond({200, "application/json", "{\"id\":\"" + id + "\",\"object\":\"response\",\"deleted\":true}"});
  }
  if (req.method() == http::verb::get || req.method() == http::verb::head) {
    if (auto r = handle_get(*state_, target)) return respond(*r);
  }
  bool known = path_ == "/v1/chat/completions" || path_ == "/v1/completions" ||
               path_ == "/v1/responses" || path_ == "/v1/models" || path_ == "/health" ||
               path_ == "/metrics" || path_ == "/";
  if (known)
    return respond_error({405, "invalid_request_error", "method " + method_ + " not allowed on " + path_, {},
                          "method_not_allowed"});
  respond_error(not_found("Unknown path " + path_, {}, "unknown_url"));
}

void http_session::start_generation(std::string_view path, const std::string& body) {
  auto strand = socket_.get_executor();
  started s;
  named_events_ = path == "/v1/responses";
  if (path == "/v1/chat/completions") {
    s = start_chat(state_, strand, body, this);
  } else if (path == "/v1/completions") {
    s = start_completion(state_, strand, body, this);
  } else {
    responses_request req;
    if (auto err = parse_responses_request(body, req)) s.error = std::move(err);
    else s = start_responses(state_, strand, std::move(req), nullptr, this);
  }
  if (s.error) return respond_error(*s.error);
  gen_ = std::move(s.gen);
  gen_->set_received_at(request_start_);  // TTFT includes parsing, rendering and tokenizing
  streaming_ = s.stream;
  body_.clear();
  if (streaming_) enqueue(head(200, "text/event-stream", std::nullopt, keep_alive_, request_id_));
  gen_->open_stream();
  watch_disconnect();
}

void http_session::switch_layout(const std::string& body) {
  std::string layout;
  if (auto err = parse_layout_request(body, layout)) return respond_error(*err);
  state_->log({{"event", "layout_switch_start"}, {"req_id", request_id_}, {"layout", layout}});
  // Nothing else is pending on this connection meanwhile: the callback keeps it alive.
  auto strand = socket_.get_executor();
  state_->engine->switch_layout(layout, [self = shared_from_this(), strand](int status, std::string error,
                                                                           std::string summary) {
    asio::post(strand, [self, status, error = std::move(error), summary = std::move(summary)] {
      if (self->closed_) return;
      self->state_->log({{"event", "layout_switch_done"}, {"req_id", self->request_id_},
                         {"error", error}, {"result", summary}});
      if (status == 404) return self->respond_error(not_found(error, {}, "no_layouts"));
      if (status == 409)
        return self->respond_error({409, "invalid_request_error", error, "layout", "layout_switch_running"});
      if (!error.empty())
        return self->respond_error(bad_request(error, "layout", "layout_switch_failed"));
      self->respond({200, "application/json", summary});
    });
  });
}

void http_session::send_frame(std::string_view event, std::string json, clock::time_point emitted_at) {
  if (closed_) return;
  if (!streaming_) { body_ = std::move(json); return; }
  std::string sse;
  sse.reserve(json.size() + event.size() + 24);
  if (named_events_ && !event.empty()) { sse += "event: "; sse += event; sse += '\n'; }
  sse += "data: ";
  sse += json;
  sse += "\n\n";
  enqueue(chunk(sse), emitted_at);
}

void http_session::generation_done() {
  if (closed_) return;
  auto keep = std::move(hold_);  // pending writes keep the session from here on
  auto& r = gen_->result();
  state_->metrics.request_duration.observe(std::chrono::duration<double>(clock::now() - request_start_).count());
  const bool failed = r.finished == finish_reason::error && !named_events_ && !streaming_;
  log_request(failed ? 500 : 200, failed ? r.error : r.finish_reason_text());
  if (streaming_) {
    enqueue("0\r\n\r\n");
    streaming_ = false;
  } else {
    // chat and completions answer an engine failure with its error object (Responses: a failed response)
    enqueue(head(failed ? 500 : 200, "application/json", body_.size(), keep_alive_, request_id_) + body_);
    body_.clear();
  }
  if (!keep_alive_) close_after_write_ = true;
}

void http_session::respond_error(const api_error& e, bool close_after) {
  respond(error_response(e), close_after, e.code);
}

void http_session::respond(const simple_response& r, bool close_after, const std::string& detail) {
  if (is_api_ && r.status >= 400) state_->metrics.num_requests_failed.fetch_add(1);
  log_request(r.status, detail);
  if (close_after) keep_alive_ = false;
  bool head_only = parser_ && parser_->get().method() == http::verb::head;
  enqueue(head(r.status, r.content_type, r.body.size(), keep_alive_, request_id_) +
          (head_only ? std::string() : r.body));
  close_after_write_ = !keep_alive_;  // otherwise on_write reads the next request
}

void http_session::enqueue(std::string bytes, clock::time_point emitted_at) {
  if (closed_) return;
  queued_bytes_ += bytes.size();
  if (int64_t(queued_bytes_) > state_->options.max_queued_bytes) {
    state_->log({{"event", "slow_client_closed"}, {"req_id", request_id_}, {"remote", remote_},
                 {"queued_bytes", queued_bytes_}});
    return close();
  }
  queue_.push_back({std::make_shared<const std::string>(std::move(bytes)), emitted_at});
  if (!writing_) do_write();
}

void http_session::do_write() {
  if (closed_ || queue_.empty()) return;
  writing_ = true;
  arm_timer(state_->options.write_timeout_s);
  std::vector<asio::const_buffer> buffers;
  size_t n = std::min<size_t>(queue_.size(), 64);
  buffers.reserve(n);
  for (size_t i = 0; i < n; ++i) buffers.push_back(asio::buffer(*queue_[i].bytes));
  asio::async_write(socket_, buffers,
                    [self = shared_from_this(), n](beast::error_code ec, size_t bytes) {
                      self->on_write(ec, bytes, n);
                    });
}

void http_session::on_write(beast::error_code ec, size_t, size_t num_buffers) {
  writing_ = false;
  disarm_timer();
  if (closed_) return;
  if (ec) return fail(ec, "write");
  auto now = clock::now();
  for (size_t i = 0; i < num_buffers; ++i) {
    if (queue_.front().emitted_at != clock::time_point{})
      state_->metrics.server_added.observe(std::chrono::duration<double>(now - queue_.front().emitted_at).count());
    queued_bytes_ -= queue_.front().bytes->size();
    queue_.pop_front();
  }
  if (!queue_.empty()) return do_write();
  if (close_after_write_) return watching_ ? close() : linger_close();
  bool generating = gen_ && !gen_->finished();
  if (generating) return;
  if (watching_) { read_after_watch_ = true; socket_.cancel(ec); return; }
  gen_.reset();
  do_read();
}

void http_session::watch_disconnect() {
  watching_ = true;
  read_after_watch_ = false;
  socket_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
    self->watching_ = false;
    if (self->closed_) return;
    if (!ec) {
      self->buffer_.commit(n);  // a pipelined request: kept for the next read
      if (self->read_after_watch_ || !self->gen_ || self->gen_->finished()) {
        if (!self->writing_ && self->queue_.empty()) { self->gen_.reset(); self->do_read(); }
        return;
      }
      // Still generating: keep watching for the client leaving (the pending read also keeps
      // this session alive), up to a bound on what is buffered; past it, hold the session
      // until the generation ends, and TCP holds the client back.
      constexpr size_t max_pipelined = size_t(1) << 20;
      if (self->buffer_.size() < max_pipelined) self->watch_disconnect();
      else self->hold_ = self;
      return;
    }
    if (ec == asio::error::operation_aborted && self->read_after_watch_) {
      self->gen_.reset();
      return self->do_read();
    }
    // The client went away: stop its generation now so its KV is freed at the next step.
    if (self->gen_ && !self->gen_->finished()) {
      self->state_->log({{"event", "client_disconnected"}, {"req_id", self->request_id_},
                         {"remote", self->remote_}});
    }
    self->close();
  });
}

void http_session::arm_timer(int seconds) {
  uint64_t gen = ++timer_gen_;
  timer_.expires_after(std::chrono::seconds(seconds));
  timer_.async_wait([self = shared_from_this(), gen](beast::error_code ec) {
    if (ec || gen != self->timer_gen_ || self->closed_) return;
    self->close();
  });
}

void http_session::disarm_timer() {
  ++timer_gen_;
  timer_.cancel();
}

void http_session::linger_close() {
  // Half-close, then discard what the client still sends (e.g. the rest of a refused body), so
  // that it reads our answer instead of a reset.
  beast::error_code ec;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ec);
  arm_timer(2);
  auto discard = std::make_shared<std::array<char, 65536>>();
  auto step = std::make_shared<std::function<void(beast::error_code, size_t)>>();
  *step = [self = shared_from_this(), discard, step](beast::error_code ec, size_t) {
    if (ec || self->closed_) { self->close(); *step = nullptr; return; }
    self->socket_.async_read_some(asio::buffer(*discard), *step);
  };
  socket_.async_read_some(asio::buffer(*discard), *step);
}

void http_session::close() {
  if (closed_) return;
  closed_ = true;
  if (gen_) { gen_->detach(); gen_.reset(); }
  if (hold_) asio::post(socket_.get_executor(), [held = std::move(hold_)] {});  // released after the caller returns
  beast::error_code ec;
  timer_.cancel();
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  socket_.close(ec);
}

void http_session::fail(beast::error_code ec, const char* what) {
  if (ec != asio::error::operation_aborted && ec != asio::error::broken_pipe &&
      ec != asio::error::connection_reset)
    state_->log({{"event", "io_error"}, {"what", what}, {"error", ec.message()}, {"remote", remote_}});
  close();
}

void http_session::log_request(int status, const std::string& detail) {
  if (!state_->options.log_requests) return;
  const auto dur = log_value::millis(
      std::chrono::duration<double, std::milli>(clock::now() - request_start_).count());
  if (gen_ && status == 200) {
    auto& r = gen_->result();
    const auto ttft = log_value::millis(gen_->ttft_seconds() * 1e3);
    state_->log({{"req_id", request_id_}, {"method", method_}, {"path", path_},
                 {"status", status}, {"stream", streaming_},
                 {"prompt_tokens", r.num_prompt_tokens},
                 {"cached_tokens", r.num_cached_tokens},
                 {"completion_tokens", r.num_completion_tokens},
                 {"finish", detail}, {"ttft_ms", ttft}, {"duration_ms", dur}, {"remote", remote_}});
    return;
  }
  state_->log({{"req_id", request_id_}, {"method", method_}, {"path", path_},
               {"status", status}, {"error", detail}, {"duration_ms", dur},
               {"remote", remote_}});
}

}  // namespace cedar::net
