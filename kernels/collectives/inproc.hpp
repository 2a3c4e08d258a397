// The in-process collectives: N ranks are threads of one process sharing an inproc_group.
// Each collective posts the rank's buffers, meets the others at a barrier, and reads its
// peers' buffers directly; sums add ranks in rank order, so results are deterministic.
// A group is aborted when a rank dies (the runtime calls abort) or a barrier times out; every
// waiting and later collective then throws collective_error.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/collectives/communicator.hpp"

namespace cedar {

class inproc_group : public std::enable_shared_from_this<inproc_group> {
 public:
  /// A group of `size` ranks. A collective whose peers do not all arrive within `timeout`
  /// aborts the group.
  static std::shared_ptr<inproc_group> make(int size,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(30));

  /// The communicator of `rank` (call once per rank; it keeps the group alive).
  std::unique_ptr<communicator> join(int rank);
  /// Wakes every waiting rank; this and every later collective throws collective_error(reason).
  void abort(const std::string& reason);
  bool aborted() const;
  int size() const { return size_; }

 private:
  friend class inproc_communicator;
  inproc_group(int size, std::chrono::milliseconds timeout);

  /// What one rank posted for the current collective.
  struct posted {
    const float* send = nullptr;
    float* data = nullptr;
    const std::size_t* counts = nullptr;
  };
  /// Blocks until every rank arrived at this barrier; throws if the group is aborted.
  void arrive_and_wait(int rank);

  int size_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
  std::vector<posted> posted_;  ///< [size], written by each rank before the first barrier
};

}  // namespace cedar
