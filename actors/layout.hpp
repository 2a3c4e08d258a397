// Parallel layouts as the runtime names them ("tp1", "tp4", "dep2"): how many shards, how
// they split the model (kernels/model/shard_plan.hpp) and how many data-parallel groups
// (schedulers) they serve. Plain C++.
#pragma once

#include <string>

#include "actors/errors.hpp"
#include "config/model_args.hpp"
#include "kernels/model/kv_layout.hpp"
#include "kernels/model/shard_plan.hpp"

namespace cedar {

struct layout_spec {
  parallel_mode mode = parallel_mode::tp;
  int num_shards = 1;

  /// TP: one scheduler for all shards; DEP: one scheduler per shard.
  int num_groups() const { return mode == parallel_mode::tp ? 1 : num_shards; }
  /// The data-parallel group a shard serves.
  int group_of_shard(int shard) const { return mode == parallel_mode::tp ? 0 : shard; }
  /// "tp4", "dep2".
  std::string name() const;
  bool operator==(const layout_spec&) const = default;
};

/// Parses "tpN" or "depN" (N of 1 to 3 digits), the name alone.
outcome<layout_spec> parse_layout_name(const std::string& text);
/// parse_layout_name, then checked against the model (check_layout).
outcome<layout_spec> parse_layout(const std::string& text, const model_args& args);

/// What a shard process and the runtime compare before working together: the model's shape,
/// KV format and Engram token map (the weights themselves are the operator's responsibility).
std::string model_fingerprint(const model_args& args, const kv_layout& kv);

}  // namespace cedar
