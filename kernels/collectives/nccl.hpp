// The NCCL collectives for GPU shards: one rank per GPU, buffers in that GPU's memory, every
// call enqueued on the communicator's stream and waited for before it returns (the forward
// pass on the CPU side stays simple; overlapping comes later). Built when the CUDA toolkit
// and NCCL are found (CEDAR_HAVE_NCCL); otherwise nccl_available() is false and
// make_nccl_communicator explains why.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "kernels/collectives/communicator.hpp"

namespace cedar {

/// The group's rendezvous id (ncclUniqueId's 128 bytes): made once by rank 0, given to every
/// rank (a host value: it may travel in a message).
using nccl_group_id = std::array<char, 128>;

/// Whether this build has NCCL.
bool nccl_available();

/// A new group id. Throws collective_error in a build without NCCL.
nccl_group_id nccl_make_group_id();

/// Joins rank `rank` of a `size`-rank group on CUDA device `device`. Blocks until every rank
/// joined. Throws collective_error (with NCCL's message) on failure or without NCCL.
std::unique_ptr<communicator> make_nccl_communicator(const nccl_group_id& id, int rank, int size,
                                                     int device);

}  // namespace cedar
