// Re-homing requests and cached pages between layouts (see rehome.hpp).
#include "actors/rehome.hpp"

namespace cedar {
namespace {

/// The target group of something owned by `session_id`; `next` deals sessionless ones out.
int target_group(session_router& router, uint64_t session_id, std::vector<int64_t>& load) {
  const int g = router.route(session_id, load);
  ++load[g];
  return g;
}

}  // namespace

rehome_stats rehome(const std::vector<rehome_source>& from, const std::vector<rehome_target>& to,
                    const kv_layout& /*layout*/, session_router& router, std::map<uint64_t, int>& request_group) {
  CEDAR_CHECK(router.num_groups() == int(to.size()));
  rehome_stats stats;
  std::vector<int64_t> chain_load(to.size(), 0), request_load(to.size(), 0);
  // Every old group's chains, most recent first, dealt out in turns (the groups' LRU clocks
  // do not compare): when the new groups hold less, each old group keeps its newest chains.
  std::vector<std::vector<page_chain>> chains;
  for (const rehome_source& src : from) chains.push_back(src.policy->cached_chains());
  struct adopted {
    scheduler* policy;
    const page_chain* chain;
  };
  std::vector<adopted> order;
  for (std::size_t rank = 0;; ++rank) {
    bool any = false;
    for (std::size_t s = 0; s < from.size(); ++s) {
      if (rank >= chains[s].size()) continue;
      any = true;
      const page_chain& chain = chains[s][rank];
      if (!from[s].arena) {
        ++stats.chains_dropped;
        continue;
      }
      const rehome_target& dst = to[target_group(router, chain.session_id, chain_load)];
      if (!dst.reachable) {
        ++stats.chains_dropped;
        continue;
      }
      const adopted_pages got = dst.policy->adopt_chain(chain);
      for (std::size_t i = 0; i < got.page_ids.size(); ++i) {
        for (kv_arena* a : dst.arenas) a->copy_page(got.page_ids[i], *from[s].arena, chain.page_ids[got.first + i]);
        ++stats.pages_copied;
      }
      if (got.first + got.page_ids.size() < chain.page_ids.size()) ++stats.chains_dropped;
      order.push_back({dst.policy, &chain});
    }
    if (!any) break;
  }
  // Adopting stamped the oldest chains newest; touching them again oldest first puts the LRU
  // order back, so the next eviction takes what was least recently used before the switch.
  for (auto it = order.rbegin(); it != order.rend(); ++it) it->policy->touch_chain(*it->chain);
  for (const rehome_source& src : from) {
    for (request_transfer& t : src.policy->take_requests()) {
      const int g = target_group(router, t.state.spec.session_id, request_load);
      request_group[t.state.id] = g;
      to[g].policy->adopt_request(std::move(t));
      ++stats.requests_moved;
    }
  }
  return stats;
}

}  // namespace cedar
