// The shard actor: runs on its own thread (the forward pass blocks) and owns a `shard` (the
// model and the KV bytes). It answers each run_step with a one-way step_output to the sender.
#pragma once

#include <memory>

#include "actors/protocol.hpp"
#include "actors/shard.hpp"

namespace cedar {

/// Spawns a detached shard actor owning `s`.
shard_actor spawn_shard(caf::actor_system& sys, std::shared_ptr<shard> s);

}  // namespace cedar
