// results.json / results.md writers and the results.json reader used by `compare`.
#include "tools/bench/report.hpp"

#include <simdjson.h>

#include <cstdio>

#include "tools/bench/protocol.hpp"

namespace cedar::bench {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}
std::string num(const std::optional<double>& v) { return v ? num(*v) : "null"; }

std::string percentiles_json(const percentiles& p) {
  return "{\"p50\":" + num(p.p50) + ",\"p90\":" + num(p.p90) + ",\"p99\":" + num(p.p99) +
         ",\"mean\":" + num(p.mean) + "}";
}

std::string point_json(const point_result& p) {
  std::string s = "{\"concurrency\":" + std::to_string(p.concurrency);
  s += ",\"measured_s\":" + num(p.measured_s);
  s += ",\"requests\":" + std::to_string(p.num_requests);
  s += ",\"short_outputs\":" + std::to_string(p.num_short_outputs);
  s += ",\"input_tokens\":" + std::to_string(p.num_input_tokens);
  s += ",\"output_tokens\":" + std::to_string(p.num_output_tokens);
  s += ",\"ttft_ms\":" + percentiles_json(p.ttft_ms);
  s += ",\"itl_ms\":" + percentiles_json(p.itl_ms);
  s += ",\"e2e_ms\":" + percentiles_json(p.e2e_ms);
  s += ",\"output_tokens_per_s\":" + num(p.output_tokens_per_s);
  s += ",\"total_tokens_per_s\":" + num(p.total_tokens_per_s);
  s += ",\"interactivity_tok_s_user\":" + num(p.interactivity);
  s += ",\"prefix_cache_hit_rate\":" + num(p.prefix_hit_rate);
  s += ",\"usage_cached_fraction\":" + num(p.usage_cached_fraction);
  int64_t num_errors = 0;
  std::string kinds;
  for (auto& [kind, n] : p.errors) {
    num_errors += n;
    if (!kinds.empty()) kinds += ',';
    append_json_string(kinds, kind);
    kinds += ':' + std::to_string(n);
  }
  s += ",\"errors\":{\"total\":" + std::to_string(num_errors) + ",\"by_kind\":{" + kinds + "}";
  s += ",\"first\":";
  append_json_string(s, p.first_error);
  s += "}}";
  return s;
}

std::string cell(const std::optional<double>& v, const char* fmt = "%.1f") {
  if (!v) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, *v);
  return buf;
}

}  // namespace

std::string report_json(const bench_report& report) {
  const run_meta& m = report.meta;
  std::string s = "{\n  \"meta\":{\"url\":";
  append_json_string(s, m.url);
  s += ",\"model\":";
  append_json_string(s, m.model);
  s += ",\"traces\":";
  append_json_string(s, m.traces);
  s += ",\"sessions\":" + std::to_string(m.num_sessions) + ",\"scale\":" + num(m.scale) +
       ",\"warmup_s\":" + num(m.warmup_s) + ",\"duration_s\":" + num(m.duration_s) +
       ",\"think_scale\":" + num(m.think_scale) + ",\"max_think_s\":" + num(m.max_think_s) +
       ",\"trace_prefix_reuse\":" + num(m.trace_prefix_reuse) + "},\n  \"configs\":[";
  for (size_t c = 0; c < report.configs.size(); ++c) {
    const auto& cfg = report.configs[c];
    s += c ? ",\n    {\"label\":" : "\n    {\"label\":";
    append_json_string(s, cfg.label);
    s += ",\"api\":";
    append_json_string(s, cfg.api);
    s += ",\"runs\":[";
    for (size_t i = 0; i < cfg.points.size(); ++i)
      s += (i ? ",\n      " : "\n      ") + point_json(cfg.points[i]);
    s += "]}";
  }
  s += "\n  ]\n}\n";
  return s;
}

std::string report_markdown(const bench_report& report) {
  const run_meta& m = report.meta;
  std::string s = "# cedar bench\n\n";
  s += "server `" + m.url + "`, model `" + m.model + "`, traces `" + m.traces + "` (" +
       std::to_string(m.num_sessions) + " sessions, scale " + num(m.scale) +
       ", theoretical prefix reuse " + cell(m.trace_prefix_reuse * 100) + "%), warm-up " +
       num(m.warmup_s) + " s, measured " + num(m.duration_s) + " s, think time x" +
       num(m.think_scale) + " capped at " + num(m.max_think_s) + " s\n\n";
  s += "| config | conc | requests | TTFT p50/p90/p99 ms | ITL p50/p90/p99 ms | E2E p50/p90/p99 ms "
       "| out tok/s | total tok/s | interactivity tok/s/user | prefix hit | errors |\n";
  s += "|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto triple = [](const percentiles& p) {
    return cell(p.p50) + " / " + cell(p.p90) + " / " + cell(p.p99);
  };
  for (auto& cfg : report.configs)
    for (auto& p : cfg.points) {
      int64_t num_errors = 0;
      for (auto& [kind, n] : p.errors) num_errors += n;
      std::optional<double> hit;
      if (p.prefix_hit_rate) hit = *p.prefix_hit_rate * 100;
      s += "| " + cfg.label + " | " + std::to_string(p.concurrency) + " | " +
           std::to_string(p.num_requests) + " | " + triple(p.ttft_ms) + " | " +
           triple(p.itl_ms) + " | " + triple(p.e2e_ms) + " | " + cell(p.output_tokens_per_s) +
           " | " + cell(p.total_tokens_per_s) + " | " + cell(p.interactivity) + " | " +
           (hit ? cell(hit) + "%" : "-") + " | " + std::to_string(num_errors) + " |\n";
    }
  return s;
}

std::vector<named_curve> report_curves(const bench_report& report) {
  std::vector<named_curve> out;
  for (auto& cfg : report.configs) {
    named_curve c{cfg.label, {}};
    for (auto& p : cfg.points)
      if (p.interactivity)
        c.points.push_back({*p.interactivity, p.output_tokens_per_s, p.concurrency});
    out.push_back(std::move(c));
  }
  return out;
}

bool read_report_curves(const std::string& path, std::vector<named_curve>& out,
                        std::string& error) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto err = parser.load(path).get(root); err) {
    error = path + ": " + simdjson::error_message(err);
    return false;
  }
  simdjson::dom::array configs;
  if (root["configs"].get_array().get(configs)) {
    error = path + ": no 'configs' array";
    return false;
  }
  for (simdjson::dom::element cfg : configs) {
    std::string_view label;
    if (cfg["label"].get_string().get(label)) label = "?";
    named_curve c{std::string(label), {}};
    simdjson::dom::array runs;
    if (!cfg["runs"].get_array().get(runs))
      for (simdjson::dom::element run : runs) {
        double x, y;
        if (run["interactivity_tok_s_user"].get_double().get(x)) continue;
        if (run["output_tokens_per_s"].get_double().get(y)) continue;
        int64_t concurrency = 0;
        if (run["concurrency"].get_int64().get(concurrency)) concurrency = 0;
        c.points.push_back({x, y, int(concurrency)});
      }
    out.push_back(std::move(c));
  }
  return true;
}

}  // namespace cedar::bench
