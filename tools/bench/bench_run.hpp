// `cedar bench` and `cedar bench compare` as functions of parsed options: load or synthesize the
// traces, sweep the configurations over concurrency, write results.{json,md} and curve.svg; or read
// two results.json and compare their throughput at an interactivity bound.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tools/bench/protocol.hpp"

namespace cedar::bench {

struct bench_options {
  std::string url;
  std::string api_key;                ///< "Authorization: Bearer" for servers that want one
  std::string model;                  ///< empty: the first id of GET /v1/models, else "default"
  std::string traces = "synthetic";   ///< "synthetic", a trace file or a directory of them
  int num_synthetic_sessions = 64;
  double scale = 1.0;                 ///< token counts x scale (hash blocks cut to match)
  std::vector<int> concurrency = {1, 2, 4, 8};
  double warmup_s = 5, duration_s = 30;
  std::vector<api_kind> apis = {api_kind::chat};
  std::string label;                  ///< default: the API name
  std::string out_dir;
  double think_scale = 1.0, max_think_s = 10;
  int64_t max_context_tokens = 0;     ///< 0: no cap
  double request_timeout_s = 600;
  uint64_t seed = 1;
  bool random_start = true;
  std::string metrics_path = "/metrics";
};

/// Runs the sweep; returns the process exit code: 0 when every point ran and completed requests
/// (some may have failed), 1 when the server does not answer or a point completed none.
int run_bench(const bench_options& options);

struct compare_options {
  std::string out_dir, a_dir, b_dir;
  std::optional<double> bound;        ///< interactivity, tok/s per user; default: mid-overlap
};

/// Writes DIR/compare.{json,md} and DIR/curve.svg; prints the ratio B/A at the bound.
int run_compare(const compare_options& options);

}  // namespace cedar::bench
