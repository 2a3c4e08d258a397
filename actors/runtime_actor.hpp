// The runtime actor (supervisor, DESIGN.md §2, §4): owns the current layout (its shards, their
// communicator group and one scheduler policy per data-parallel group), runs the groups' step
// loops in lockstep (a DEP rank with nothing to do still joins each step's expert exchange),
// routes requests to groups (session affinity), switches layouts at a step boundary and
// rebuilds the layout when a shard dies. It answers the scheduler interface, so sessions and
// the engine talk to it as to one scheduler.
#pragma once

#include <memory>

#include "actors/layout.hpp"
#include "actors/protocol.hpp"
#include "config/engine_options.hpp"
#include "actors/rank_source.hpp"

namespace cedar {

/// Spawns the runtime serving the shards `src` makes, in `layout`. Each data-parallel group gets
/// the KV budget of `options` (kv_budget_bytes, max_num_seqs); every shard of a TP group holds
/// a replica.
runtime_actor spawn_runtime(caf::actor_system& sys, std::shared_ptr<rank_source> src, const engine_options& options,
                            layout_spec layout);

}  // namespace cedar
