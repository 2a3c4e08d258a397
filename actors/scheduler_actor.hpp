// The scheduler actor of one data-parallel group: owns the scheduler policy (queues, KV pool,
// prefix cache, replay) and drives the step loop: one run_step in flight to its shard at a
// time, the next planned as soon as the reply is applied; submissions and cancellations are
// handled between steps. Token batches go to the actor that submitted each request.
#pragma once

#include "actors/protocol.hpp"
#include "actors/scheduler.hpp"

namespace cedar {

/// Spawns the scheduler for a shard whose model uses `layout`.
scheduler_actor spawn_scheduler(caf::actor_system& sys, const model_args& args, const kv_layout& layout,
                                const engine_options& options, shard_actor shard);

}  // namespace cedar
