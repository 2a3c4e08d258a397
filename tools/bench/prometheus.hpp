// Reads a server's prefix-cache hit rate from its Prometheus text exposition (/metrics), knowing
// nothing of the server but common metric names:
//   *prefix_cache_hit_rate                      a gauge in [0,1]
//   *prefix_cache_hit_tokens_total / *prefix_cache_lookup_tokens_total (or *prompt_tokens_total,
//                                               not a "cached" one)  token counters
//   *prefix_cache_hits_total / *prefix_cache_queries_total  token counters (vLLM's names)
#pragma once

#include <optional>
#include <string_view>

namespace cedar::bench {

struct prefix_cache_sample {
  std::optional<double> hit_rate;       ///< gauge, if the server exports one
  std::optional<double> hit_tokens;     ///< counter, summed over label sets
  std::optional<double> prompt_tokens;  ///< counter, summed over label sets
};

prefix_cache_sample parse_prefix_cache_metrics(std::string_view text);

/// Hit rate over a window: the counters' increase if both samples have them and prompts grew,
/// else the gauge of `after`, else nullopt.
std::optional<double> prefix_hit_rate(const prefix_cache_sample& before,
                                      const prefix_cache_sample& after);

}  // namespace cedar::bench
