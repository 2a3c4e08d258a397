// SVG text by hand: grid, ticks, axis labels, curves, legend.
#include "tools/bench/svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace cedar::bench {
namespace {

constexpr double kWidth = 720, kHeight = 460;
constexpr double kLeft = 80, kRight = 190, kTop = 40, kBottom = 60;  // margins, px
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                   "#9467bd", "#8c564b", "#e377c2", "#17becf"};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string tick_label(double v, double step) {
  return step >= 1 ? fmt("%.0f", v) : step >= 0.1 ? fmt("%.1f", v) : fmt("%.2g", v);
}

}  // namespace

double nice_tick_step(double max, int num_ticks) {
  if (!(max > 0)) return 1;
  double raw = max / num_ticks;
  double mag = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

std::string render_svg(const std::vector<named_curve>& curves, const plot_options& options) {
  double max_x = options.x_marker.value_or(0), max_y = 0;
  for (auto& c : curves)
    for (auto& p : c.points) {
      max_x = std::max(max_x, p.interactivity);
      max_y = std::max(max_y, p.throughput);
    }
  double x_step = nice_tick_step(max_x * 1.05, 6), y_step = nice_tick_step(max_y * 1.05, 6);
  double x_max = std::max(x_step, std::ceil(max_x * 1.05 / x_step) * x_step);
  double y_max = std::max(y_step, std::ceil(max_y * 1.05 / y_step) * y_step);
  double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto px = [&](double x) { return kLeft + x / x_max * plot_w; };
  auto py = [&](double y) { return kTop + plot_h - y / y_max * plot_h; };

  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt("%.0f", kWidth) +
                  "\" height=\"" + fmt("%.0f", kHeight) +
                  "\" font-family=\"sans-serif\" font-size=\"12\">\n"
                  "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + fmt("%.0f", kLeft) + "\" y=\"24\" font-size=\"15\">" +
       escape_xml(options.title) + "</text>\n";
  for (double x = 0; x <= x_max + x_step / 2; x += x_step) {
    s += "<line x1=\"" + fmt("%.1f", px(x)) + "\" y1=\"" + fmt("%.1f", py(0)) + "\" x2=\"" +
         fmt("%.1f", px(x)) + "\" y2=\"" + fmt("%.1f", py(y_max)) + "\" stroke=\"#e5e5e5\"/>\n";
    s += "<text x=\"" + fmt("%.1f", px(x)) + "\" y=\"" + fmt("%.1f", py(0) + 18) +
         "\" text-anchor=\"middle\">" + tick_label(x, x_step) + "</text>\n";
  }
  for (double y = 0; y <= y_max + y_step / 2; y += y_step) {
    s += "<line x1=\"" + fmt("%.1f", px(0)) + "\" y1=\"" + fmt("%.1f", py(y)) + "\" x2=\"" +
         fmt("%.1f", px(x_max)) + "\" y2=\"" + fmt("%.1f", py(y)) + "\" stroke=\"#e5e5e5\"/>\n";
    s += "<text x=\"" + fmt("%.1f", px(0) - 8) + "\" y=\"" + fmt("%.1f", py(y) + 4) +
         "\" text-anchor=\"end\">" + tick_label(y, y_step) + "</text>\n";
  }
  s += "<line x1=\"" + fmt("%.1f", px(0)) + "\" y1=\"" + fmt("%.1f", py(0)) + "\" x2=\"" +
       fmt("%.1f", px(x_max)) + "\" y2=\"" + fmt("%.1f", py(0)) + "\" stroke=\"black\"/>\n";
  s += "<line x1=\"" + fmt("%.1f", px(0)) + "\" y1=\"" + fmt("%.1f", py(0)) + "\" x2=\"" +
       fmt("%.1f", px(0)) + "\" y2=\"" + fmt("%.1f", py(y_max)) + "\" stroke=\"black\"/>\n";
  s += "<text x=\"" + fmt("%.1f", kLeft + plot_w / 2) + "\" y=\"" + fmt("%.0f", kHeight - 18) +
       "\" text-anchor=\"middle\">" + escape_xml(options.x_label) + "</text>\n";
  s += "<text transform=\"translate(20," + fmt("%.1f", kTop + plot_h / 2) +
       ") rotate(-90)\" text-anchor=\"middle\">" + escape_xml(options.y_label) + "</text>\n";
  if (options.x_marker) {
    double x = px(*options.x_marker);
    s += "<line x1=\"" + fmt("%.1f", x) + "\" y1=\"" + fmt("%.1f", py(0)) + "\" x2=\"" +
         fmt("%.1f", x) + "\" y2=\"" + fmt("%.1f", py(y_max)) +
         "\" stroke=\"#555\" stroke-dasharray=\"5,4\"/>\n";
    s += "<text x=\"" + fmt("%.1f", x + 4) + "\" y=\"" + fmt("%.1f", py(y_max) + 12) +
         "\" fill=\"#555\">bound " + fmt("%.4g", *options.x_marker) + "</text>\n";
  }
  for (size_t i = 0; i < curves.size(); ++i) {
    const char* color = kColors[i % (sizeof kColors / sizeof kColors[0])];
    const auto& pts = curves[i].points;  // in sweep order, so the line follows concurrency
    std::string path;
    for (auto& p : pts) path += fmt("%.1f,", px(p.interactivity)) + fmt("%.1f ", py(p.throughput));
    s += "<polyline fill=\"none\" stroke=\"" + std::string(color) +
         "\" stroke-width=\"2\" points=\"" + path + "\"/>\n";
    for (auto& p : pts) {
      s += "<circle cx=\"" + fmt("%.1f", px(p.interactivity)) + "\" cy=\"" +
           fmt("%.1f", py(p.throughput)) + "\" r=\"3.5\" fill=\"" + color + "\"/>\n";
      if (p.concurrency > 0)
        s += "<text x=\"" + fmt("%.1f", px(p.interactivity) + 5) + "\" y=\"" +
             fmt("%.1f", py(p.throughput) - 5) + "\" font-size=\"10\" fill=\"" + color + "\">c=" +
             std::to_string(p.concurrency) + "</text>\n";
    }
    double ly = kTop + 10 + 20 * double(i);
    s += "<line x1=\"" + fmt("%.0f", kWidth - kRight + 15) + "\" y1=\"" + fmt("%.0f", ly) +
         "\" x2=\"" + fmt("%.0f", kWidth - kRight + 40) + "\" y2=\"" + fmt("%.0f", ly) +
         "\" stroke=\"" + color + "\" stroke-width=\"2\"/>\n";
    s += "<text x=\"" + fmt("%.0f", kWidth - kRight + 46) + "\" y=\"" + fmt("%.0f", ly + 4) +
         "\">" + escape_xml(curves[i].name) + "</text>\n";
  }
  s += "</svg>\n";
  return s;
}

}  // namespace cedar::bench
