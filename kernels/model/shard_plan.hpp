// Parallel layouts as the forward pass sees them (DESIGN.md §4): a shard_view tells one rank
// which query heads and which experts it computes and which communicator joins it to its
// peers. TP-N: every rank runs the same batch; query heads are split evenly (the window KV
// latent, compressors, indexers and routing are replicated), the heads' outputs are gathered
// before the output LoRA, and expert outputs are summed across ranks. DEP-N: every rank runs
// its own batch with all heads; only the experts are split, and rows travel to the owners of
// their experts and back. Experts are placed round-robin (expert e on rank e % N).
//
// Both are exact: the collectives move disjoint pieces (a sum with one nonzero term), and each
// rank combines them in the single-rank order, so every layout gives the bits of TP-1.
#pragma once

#include <cstdint>
#include <string>

#include "config/model_args.hpp"

namespace cedar {

class communicator;

enum class parallel_mode : uint8_t { tp, dep };

/// One rank's part of a layout. Plain data; the communicator is borrowed (the shard owns it).
struct shard_view {
  parallel_mode mode = parallel_mode::tp;
  int rank = 0;
  int size = 1;
  communicator* comm = nullptr;  ///< required when size > 1; used by this rank's thread only
  int head_begin = 0;            ///< query heads [head_begin, head_end) this rank attends
  int head_end = 0;

  /// Experts are placed round-robin.
  int expert_owner(int expert) const { return expert % size; }
  bool owns_expert(int expert) const { return expert_owner(expert) == rank; }
  /// TP with more than one rank: heads are split and gathered after attention.
  bool splits_heads() const { return mode == parallel_mode::tp && size > 1; }
  /// DEP ranks take part in every layer's expert exchange, even with no rows of their own.
  bool exchanges_every_layer() const { return mode == parallel_mode::dep && size > 1; }
  int num_heads() const { return head_end - head_begin; }
  /// A TP rank other than the leader: it runs every layer but computes no logits (the runtime
  /// samples from the leader's).
  bool tp_follower() const { return mode == parallel_mode::tp && rank > 0; }
};

/// Empty if `args` can run in `mode` on `size` ranks, else the reason. TP needs size to
/// divide the query heads (spec §5.9 caps a split output projection at o_groups; here the
/// heads' outputs are gathered and the output LoRA runs on every rank, so the cap is the head
/// count); DEP needs at most one rank per expert.
std::string check_layout(const model_args& args, parallel_mode mode, int size);

/// The view of rank `rank` of a `size`-rank layout (check_layout must pass).
shard_view make_shard_view(const model_args& args, parallel_mode mode, int rank, int size,
                           communicator* comm);

}  // namespace cedar
