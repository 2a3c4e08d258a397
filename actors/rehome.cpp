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
  for (const rehome_source& src : from) {
    for (const page_chain& chain : src.policy->cached_chains()) {
      if (!src.arena) {
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
        for (kv_arena* a : dst.arenas) a->copy_page(got.page_ids[i], *src.arena, chain.page_ids[got.first + i]);
        ++stats.pages_copied;
      }
      if (got.first + got.page_ids.size() < chain.page_ids.size()) ++stats.chains_dropped;
    }
  }
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
