// `cedar bench` outputs: results.json (one entry per concurrency point per configuration),
// results.md (a table), and the curves read back from a results.json for plots and A/B compares.
#pragma once

#include <string>
#include <vector>

#include "tools/bench/driver.hpp"
#include "tools/bench/stats.hpp"

namespace cedar::bench {

struct run_meta {
  std::string url, model, traces;
  double scale = 1, warmup_s = 0, duration_s = 0, think_scale = 1, max_think_s = 0;
  int num_sessions = 0;
  double trace_prefix_reuse = 0;   ///< token-weighted, an unlimited private cache (theoretical)
};

/// One configuration (an API, a server build, ...) swept over concurrency.
struct config_result {
  std::string label, api;
  std::vector<point_result> points;
};

struct bench_report {
  run_meta meta;
  std::vector<config_result> configs;
};

std::string report_json(const bench_report& report);
std::string report_markdown(const bench_report& report);

/// A throughput-vs-interactivity curve, named after its configuration.
struct named_curve {
  std::string name;
  std::vector<curve_point> points;
};

/// Output tok/s against interactivity for every configuration (points without interactivity
/// are left out).
std::vector<named_curve> report_curves(const bench_report& report);

/// The same curves, read back from a results.json written by report_json.
bool read_report_curves(const std::string& path, std::vector<named_curve>& out,
                        std::string& error);

}  // namespace cedar::bench
