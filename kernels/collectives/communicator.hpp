// One interface for the collectives a sharded forward pass needs (DESIGN.md §4): all-reduce
// (TP), all-gather, reduce-scatter, broadcast, and the variable-size all-to-all of expert
// dispatch/combine (DEP). Two implementations: in-process threads (inproc.hpp, CPU shards and
// tests) and NCCL (nccl.hpp, GPUs). A communicator belongs to one rank and is used by that
// rank's thread only; every rank of a group must call the same collectives in the same order.
#pragma once

#include <cstddef>
#include <stdexcept>

namespace cedar {

/// Thrown by a collective that cannot complete: the group was aborted (a peer died or was
/// torn down) or a peer did not arrive within the group's timeout. The group is unusable
/// afterwards; the runtime builds a new one.
struct collective_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Buffers are fp32 in the memory the implementation computes in: host memory for the
/// in-process group, the rank's CUDA device for NCCL. Counts are always host values.
/// Sums are deterministic: the in-process group adds the ranks' values in rank order
/// (((r0 + r1) + r2) + ...), so a result never depends on thread timing.
class communicator {
 public:
  virtual ~communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// GPU groups: the collectives that follow are enqueued on `stream` (a cudaStream_t of this
  /// rank's device; null is the legacy default stream) and return without waiting, ordered with
  /// the caller's work on that stream (exchange_counts still waits: its counts come back to the
  /// host). Until it is called, every collective runs on the group's own stream and is waited
  /// for. Host groups ignore it.
  virtual void enqueue_on(void* stream) { (void)stream; }

  /// data[i] = sum over ranks of data[i] (in place), identical on every rank.
  virtual void all_reduce_sum(float* data /*[count]*/, std::size_t count) = 0;
  /// recv[p * count + i] = rank p's send[i].
  virtual void all_gather(const float* send /*[count]*/, std::size_t count,
                          float* recv /*[size * count]*/) = 0;
  /// recv[i] = sum over ranks of send[rank() * count + i].
  virtual void reduce_scatter_sum(const float* send /*[size * count]*/, std::size_t count,
                                  float* recv /*[count]*/) = 0;
  /// data = root's data on every rank.
  virtual void broadcast(float* data /*[count]*/, std::size_t count, int root) = 0;
  /// recv_counts[p] = the count rank p will send to this rank (p's send_counts[rank()]).
  virtual void exchange_counts(const std::size_t* send_counts /*[size] host*/,
                               std::size_t* recv_counts /*[size] host*/) = 0;
  /// GPU groups: exchange_counts on device buffers of uint64 (recv[p] = rank p's send[rank()]),
  /// enqueued like the other collectives (no wait). Host groups throw collective_error.
  virtual void exchange_counts_device(const void* send /*[size] uint64*/, void* recv /*[size] uint64*/) {
    (void)send, (void)recv;
    throw collective_error("exchange_counts_device: this group's buffers are in host memory");
  }
  /// Sends send_counts[p] values to rank p, taken consecutively from `send` in rank order,
  /// and receives recv_counts[p] values from each p into `recv`, consecutively in rank order.
  /// recv_counts must be what exchange_counts returned for these send_counts.
  virtual void all_to_all(const float* send, const std::size_t* send_counts /*[size] host*/,
                          float* recv, const std::size_t* recv_counts /*[size] host*/) = 0;
};

}  // namespace cedar
