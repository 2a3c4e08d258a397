// Percentiles and the bound reading; both sort copies, never the caller's data.
#include "tools/bench/stats.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace cedar::bench {

std::optional<double> percentile(std::vector<double> values, double q) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  double rank = std::clamp(q, 0.0, 100.0) / 100.0 * double(values.size() - 1);
  size_t lo = size_t(std::floor(rank));
  size_t hi = std::min(lo + 1, values.size() - 1);
  double frac = rank - double(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

percentiles summarize(const std::vector<double>& values) {
  percentiles p;
  p.p50 = percentile(values, 50);
  p.p90 = percentile(values, 90);
  p.p99 = percentile(values, 99);
  if (!values.empty())
    p.mean = std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
  return p;
}

std::optional<double> throughput_at_bound(std::vector<curve_point> points, double bound) {
  std::sort(points.begin(), points.end(), [](const curve_point& a, const curve_point& b) {
    return a.interactivity < b.interactivity;
  });
  std::optional<double> best;
  auto consider = [&](double v) { best = best ? std::max(*best, v) : v; };
  for (size_t i = 0; i < points.size(); ++i) {
    if (points[i].interactivity >= bound) consider(points[i].throughput);
    if (i + 1 == points.size()) break;
    const auto& a = points[i];
    const auto& b = points[i + 1];
    if (a.interactivity < bound && b.interactivity > bound) {
      double t = (bound - a.interactivity) / (b.interactivity - a.interactivity);
      consider(a.throughput + t * (b.throughput - a.throughput));
    }
  }
  return best;
}

}  // namespace cedar::bench
