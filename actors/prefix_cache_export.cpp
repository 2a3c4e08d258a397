// The prefix cache's chains for another scheduler (see prefix_cache.hpp, transfer.hpp).
#include <algorithm>
#include <unordered_set>

#include "actors/prefix_cache.hpp"

namespace cedar {

std::vector<page_chain> prefix_cache::export_chains() const {
  std::unordered_set<uint64_t> parents;
  for (const auto& [page, e] : entries_) parents.insert(e.parent_hash);
  std::vector<std::pair<uint64_t, int32_t>> leaves;  // (last use, page)
  for (const auto& [page, e] : entries_)
    if (!parents.count(e.hash)) leaves.push_back({e.last_use, page});
  std::sort(leaves.rbegin(), leaves.rend());
  std::vector<page_chain> out;
  for (const auto& [use, leaf] : leaves) {
    std::vector<int32_t> path{leaf};  // leaf to root
    while (entries_.at(path.back()).parent_hash != 0) {
      auto it = by_hash_.find(entries_.at(path.back()).parent_hash);
      if (it == by_hash_.end()) break;
      path.push_back(it->second);
    }
    if (entries_.at(path.back()).parent_hash != 0) continue;  // the root was evicted
    page_chain c;
    c.session_id = entries_.at(leaf).last_session;
    for (auto p = path.rbegin(); p != path.rend(); ++p) {
      const entry& e = entries_.at(*p);
      c.tokens.insert(c.tokens.end(), e.tokens.begin(), e.tokens.end());
      c.page_ids.push_back(*p);
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace cedar
