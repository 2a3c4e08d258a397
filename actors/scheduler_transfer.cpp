// Moving requests and cached pages between schedulers (see scheduler.hpp, transfer.hpp):
// what the runtime does when it switches layouts or rebuilds shards.
#include <algorithm>

#include "actors/scheduler.hpp"

namespace cedar {

void scheduler::abandon_step(const std::vector<uint64_t>& failed, const std::string& error) {
  in_flight_.reset();
  for (uint64_t id : failed) finish(requests_.at(id), "error", "shard failed: " + error);
}

std::vector<request_transfer> scheduler::take_requests() {
  CEDAR_CHECK(!in_flight_);
  std::vector<uint64_t> order(running_.begin(), running_.end());
  order.insert(order.end(), waiting_.begin(), waiting_.end());
  std::vector<request_transfer> out;
  for (uint64_t id : order) out.push_back({std::move(requests_.at(id)).without_kv()});
  requests_.clear();
  running_.clear();
  waiting_.clear();
  return out;
}

adopted_pages scheduler::adopt_chain(const page_chain& chain) {
  adopted_pages out;
  const int64_t n = int64_t(chain.page_ids.size());
  if (!options_.prefix_cache || n == 0) return out;
  const std::vector<int32_t> have = cache_.lookup(chain.tokens, n, chain.session_id, false);
  std::vector<int32_t> pages = have;  // held once each until published
  out.first = int(have.size());
  while (int64_t(pages.size()) < n) {
    const int32_t p = pool_.alloc_page();
    if (p < 0) break;
    pages.push_back(p);
    out.page_ids.push_back(p);
  }
  cache_.publish(chain.tokens, pages, int64_t(pages.size()), chain.session_id);
  for (int32_t p : pages) pool_.release(p);  // now idle in the cache
  return out;
}

void scheduler::adopt_request(request_transfer t) {
  request_state r = std::move(t.state).without_kv();
  const uint64_t id = r.id;
  next_request_id_ = std::max(next_request_id_, id + 1);
  requests_.emplace(id, std::move(r));
  waiting_.push_back(id);
}

}  // namespace cedar
