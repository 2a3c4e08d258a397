// The sweep (configurations x concurrency points) and the A/B compare, with their output files.
#include <utility>

#include "tools/bench/bench_run.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tools/bench/client.hpp"
#include "tools/bench/driver.hpp"
#include "tools/bench/report.hpp"
#include "tools/bench/svg.hpp"
#include "tools/bench/synth.hpp"
#include "tools/bench/trace.hpp"

namespace cedar::bench {
namespace {

bool write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) std::fprintf(stderr, "cedar bench: cannot write %s\n", path.c_str());
  return bool(f);
}

bool load_traces(const bench_options& o, std::vector<session_trace>& traces) {
  std::string error;
  if (o.traces == "synthetic") {
    traces = synthesize(o.num_synthetic_sessions, o.seed);
  } else if (!read_traces(o.traces, traces, error)) {
    std::fprintf(stderr, "cedar bench: %s\n", error.c_str());
    return false;
  }
  for (auto& t : traces) {
    scale_trace(t, o.scale);
    cap_context(t, o.max_context_tokens);
  }
  std::erase_if(traces, [](const session_trace& t) { return t.requests.empty(); });
  if (traces.empty()) std::fprintf(stderr, "cedar bench: no session fits --max-context\n");
  return !traces.empty();
}

void describe_traces(const std::vector<session_trace>& traces, run_meta& meta) {
  std::vector<double> turns, inputs;
  double num_reused = 0, num_blocks = 0;
  int num_with_subagents = 0;
  for (auto& t : traces) {
    turns.push_back(double(t.requests.size()));
    for (auto& r : t.requests) inputs.push_back(double(r.num_input_tokens));
    double blocks = 0;
    for (auto& r : t.requests) blocks += double(r.hash_ids.size());
    for (auto& s : t.subagents)
      for (auto& r : s.requests) blocks += double(r.hash_ids.size());
    num_reused += theoretical_prefix_reuse(t) * blocks;
    num_blocks += blocks;
    num_with_subagents += !t.subagents.empty();
  }
  meta.num_sessions = int(traces.size());
  meta.trace_prefix_reuse = num_blocks > 0 ? num_reused / num_blocks : 0;
  std::fprintf(stderr,
               "cedar bench: %d sessions, turns median %.0f, input tokens median %.0f, "
               "%.0f%% with subagents, theoretical prefix reuse %.1f%% (of whole %d-token blocks; a server "
               "caching larger pages reaches less on short prompts)\n",
               meta.num_sessions, percentile(turns, 50).value_or(0),
               percentile(inputs, 50).value_or(0),
               100.0 * num_with_subagents / double(traces.size()),
               100 * meta.trace_prefix_reuse, traces.front().block_size);
}

/// The server's first model (GET /v1/models), for runs without --model; "default" if it lists
/// none; nullopt if the server does not answer.
std::optional<std::string> discover_model(const endpoint& server) {
  boost::asio::io_context io;
  std::optional<std::string> body;
  boost::asio::co_spawn(
      io,
      [&]() -> boost::asio::awaitable<void> {
        body = co_await http_get(io.get_executor(), server, server.api_path + "/models",
                                 std::chrono::seconds(10));
      },
      boost::asio::detached);
  io.run();
  if (!body) return std::nullopt;
  std::string id = first_model_id(*body);
  return id.empty() ? "default" : id;
}

}  // namespace

int run_bench(const bench_options& o) {
  bench_config cfg;
  std::string error;
  if (!parse_url(o.url, cfg.server, error)) {
    std::fprintf(stderr, "cedar bench: %s\n", error.c_str());
    return 2;
  }
  cfg.server.api_key = o.api_key;
  std::vector<session_trace> traces;
  if (!load_traces(o, traces)) return 1;
  bench_report report;
  std::string model = o.model;
  if (model.empty()) {
    auto found = discover_model(cfg.server);
    if (!found) {
      std::fprintf(stderr, "cedar bench: %s gives no answer to GET %s/models (is the server up? --model skips "
                   "this look-up)\n", o.url.c_str(), cfg.server.api_path.c_str());
      return 1;
    }
    model = *found;
  }
  report.meta = {o.url, model, o.traces, o.scale, o.warmup_s, o.duration_s,
                 o.think_scale, o.max_think_s};
  describe_traces(traces, report.meta);
  cfg.model = model;
  cfg.traces = &traces;
  cfg.think_scale = o.think_scale;
  cfg.max_think_s = o.max_think_s;
  cfg.warmup_s = o.warmup_s;
  cfg.duration_s = o.duration_s;
  cfg.request_timeout = std::chrono::milliseconds(int64_t(o.request_timeout_s * 1000));
  cfg.metrics_target = o.metrics_path;
  cfg.seed = o.seed;
  cfg.random_start = o.random_start;
  for (api_kind api : o.apis) {
    cfg.api = api;
    cfg.label = o.label.empty() ? api_name(api)
                : o.apis.size() > 1 ? o.label + "/" + api_name(api) : o.label;
    config_result result{cfg.label, api_name(api), {}};
    for (int c : o.concurrency) result.points.push_back(run_point(cfg, c));
    report.configs.push_back(std::move(result));
  }
  std::filesystem::path dir(o.out_dir);
  std::filesystem::create_directories(dir);
  plot_options plot;
  plot.title = "cedar bench: " + o.url;
  bool ok = write_file(dir / "results.json", report_json(report)) &&
            write_file(dir / "results.md", report_markdown(report)) &&
            write_file(dir / "curve.svg", render_svg(report_curves(report), plot));
  std::fputs(report_markdown(report).c_str(), stdout);
  // a point where nothing completed and everything failed measured nothing: say so, and fail
  bool measured = true;
  for (const config_result& c : report.configs)
    for (const point_result& p : c.points)
      if (p.num_requests == 0 && !p.errors.empty()) {
        std::fprintf(stderr, "cedar bench: %s at concurrency %d: no request completed; the first error: %s\n",
                     c.label.c_str(), p.concurrency, p.first_error.c_str());
        measured = false;
      }
  return ok && measured ? 0 : 1;
}

