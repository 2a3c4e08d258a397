// Where the runtime gets the shards of a layout (DESIGN.md §4): a rank_source makes the step
// models of a layout's ranks with their communicators joined. The CPU source shares one
// cedar::model among every rank and joins them with in-process collectives; the GPU source
// (gpu_shard.hpp) holds one model per device, placed for a fixed number of ranks, and joins
// them with NCCL. The runtime builds every layout, switch and rebuild through it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/layout.hpp"
#include "actors/shard.hpp"
#include "kernels/collectives/inproc.hpp"
#include "kernels/model/model.hpp"

namespace cedar {

/// The step models of ranks [first, spec.num_shards) of a layout (rank r at models[r - first]),
/// and the in-process group joining them when there is one (the runtime aborts it on a fault,
/// so that peers blocked in a collective return).
struct layout_ranks {
  std::vector<std::unique_ptr<step_model>> models;
  std::shared_ptr<inproc_group> comm;
};

class rank_source {
 public:
  virtual ~rank_source() = default;
  virtual const model_args& args() const = 0;
  virtual const kv_layout& layout() const = 0;
  /// Empty when `spec` can be built from this source, else why (beyond check_layout's rules).
  virtual std::string check(const layout_spec& spec) const = 0;
  /// Rank 0 may be served elsewhere (a shard process for tp1): first > 0 skips it. timeout:
  /// how long a collective waits for a peer. Throws std::runtime_error when it cannot.
  virtual layout_ranks make(const layout_spec& spec, int first, std::chrono::milliseconds timeout) = 0;
  /// Whether a layout's shard may run in a shard process (cedar shard --connect): tp1 of the
  /// CPU model.
  virtual bool remote_shards() const { return false; }
  /// The memory each shard's KV arena is taken from when that is the host's (the CPU model:
  /// host_memory_bytes()); -1 when every shard's KV lives in its own device's memory.
  virtual int64_t host_kv_memory_bytes() const { return -1; }
};

/// This host's memory: physical, or its cgroup's limit when that is lower.
int64_t host_memory_bytes();

/// Empty when `arenas` KV arenas of `budget` bytes each fit in src's host memory (always, when
/// the KV lives on devices); else why, naming --kv-budget-bytes. `what` says where the arenas
/// come from, e.g. "layout 'tp4' (4 shards)".
std::string check_host_kv(const rank_source& src, int64_t budget, int arenas, const std::string& what);

/// Every layout of the CPU model m (one replica shared by the ranks, in-process collectives).
std::shared_ptr<rank_source> make_cpu_rank_source(std::shared_ptr<const model> m);

}  // namespace cedar
