// What moves between schedulers when the runtime switches layouts or rebuilds after a shard
// failure: each request's tokens and progress (request_transfer), and the prefix cache's
// chains of full global-KV pages (page_chain) whose bytes the runtime copies to the new
// owner. SWA rings never move: a moved request resumes through the prefix cache and replay.
// Plain C++, used on the runtime actor's thread.
#pragma once

#include <cstdint>
#include <vector>

#include "actors/messages.hpp"
#include "actors/request.hpp"

namespace cedar {

/// A request leaving its scheduler: everything but its KV placement (state.without_kv(): no
/// pages, ring slot, computed positions, pending replay or published pages; the new scheduler
/// finds its prefix in the cache and recomputes the rest).
struct request_transfer {
  request_state state;
};

/// Cached full pages of one token prefix: page i holds tokens [i*P, (i+1)*P).
struct page_chain {
  std::vector<int32_t> tokens;    ///< [num pages * P]
  std::vector<int32_t> page_ids;  ///< in the exporting scheduler's pool
  uint64_t session_id = 0;        ///< the session that last used the chain's last page
};

/// Pages a scheduler took for a chain: chain pages [first, first + page_ids.size()) now live
/// in page_ids (the caller copies their bytes); pages before `first` were cached already.
struct adopted_pages {
  int first = 0;
  std::vector<int32_t> page_ids;
};

}  // namespace cedar
