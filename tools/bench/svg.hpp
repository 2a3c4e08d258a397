// A hand-written SVG line chart: throughput against interactivity, one polyline per curve (points
// in sweep order, each labelled with its concurrency), axes from zero with 1-2-5 ticks, axis labels, a legend, and an optional vertical marker (the A/B bound).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tools/bench/report.hpp"

namespace cedar::bench {

struct plot_options {
  std::string title;
  std::string x_label = "interactivity (output tok/s per user, 1 / p90 ITL)";
  std::string y_label = "throughput (output tok/s)";
  std::optional<double> x_marker;   ///< drawn as a dashed vertical line
};

std::string render_svg(const std::vector<named_curve>& curves, const plot_options& options);

/// The step of about `num_ticks` "nice" ticks (1, 2 or 5 times a power of ten) over [0, max].
double nice_tick_step(double max, int num_ticks);

}  // namespace cedar::bench
