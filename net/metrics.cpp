// Histogram arithmetic and the Prometheus rendering of server and engine metrics.
#include "net/metrics.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace cedar::net {

double latency_histogram::bound(int i) { return 1e-5 * std::ldexp(1.0, i); }

void latency_histogram::observe(double seconds) {
  int i = 0;
  while (i < num_buckets && seconds > bound(i)) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(int64_t(seconds * 1e9), std::memory_order_relaxed);
}

double latency_histogram::quantile(double q) const {
  int64_t total = count();
  if (total == 0) return 0;
  double target = q * double(total), seen = 0;
  for (int i = 0; i <= num_buckets; ++i) {
    double n = double(buckets_[i].load(std::memory_order_relaxed));
    if (seen + n >= target && n > 0) {
      double lo = i == 0 ? 0 : bound(i - 1), hi = i < num_buckets ? bound(i) : bound(i - 1) * 2;
      return lo + (hi - lo) * (target - seen) / n;
    }
    seen += n;
  }
  return bound(num_buckets - 1);
}

void latency_histogram::render(std::string& out, const std::string& name,
                               const std::string& help) const {
  char line[256];
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  int64_t cumulative = 0;
  for (int i = 0; i < num_buckets; ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    // the bound's shortest exact text: %g rounded 20.97152 to 20.9715, a label below the bound
    char le[32];
    *std::to_chars(le, le + sizeof le - 1, bound(i)).ptr = 0;
    std::snprintf(line, sizeof line, "%s_bucket{le=\"%s\"} %lld\n", name.c_str(), le, (long long)cumulative);
    out += line;
  }
  cumulative += buckets_[num_buckets].load(std::memory_order_relaxed);
  // _count is the +Inf bucket's total, so a scrape during an update never shows them apart
  std::snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.9f\n%s_count %lld\n",
                name.c_str(), (long long)cumulative, name.c_str(),
                double(sum_ns_.load(std::memory_order_relaxed)) * 1e-9, name.c_str(), (long long)cumulative);
  out += line;
}

namespace {

void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  char line[512];
  std::snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type,
                name, value);
  out += line;
}

}  // namespace

std::string server_metrics::render(const engine_metrics& e, bool ready, bool draining) const {
  std::string out;
  auto get = [](const std::atomic<int64_t>& a) { return double(a.load(std::memory_order_relaxed)); };
  metric(out, "cedar_ready", "gauge", "1 when the server accepts requests", ready && !draining);
  metric(out, "cedar_draining", "gauge", "1 while shutting down", draining);
  metric(out, "cedar_requests_running", "gauge", "requests in the running batch", e.num_running);
  metric(out, "cedar_requests_waiting", "gauge", "requests queued for admission", e.num_waiting);
  metric(out, "cedar_kv_pages_used", "gauge", "global-KV pages referenced by running requests",
         double(e.num_kv_pages_used));
  metric(out, "cedar_kv_pages_cached", "gauge", "global-KV pages held only by the prefix cache",
         double(e.num_kv_pages_cached));
  metric(out, "cedar_kv_pages_free", "gauge", "global-KV pages free", double(e.num_kv_pages_free));
  double hit_rate = e.num_prefix_lookup_tokens
                        ? double(e.num_prefix_hit_tokens) / double(e.num_prefix_lookup_tokens) : 0;
  metric(out, "cedar_prefix_cache_hit_rate", "gauge",
         "prompt tokens served from the prefix cache / prompt tokens looked up", hit_rate);
  metric(out, "cedar_prefix_cache_lookup_tokens_total", "counter", "prompt tokens looked up",
         double(e.num_prefix_lookup_tokens));
  metric(out, "cedar_prefix_cache_hit_tokens_total", "counter", "prompt tokens found cached",
         double(e.num_prefix_hit_tokens));
  metric(out, "cedar_sessions_open", "gauge", "conversations (Responses chains, WebSockets) with KV kept warm",
         double(e.num_sessions_open));
  metric(out, "cedar_session_turns_extended_total", "counter",
         "conversation turns that sent only their new tokens to the session",
         double(e.num_session_turns_extended));
  metric(out, "cedar_session_turns_restarted_total", "counter",
         "conversation turns whose prompt did not extend the session (a new session, whole prompt)",
         double(e.num_session_turns_restarted));
  out += "# HELP cedar_topology_info current parallel layout and its state\n"
         "# TYPE cedar_topology_info gauge\n";
  out += "cedar_topology_info{topology=\"" + e.topology + "\",state=\"" + e.topology_state +
         "\",shards=\"" + std::to_string(e.num_shards) + "\"} 1\n";
  metric(out, "cedar_shards_alive", "gauge", "shards of the current layout that answer", e.num_shards_alive);
  metric(out, "cedar_layout_switches_total", "counter", "live layout switches (TP <-> DEP)",
         double(e.num_layout_switches));
  metric(out, "cedar_layout_rebuilds_total", "counter", "layouts rebuilt in place after a shard failed",
         double(e.num_layout_rebuilds));
  out += "# HELP cedar_group_requests_running requests running per data-parallel group\n"
         "# TYPE cedar_group_requests_running gauge\n";
  for (size_t g = 0; g < e.group_running.size(); ++g)
    out += "cedar_group_requests_running{group=\"" + std::to_string(g) + "\"} " +
           std::to_string(e.group_running[g]) + "\n";
  out += "# HELP cedar_group_requests_waiting requests waiting per data-parallel group\n"
         "# TYPE cedar_group_requests_waiting gauge\n";
  for (size_t g = 0; g < e.group_waiting.size(); ++g)
    out += "cedar_group_requests_waiting{group=\"" + std::to_string(g) + "\"} " +
           std::to_string(e.group_waiting[g]) + "\n";
  metric(out, "cedar_http_requests_total", "counter", "API requests received", get(num_requests_total));
  metric(out, "cedar_http_requests_failed_total", "counter", "API requests answered with an error",
         get(num_requests_failed));
  metric(out, "cedar_requests_cancelled_total", "counter",
         "generations cancelled (client gone, response.cancel, stop string, drain)",
         get(num_requests_cancelled));
  metric(out, "cedar_prompt_tokens_total", "counter", "prompt tokens submitted", get(num_prompt_tokens));
  metric(out, "cedar_cached_prompt_tokens_total", "counter", "prompt tokens reported cached",
         get(num_cached_prompt_tokens));
  metric(out, "cedar_generation_tokens_total", "counter", "tokens generated and delivered",
         get(num_generated_tokens));
  metric(out, "cedar_open_connections", "gauge", "open TCP connections", get(num_open_connections));
  metric(out, "cedar_connections_refused_total", "counter", "connections closed at accept: --max-connections reached",
         get(num_connections_refused));
  metric(out, "cedar_open_websockets", "gauge", "open WebSocket sessions", get(num_open_websockets));
  metric(out, "cedar_websocket_merged_events_total", "counter",
         "delta events merged into the queued delta before them (a socket behind)",
         get(num_ws_merged_events));
  metric(out, "cedar_active_generations", "gauge", "generations being streamed or collected",
         get(num_active_generations));
  ttft.render(out, "cedar_time_to_first_token_seconds",
              "request received -> first token handed to the connection (parsing, rendering and "
              "tokenizing included)");
  inter_token.render(out, "cedar_inter_token_latency_seconds", "gap between tokens sent on a stream");
  server_added.render(out, "cedar_server_added_latency_seconds",
                      "engine emitted a token -> its bytes written to the socket");
  request_duration.render(out, "cedar_request_duration_seconds", "request received -> last byte");
  return out;
}

}  // namespace cedar::net
