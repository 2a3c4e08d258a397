// Beast transports for `cedar bench`. Each client owns one connection and reconnects when the
// server has closed it; `close()` aborts whatever is in flight (the bench's end of window).
#include "tools/bench/client.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>

#include <limits>

namespace cedar::bench {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using asio::awaitable;

auto with_ec(beast::error_code& ec) { return asio::redirect_error(asio::use_awaitable, ec); }

awaitable<beast::error_code> connect(beast::tcp_stream& stream, const endpoint& ep) {
  tcp::resolver resolver(co_await asio::this_coro::executor);
  beast::error_code ec;
  auto results = co_await resolver.async_resolve(ep.host, ep.port, with_ec(ec));
  if (!ec) co_await stream.async_connect(results, with_ec(ec));
  co_return ec;
}

/// Folds one stream event into the outcome; returns true when the event ends the request.
bool apply_event(const stream_event& ev, request_outcome& out, const chunk_sink& on_chunk) {
  if (ev.has_tokens) {
    if (!out.has_first_token) {
      out.has_first_token = true;
      out.first_token_at = clock_type::now();
    }
    ++out.num_token_chunks;
    if (on_chunk) on_chunk();
  }
  out.text += ev.text;
  if (!ev.response_id.empty()) out.response_id = ev.response_id;
  if (ev.num_prompt_tokens) out.num_prompt_tokens = ev.num_prompt_tokens;
  if (ev.num_output_tokens) out.num_output_tokens = ev.num_output_tokens;
  if (ev.num_cached_tokens) out.num_cached_tokens = ev.num_cached_tokens;
  if (!ev.error.empty()) {
    out.error_kind = "server";
    out.error_detail = ev.error;
  }
  return ev.done || !ev.error.empty();
}

void fail(request_outcome& out, const char* kind, const std::string& detail) {
  out.error_kind = kind;
  out.error_detail = detail;
  out.done_at = clock_type::now();
}

const char* io_error_kind(const beast::error_code& ec, bool closed_by_us) {
  if (closed_by_us) return "cancelled";
  return ec == beast::error::timeout ? "timeout" : "stream";
}

/// Chat Completions or Responses over HTTP/1.1 with SSE.
class sse_client final : public stream_client {
 public:
  sse_client(asio::any_io_executor ex, endpoint ep, api_kind api)
      : stream_(ex), ep_(std::move(ep)), api_(api) {}

  awaitable<request_outcome> send(std::string body, std::chrono::milliseconds timeout,
                                  const chunk_sink& on_chunk) override {
    request_outcome out;
    out.sent_at = clock_type::now();
    closed_ = false;
    stream_.expires_after(timeout);
    beast::error_code ec;
    std::optional<http::response_parser<http::string_body>> parser;
    // A kept-alive connection the server has since closed fails at once: retry on a fresh one.
    for (int attempt = 0; attempt < 2; ++attempt) {
      bool reused = stream_.socket().is_open();
      if (!reused) {
        ec = co_await connect(stream_, ep_);
        if (ec) {
          fail(out, closed_ ? "cancelled" : ec == beast::error::timeout ? "timeout" : "connect",
               ec.message());
          co_return out;
        }
      }
      parser.emplace();
      ec = co_await write_and_read_header(body, *parser);
      if (!ec || !reused || closed_) break;
      reset_connection();
    }
    if (ec) {
      reset_connection();
      fail(out, io_error_kind(ec, closed_), ec.message());
      co_return out;
    }
    co_await read_stream(*parser, out, on_chunk);
    co_return out;
  }

  void close() override {
    closed_ = true;
    reset_connection();
  }

 private:
  std::string target() const {
    return ep_.api_path + (api_ == api_kind::chat ? "/chat/completions" : "/responses");
  }

  void reset_connection() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
    buffer_.clear();
  }

  awaitable<beast::error_code> write_and_read_header(
      const std::string& body, http::response_parser<http::string_body>& parser) {
    http::request<http::string_body> req{http::verb::post, target(), 11};
    req.set(http::field::host, ep_.host + ":" + ep_.port);
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "text/event-stream");
    if (!ep_.api_key.empty()) req.set(http::field::authorization, "Bearer " + ep_.api_key);
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    beast::error_code ec;
    co_await http::async_write(stream_, req, with_ec(ec));
    if (ec) co_return ec;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    co_await http::async_read_header(stream_, buffer_, parser, with_ec(ec));
    co_return ec;
  }

  awaitable<void> read_stream(http::response_parser<http::string_body>& parser,
                              request_outcome& out, const chunk_sink& on_chunk) {
    beast::error_code ec;
    int status = parser.get().result_int();
    if (status != 200) {
      co_await http::async_read(stream_, buffer_, parser, with_ec(ec));
      fail(out, status >= 500 ? "http_5xx" : "http_4xx",
           "HTTP " + std::to_string(status) + ": " + parser.get().body().substr(0, 300));
      if (ec || !parser.keep_alive()) reset_connection();
      co_return;
    }
    sse_parser sse;
    size_t num_consumed = 0, num_events = 0;
    bool finished = false;
    while (true) {
      const std::string& body = parser.get().body();
      if (body.size() > num_consumed) {
        for (auto& data : sse.feed(std::string_view(body).substr(num_consumed))) {
          ++num_events;
          if (finished) continue;
          stream_event ev;
          bool parsed = api_ == api_kind::chat ? parse_chat_event(data, ev)
                                               : parse_responses_event(data, ev);
          if (!parsed) {
            fail(out, "stream", "malformed event: " + data.substr(0, 200));
            finished = true;
          } else if (apply_event(ev, out, on_chunk)) {
            finished = true;
            out.done_at = clock_type::now();
          }
        }
        num_consumed = body.size();
      }
      if (parser.is_done()) break;
      co_await http::async_read_some(stream_, buffer_, parser, with_ec(ec));
      if (ec) break;
    }
    if (ec) {
      reset_connection();
      if (!finished) fail(out, io_error_kind(ec, closed_), ec.message());
      co_return;
    }
    // A chat stream may end without [DONE]; a Responses stream must end with a final event.
    if (!finished) {
      out.done_at = clock_type::now();
      if (num_events == 0)
        fail(out, "stream", "no SSE events (does the server stream?): " +
                                parser.get().body().substr(0, 200));
      else if (api_ != api_kind::chat)
        fail(out, "stream", "stream ended before response.completed");
    }
    if (!parser.keep_alive()) reset_connection();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  endpoint ep_;
  api_kind api_;
  bool closed_ = false;
};

