// Streaming clients for `cedar bench` on Boost.Beast: an HTTP/1.1 keep-alive connection that
// POSTs a request and reads its SSE stream (Chat Completions or Responses), a Responses WebSocket
// connection (one per replayed agent), and a plain GET for /metrics. Coroutines on the bench's
// single-threaded io_context; a client serves one request at a time.
#pragma once

#include <utility>  // Boost 1.74's asio/awaitable.hpp uses std::exchange without including it

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tools/bench/protocol.hpp"

namespace cedar::bench {

/// Where the server is: from "http://host:port[/prefix]"; the API lives at api_path
/// ("/prefix/v1" unless the prefix already ends in /v1).
struct endpoint {
  std::string host, port;
  std::string api_path = "/v1";
  std::string api_key;  ///< sent as "Authorization: Bearer <key>" when not empty
};
bool parse_url(const std::string& url, endpoint& out, std::string& error);

using clock_type = std::chrono::steady_clock;

/// What one streamed request gave. `error_kind` is empty on success, else one of: connect,
/// http_4xx, http_5xx, timeout, stream (broken or malformed stream), server (an error event),
/// cancelled (closed by the bench itself).
struct request_outcome {
  std::string error_kind, error_detail;
  clock_type::time_point sent_at, first_token_at, done_at;
  bool has_first_token = false;
  int64_t num_token_chunks = 0;
  std::optional<int64_t> num_prompt_tokens, num_output_tokens, num_cached_tokens;  ///< usage
  std::string text;          ///< visible reply
  std::string response_id;   ///< Responses
};

/// Called as generated chunks arrive (for live throughput).
using chunk_sink = std::function<void()>;

/// A connection for one agent; `close()` may be called at any time to abort what is in flight.
class stream_client {
 public:
  virtual ~stream_client() = default;
  /// Sends `body` (JSON) and reads the stream until it ends, an error, or `timeout`.
  virtual boost::asio::awaitable<request_outcome> send(std::string body,
                                                       std::chrono::milliseconds timeout,
                                                       const chunk_sink& on_chunk) = 0;
  virtual void close() = 0;
};

/// POST {api_path}/chat/completions or /responses with SSE streaming (api chat or responses),
/// or a WebSocket to {api_path}/responses (api ws).
std::unique_ptr<stream_client> make_stream_client(boost::asio::any_io_executor ex,
                                                  const endpoint& ep, api_kind api);

/// GET http://host:port{target}; the body on 200, nullopt otherwise.
boost::asio::awaitable<std::optional<std::string>> http_get(boost::asio::any_io_executor ex,
                                                            endpoint ep, std::string target,
                                                            std::chrono::milliseconds timeout);

}  // namespace cedar::bench
