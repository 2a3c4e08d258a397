// Which data-parallel group serves a request (DEP-N has N schedulers, each with its own KV):
// a session stays on the group that holds its KV (affinity), new sessions go to the group
// with the fewest live sessions, requests without a session to the group with the least work.
// Plain C++, owned by the runtime actor's thread.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace cedar {

class session_router {
 public:
  explicit session_router(int num_groups = 1);

  /// The group of `session_id` (assigned on first use, balanced by live sessions); for
  /// session 0, the group with the least `load` (ties to the lowest group).
  int route(uint64_t session_id, const std::vector<int64_t>& load);
  /// Where the session lives now, or -1.
  int group_of(uint64_t session_id) const;
  void forget(uint64_t session_id);
  /// A new layout with `num_groups` groups: sessions are dealt out again, balanced, in
  /// session order (their KV moves with them).
  void regroup(int num_groups);

  int num_groups() const { return int(sessions_per_group_.size()); }
  const std::vector<int>& sessions_per_group() const { return sessions_per_group_; }

 private:
  std::map<uint64_t, int> group_;
  std::vector<int> sessions_per_group_;
};

}  // namespace cedar
