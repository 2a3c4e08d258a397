// Benchmark statistics: percentiles over per-request samples, and reading a throughput/interactivity
// curve at an interactivity bound (the A/B figure). Pure functions.
#pragma once

#include <optional>
#include <vector>

namespace cedar::bench {

/// The q-th percentile (0..100) of `values`, linearly interpolated between sorted samples
/// (rank q/100 * (n-1)); nullopt when empty.
std::optional<double> percentile(std::vector<double> values, double q);

struct percentiles {
  std::optional<double> p50, p90, p99, mean;
};
percentiles summarize(const std::vector<double>& values);

/// One point of a sweep: interactivity (tok/s per user) and throughput (tok/s).
struct curve_point {
  double interactivity = 0;
  double throughput = 0;
  int concurrency = 0;  ///< the sweep point it came from (0: unknown); labels only
};

/// The best throughput reachable at interactivity >= `bound` along the piecewise-linear curve
/// through `points` taken in order of interactivity: the largest of the points at or above the
/// bound and of the segments' values where they cross it. nullopt when no part of the curve
/// reaches the bound.
std::optional<double> throughput_at_bound(std::vector<curve_point> points, double bound);

}  // namespace cedar::bench
