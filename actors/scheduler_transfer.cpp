// Moving requests and cached pages between schedulers (see scheduler.hpp, transfer.hpp):
// what the runtime does when it switches layouts or rebuilds shards.
#include <algorithm>

#include "actors/scheduler.hpp"

namespace cedar {

void scheduler::abandon_step() { in_flight_.reset(); }

std::vector<request_transfer> scheduler::take_requests() {
  CEDAR_CHECK(!in_flight_);
  std::vector<uint64_t> order(running_.begin(), running_.end());
  order.insert(order.end(), waiting_.begin(), waiting_.end());
  std::vector<request_transfer> out;
  for (uint64_t id : order) {
    request_state& r = requests_.at(id);
    request_transfer t;
    t.id = r.id;
    t.spec = std::move(r.spec);
    t.tokens = std::move(r.tokens);
    t.prompt_len = r.prompt_len;
    t.cached_prompt_tokens = r.cached_prompt_tokens;
    t.truncate_below = r.truncate_below;
    t.admitted_once = r.admitted_once;
    t.cancel_requested = r.cancel_requested;
    t.num_preemptions = r.num_preemptions;
    t.submit_time = r.submit_time;
    t.last_token_time = r.last_token_time;
    out.push_back(std::move(t));
  }
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
  request_state r;
  r.id = t.id;
  r.spec = std::move(t.spec);
  r.tokens = std::move(t.tokens);
  r.prompt_len = t.prompt_len;
  r.cached_prompt_tokens = t.cached_prompt_tokens;
  r.truncate_below = t.truncate_below;
  r.admitted_once = t.admitted_once;
  r.cancel_requested = t.cancel_requested;
  r.num_preemptions = t.num_preemptions;
  r.submit_time = t.submit_time;
  r.last_token_time = t.last_token_time;
  const uint64_t id = r.id;
  next_request_id_ = std::max(next_request_id_, id + 1);
  requests_.emplace(id, std::move(r));
  waiting_.push_back(id);
}

}  // namespace cedar