namespace {

/// The middle of the interactivity range both curves cover (or, without overlap, the lower of
/// the two curves' highest interactivity).
std::optional<double> default_bound(const named_curve& a, const named_curve& b) {
  if (a.points.empty() || b.points.empty()) return std::nullopt;
  auto range = [](const named_curve& c) {
    auto [lo, hi] = std::minmax_element(c.points.begin(), c.points.end(),
                                        [](auto& p, auto& q) { return p.interactivity < q.interactivity; });
    return std::pair{lo->interactivity, hi->interactivity};
  };
  auto [alo, ahi] = range(a);
  auto [blo, bhi] = range(b);
  double lo = std::max(alo, blo), hi = std::min(ahi, bhi);
  return lo <= hi ? (lo + hi) / 2 : hi;
}

std::string opt_num(std::optional<double> v) {
  char buf[64];
  if (!v) return "null";
  std::snprintf(buf, sizeof buf, "%.6g", *v);
  return buf;
}

}  // namespace

int run_compare(const compare_options& o) {
  std::vector<named_curve> a, b;
  std::string error;
  if (!read_report_curves((std::filesystem::path(o.a_dir) / "results.json").string(), a, error) ||
      !read_report_curves((std::filesystem::path(o.b_dir) / "results.json").string(), b, error)) {
    std::fprintf(stderr, "cedar bench compare: %s\n", error.c_str());
    return 1;
  }
  if (a.empty() || b.empty()) {
    std::fprintf(stderr, "cedar bench compare: a results.json has no configuration\n");
    return 1;
  }
  std::optional<double> bound = o.bound ? o.bound : default_bound(a[0], b[0]);
  if (!bound) {
    std::fprintf(stderr, "cedar bench compare: no interactivity figures to compare\n");
    return 1;
  }
  std::optional<double> ta = throughput_at_bound(a[0].points, *bound);
  std::optional<double> tb = throughput_at_bound(b[0].points, *bound);
  std::optional<double> ratio;
  if (ta && tb && *ta > 0) ratio = *tb / *ta;
  std::vector<named_curve> curves;
  for (auto& c : a) curves.push_back({"A " + c.name, c.points});
  for (auto& c : b) curves.push_back({"B " + c.name, c.points});

  std::string json = "{\"bound_tok_s_user\":" + opt_num(bound) + ",\"a\":{\"dir\":";
  append_json_string(json, o.a_dir);
  json += ",\"label\":";
  append_json_string(json, a[0].name);
  json += ",\"output_tokens_per_s\":" + opt_num(ta) + "},\"b\":{\"dir\":";
  append_json_string(json, o.b_dir);
  json += ",\"label\":";
  append_json_string(json, b[0].name);
  json += ",\"output_tokens_per_s\":" + opt_num(tb) + "},\"ratio_b_over_a\":" + opt_num(ratio) + "}\n";
  std::string md = "# cedar bench compare\n\nThroughput at interactivity >= " + opt_num(bound) +
                   " tok/s/user (interpolated along each curve)\n\n| run | config | output tok/s |\n"
                   "|---|---|---|\n| A `" + o.a_dir + "` | " + a[0].name + " | " + opt_num(ta) +
                   " |\n| B `" + o.b_dir + "` | " + b[0].name + " | " + opt_num(tb) +
                   " |\n\nratio B/A: " + opt_num(ratio) + "\n";
  plot_options plot;
  plot.title = "A/B at " + opt_num(bound) + " tok/s/user: B/A = " + opt_num(ratio);
  plot.x_marker = bound;
  std::filesystem::path dir(o.out_dir);
  std::filesystem::create_directories(dir);
  bool ok = write_file(dir / "compare.json", json) && write_file(dir / "compare.md", md) &&
            write_file(dir / "curve.svg", render_svg(curves, plot));
  std::fputs(md.c_str(), stdout);
  return ok ? 0 : 1;
}

}  // namespace cedar::bench
