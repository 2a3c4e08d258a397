// Session affinity and balancing (see session_router.hpp).
#include "actors/session_router.hpp"

#include <algorithm>

namespace cedar {

session_router::session_router(int num_groups) : sessions_per_group_(std::max(1, num_groups), 0) {}

int session_router::route(uint64_t session_id, const std::vector<int64_t>& load) {
  if (session_id == 0) {
    if (load.empty()) return 0;
    return int(std::min_element(load.begin(), load.end()) - load.begin());
  }
  if (auto it = group_.find(session_id); it != group_.end()) return it->second;
  const int g = int(std::min_element(sessions_per_group_.begin(), sessions_per_group_.end()) -
                    sessions_per_group_.begin());
  group_[session_id] = g;
  ++sessions_per_group_[g];
  return g;
}

int session_router::group_of(uint64_t session_id) const {
  auto it = group_.find(session_id);
  return it == group_.end() ? -1 : it->second;
}

void session_router::forget(uint64_t session_id) {
  auto it = group_.find(session_id);
  if (it == group_.end()) return;
  --sessions_per_group_[it->second];
  group_.erase(it);
}

void session_router::regroup(int num_groups) {
  sessions_per_group_.assign(std::max(1, num_groups), 0);
  int next = 0;
  for (auto& [id, g] : group_) {
    g = next;
    ++sessions_per_group_[g];
    next = (next + 1) % int(sessions_per_group_.size());
  }
}

}  // namespace cedar
