// Server-side metrics: request counters, token counters, and latency histograms (TTFT, inter-token
// latency, per-token time spent in the server). Updated from connection strands with atomics;
// rendered with the engine's live figures as Prometheus text for GET /metrics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "net/bridge.hpp"

namespace cedar::net {

/// A fixed-bucket histogram of seconds (exponential buckets from 10 us to ~80 s), lock-free.
class latency_histogram {
 public:
  static constexpr int num_buckets = 24;
  /// Upper bound of bucket i in seconds: 1e-5 * 2^i.
  static double bound(int i);
  void observe(double seconds);
  /// Approximate quantile q in (0,1) by linear interpolation inside its bucket.
  double quantile(double q) const;
  void render(std::string& out, const std::string& name, const std::string& help) const;
  int64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::array<std::atomic<int64_t>, num_buckets + 1> buckets_{};  // last one is +Inf
  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> sum_ns_{0};
};

/// Everything the server itself counts.
struct server_metrics {
  std::atomic<int64_t> num_requests_total{0};
  std::atomic<int64_t> num_requests_failed{0};   ///< answered with an error object
  std::atomic<int64_t> num_requests_cancelled{0};
  std::atomic<int64_t> num_prompt_tokens{0};
  std::atomic<int64_t> num_cached_prompt_tokens{0};
  std::atomic<int64_t> num_generated_tokens{0};
  std::atomic<int64_t> num_open_connections{0};
  std::atomic<int64_t> num_connections_refused{0};  ///< closed at accept: --max-connections reached
  std::atomic<int64_t> num_open_websockets{0};
  std::atomic<int64_t> num_ws_merged_events{0};  ///< delta events merged into a queued one
  std::atomic<int64_t> num_active_generations{0};
  latency_histogram ttft;               ///< request parsed -> first token written
  latency_histogram inter_token;        ///< between consecutive token writes of one stream
  latency_histogram server_added;       ///< engine emitted a token -> its bytes handed to the socket
  latency_histogram request_duration;

  /// Prometheus text exposition, names prefixed cedar_.
  std::string render(const engine_metrics& engine, bool ready, bool draining) const;
};

}  // namespace cedar::net
