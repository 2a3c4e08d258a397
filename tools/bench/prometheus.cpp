// Prometheus text scan: one pass over the lines, metric names matched by suffix.
#include "tools/bench/prometheus.hpp"

#include <cstdlib>
#include <string>

namespace cedar::bench {
namespace {

void add(std::optional<double>& slot, double v) { slot = slot.value_or(0) + v; }

}  // namespace

prefix_cache_sample parse_prefix_cache_metrics(std::string_view text) {
  prefix_cache_sample s;
  // Two naming schemes, kept apart so that a server exporting both is not counted twice.
  std::optional<double> hit_tokens, lookup_tokens, prompt_tokens, hits, queries;
  int num_rates = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (line.empty() || line.front() == '#') continue;
    size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    std::string_view name = line.substr(0, name_end);
    size_t value_at = line.find(' ', line[name_end] == '{' ? line.find('}', name_end) : name_end);
    if (value_at == std::string_view::npos) continue;
    std::string value_text(line.substr(value_at + 1));
    char* end = nullptr;
    double value = std::strtod(value_text.c_str(), &end);
    if (end == value_text.c_str()) continue;
    if (name.ends_with("prefix_cache_hit_rate")) {
      s.hit_rate = (s.hit_rate.value_or(0) * num_rates + value) / (num_rates + 1);
      ++num_rates;
    } else if (name.ends_with("prefix_cache_hit_tokens_total")) {
      add(hit_tokens, value);
    } else if (name.ends_with("prefix_cache_lookup_tokens_total")) {
      add(lookup_tokens, value);
    } else if (name.ends_with("prompt_tokens_total") && name.find("prefix") == name.npos &&
               name.find("cached") == name.npos) {
      add(prompt_tokens, value);
    } else if (name.ends_with("prefix_cache_hits_total")) {
      add(hits, value);
    } else if (name.ends_with("prefix_cache_queries_total")) {
      add(queries, value);
    }
  }
  if (hit_tokens && (lookup_tokens || prompt_tokens)) {
    s.hit_tokens = hit_tokens;
    s.prompt_tokens = lookup_tokens ? lookup_tokens : prompt_tokens;
  } else if (hits && queries) {
    s.hit_tokens = hits;
    s.prompt_tokens = queries;
  }
  return s;
}

std::optional<double> prefix_hit_rate(const prefix_cache_sample& before,
                                      const prefix_cache_sample& after) {
  if (before.hit_tokens && before.prompt_tokens && after.hit_tokens && after.prompt_tokens) {
    double prompts = *after.prompt_tokens - *before.prompt_tokens;
    if (prompts > 0) return (*after.hit_tokens - *before.hit_tokens) / prompts;
  }
  return after.hit_rate;
}

}  // namespace cedar::bench
