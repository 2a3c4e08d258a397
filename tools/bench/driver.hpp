// `cedar bench`'s load driver: N session lanes replay traces against a server (a finished session
// recycles to the next trace), think time honoured, warm-up then a measured window; one call runs
// one concurrency point on its own single-threaded io_context.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tools/bench/client.hpp"
#include "tools/bench/stats.hpp"
#include "tools/bench/trace.hpp"

namespace cedar::bench {

struct bench_config {
  endpoint server;
  std::string model = "default";
  api_kind api = api_kind::chat;
  std::string label;                       ///< names the configuration in reports
  const std::vector<session_trace>* traces = nullptr;  ///< non-empty sessions only
  double think_scale = 1.0;                ///< recorded think time is multiplied by this
  double max_think_s = 10.0;               ///< and capped at this
  double warmup_s = 5, duration_s = 30;
  std::chrono::milliseconds request_timeout{600'000};
  std::string metrics_target = "/metrics";
  uint64_t seed = 1;
  bool random_start = true;                ///< each lane's first session starts at a random turn
  bool progress = true;                    ///< one line per second on stderr
};

/// One concurrency point. Latency samples are the requests sent and finished inside the
/// measured window; throughput counts tokens that arrived inside it.
struct point_result {
  int concurrency = 0;
  double measured_s = 0;
  int64_t num_requests = 0;                ///< completed in the window
  int64_t num_short_outputs = 0;           ///< of those, ended before max_tokens
  int64_t num_input_tokens = 0, num_output_tokens = 0;
  percentiles ttft_ms, itl_ms, e2e_ms;
  double output_tokens_per_s = 0, total_tokens_per_s = 0;
  std::optional<double> interactivity;     ///< tok/s per user: 1000 / p90 ITL (ms)
  std::optional<double> prefix_hit_rate;   ///< from the server's /metrics, if it exports one
  std::optional<double> usage_cached_fraction;  ///< cached / prompt tokens from usage, if reported
  std::map<std::string, int64_t> errors;   ///< by kind, inside the window
  std::string first_error;
};

point_result run_point(const bench_config& config, int concurrency);

}  // namespace cedar::bench
