// Re-homing at a layout switch or a rebuild after a shard failure: every request and every
// cached chain of full global-KV pages moves from the old data-parallel groups' schedulers to
// the new ones; page bytes are copied from one old shard that holds them (in TP every rank
// holds a replica) into every new shard of the target group with kv_arena::copy_page (host or
// device memory on either side: a GPU shard's pages move by device copies). SWA rings are not
// moved: the moved requests resume through the prefix cache, which schedules their bounded
// replay.
// Plain C++, run on the runtime actor's thread while no shard is running a step.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "actors/scheduler.hpp"
#include "actors/session_router.hpp"
#include "actors/shard.hpp"

namespace cedar {

/// An old group: its scheduler (no step in flight) and a shard arena holding its KV, or null
/// when the group's KV was lost with its shard (its requests then recompute from the start).
struct rehome_source {
  scheduler* policy = nullptr;
  kv_arena* arena = nullptr;
};

/// A new group: its (empty) scheduler and the arenas of all its shards.
struct rehome_target {
  scheduler* policy = nullptr;
  std::vector<kv_arena*> arenas;
  bool reachable = true;  ///< false when a shard of the group is remote: no pages are copied
};

struct rehome_stats {
  int64_t requests_moved = 0;
  int64_t pages_copied = 0;     ///< pages copied (once per target shard counted once)
  int64_t chains_dropped = 0;   ///< cached chains that did not fit or whose KV was lost
};

/// Moves everything from `from` to `to`. The router must already have `to.size()` groups:
/// a session's chains and requests go to its group; chains and requests without a session are
/// dealt round-robin and by load. request_group is rewritten for every moved request.
rehome_stats rehome(const std::vector<rehome_source>& from, const std::vector<rehome_target>& to,
                    const kv_layout& layout, session_router& router, std::map<uint64_t, int>& request_group);

}  // namespace cedar
