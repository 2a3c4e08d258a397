// One rank of a parallel layout as a step_model, so a plain `shard` (actors/shard.hpp) runs
// it: the shared CPU model, this rank's shard_view and the communicator it owns. A TP
// follower (rank > 0) runs every layer with the leader but computes no logits: it hands back
// zeros, and the runtime uses the leader's sampled tokens only.
#pragma once

#include <memory>

#include "actors/shard.hpp"
#include "kernels/collectives/communicator.hpp"
#include "kernels/model/shard_plan.hpp"

namespace cedar {

/// A step_model for rank `view.rank`; owns `comm` (null for a one-rank layout).
std::unique_ptr<step_model> make_rank_model(std::shared_ptr<const model> m, shard_view view,
                                            std::unique_ptr<communicator> comm);

}  // namespace cedar