/// Responses over one WebSocket: response.create in, the same events as over SSE out.
class ws_client final : public stream_client {
 public:
  ws_client(asio::any_io_executor ex, endpoint ep) : ex_(ex), ep_(std::move(ep)) {}

  awaitable<request_outcome> send(std::string body, std::chrono::milliseconds timeout,
                                  const chunk_sink& on_chunk) override {
    request_outcome out;
    out.sent_at = clock_type::now();
    closed_ = false;
    beast::error_code ec;
    if (!ws_) {
      ws_ = std::make_unique<websocket::stream<beast::tcp_stream>>(ex_);
      if (!ep_.api_key.empty())
        ws_->set_option(websocket::stream_base::decorator(
            [key = ep_.api_key](websocket::request_type& req) {
              req.set(http::field::authorization, "Bearer " + key);
            }));
      beast::get_lowest_layer(*ws_).expires_after(timeout);
      ec = co_await connect(beast::get_lowest_layer(*ws_), ep_);
      if (!ec)
        co_await ws_->async_handshake(ep_.host + ":" + ep_.port, ep_.api_path + "/responses",
                                      with_ec(ec));
      if (ec) {
        ws_.reset();
        fail(out, closed_ ? "cancelled" : ec == beast::error::timeout ? "timeout" : "connect",
             ec.message());
        co_return out;
      }
      ws_->text(true);
    }
    beast::get_lowest_layer(*ws_).expires_after(timeout);
    co_await ws_->async_write(asio::buffer(body), with_ec(ec));
    beast::flat_buffer frame;
    while (!ec) {
      frame.clear();
      co_await ws_->async_read(frame, with_ec(ec));
      if (ec) break;
      stream_event ev;
      if (!parse_responses_event(beast::buffers_to_string(frame.data()), ev)) {
        fail(out, "stream", "malformed event");
        ws_.reset();
        co_return out;
      }
      if (apply_event(ev, out, on_chunk)) {
        out.done_at = clock_type::now();
        co_return out;
      }
    }
    ws_.reset();
    fail(out, io_error_kind(ec, closed_), ec.message());
    co_return out;
  }

  void close() override {
    closed_ = true;
    if (!ws_) return;
    beast::error_code ignored;
    beast::get_lowest_layer(*ws_).socket().close(ignored);
  }

 private:
  asio::any_io_executor ex_;
  endpoint ep_;
  std::unique_ptr<websocket::stream<beast::tcp_stream>> ws_;
  bool closed_ = false;
};

}  // namespace

bool parse_url(const std::string& url, endpoint& out, std::string& error) {
  std::string rest = url;
  for (const char* scheme : {"http://", "ws://"})
    if (rest.rfind(scheme, 0) == 0) rest = rest.substr(std::string(scheme).size());
  if (rest.find("://") != std::string::npos) {
    error = "only http:// and ws:// URLs are supported: " + url;
    return false;
  }
  size_t slash = rest.find('/');
  std::string host_port = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  while (!path.empty() && path.back() == '/') path.pop_back();
  size_t colon = host_port.rfind(':');
  out.host = host_port.substr(0, colon);
  out.port = colon == std::string::npos ? "80" : host_port.substr(colon + 1);
  if (out.host.empty() || out.port.empty()) {
    error = "no host in URL: " + url;
    return false;
  }
  out.api_path = path.ends_with("/v1") ? path : path + "/v1";
  return true;
}

std::unique_ptr<stream_client> make_stream_client(asio::any_io_executor ex, const endpoint& ep,
                                                  api_kind api) {
  if (api == api_kind::ws) return std::make_unique<ws_client>(ex, ep);
  return std::make_unique<sse_client>(ex, ep, api);
}

awaitable<std::optional<std::string>> http_get(asio::any_io_executor ex, endpoint ep,
                                               std::string target,
                                               std::chrono::milliseconds timeout) {
  beast::tcp_stream stream(ex);
  stream.expires_after(timeout);
  beast::error_code ec = co_await connect(stream, ep);
  if (ec) co_return std::nullopt;
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, ep.host + ":" + ep.port);
  if (!ep.api_key.empty()) req.set(http::field::authorization, "Bearer " + ep.api_key);
  co_await http::async_write(stream, req, with_ec(ec));
  if (ec) co_return std::nullopt;
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  co_await http::async_read(stream, buffer, res, with_ec(ec));
  beast::error_code ignored;
  stream.socket().close(ignored);
  if (ec || res.result_int() != 200) co_return std::nullopt;
  co_return std::move(res.body());
}

}  // namespace cedar::bench
