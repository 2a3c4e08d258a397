// Prefix cache over global-KV pages: a chained hash per full page (hash of the previous
// page's hash and this page's token ids) maps to the page holding that prefix's KV. Only
// global KV is cached, never SWA (rings are rebuilt by replay). Token ids are re-checked on a
// hit. Idle pages are evicted LRU, pages no live session used before pages of live ones (a page
// counts as live while any open session that published or hit it stays open). Every publish and
// hit stamps a chain's pages tail first, so a page is always older than its parent and eviction
// takes a chain from its tail: an evicted page never cuts a cached prefix off its root. A page
// is cached only below its cached parent, and a page is evicted only with the cached pages below
// it (which happens only when nothing else is idle), so a cached page is always reachable.
// Plain C++, owned by the scheduler's thread, together with the kv_pool it marks pages in.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "actors/kv_pool.hpp"
#include "actors/transfer.hpp"

namespace cedar {

class prefix_cache {
 public:
  prefix_cache(int page_tokens, kv_pool& pool);

  /// Longest cached run of full pages that prefixes `tokens`, at most `max_pages` pages. Each
  /// returned page is retained once for the caller (release it through the pool). Counts
  /// `tokens.size()` queried and the hit's tokens in the hit-rate counters when `count`.
  std::vector<int32_t> lookup(std::span<const int32_t> tokens, int64_t max_pages, uint64_t session_id,
                              bool count = true);

  /// Marks the cached run of full pages that prefixes `tokens` as used now (the newest in the
  /// LRU order), without retaining or counting anything.
  void touch_prefix(std::span<const int32_t> tokens, uint64_t session_id);

  /// What lookup() would hit, without retaining, stamping or counting anything.
  struct peek_result {
    int64_t pages = 0;       ///< hit pages
    int64_t idle_pages = 0;  ///< of those, referenced by no request (taking them uses idle KV)
  };
  peek_result peek(std::span<const int32_t> tokens, int64_t max_pages) const;

  /// Registers full pages [0, num_full_pages) of a request whose KV is computed: page i
  /// holds tokens[i*P, (i+1)*P). Pages already cached (or whose prefix is cached on another
  /// page) are left as they are. Does not change ref counts.
  void publish(std::span<const int32_t> tokens, std::span<const int32_t> page_ids, int64_t num_full_pages,
               uint64_t session_id);

  /// Frees one idle cached page (pages of no live session first, then least recently used; a
  /// chain's tail before its parent). A page that cached pages held by running requests extend
  /// goes last, and takes them out of the cache (they free when released). False when no
  /// cached page is idle.
  bool evict_one();

  void session_opened(uint64_t session_id);
  /// The pages only this session kept live become evictable ahead of live sessions' pages.
  void session_closed(uint64_t session_id);

  /// Every chain from the root to a cached page no other cached page extends, most recently
  /// used first (prefix_cache_export.cpp). Chains whose root was evicted are left out.
  std::vector<page_chain> export_chains() const;

  int64_t num_cached_pages() const { return int64_t(entries_.size()); }
  int64_t queried_tokens() const { return queried_tokens_; }
  int64_t hit_tokens() const { return hit_tokens_; }
  double hit_rate() const { return queried_tokens_ ? double(hit_tokens_) / queried_tokens_ : 0.0; }

 private:
  struct entry {
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    std::vector<int32_t> tokens;  ///< the page's token ids, re-checked on a hit
    std::vector<uint64_t> sessions;  ///< open sessions that published or hit it
    uint64_t last_session = 0;       ///< the last session that used it (exported with its chain)
    uint64_t last_use = 0;
    std::vector<int32_t> children;   ///< cached pages whose parent is this page
  };
  using lru_key = std::tuple<bool, uint64_t, int32_t>;  ///< (any session live, last use, page)

  static lru_key key_of(int32_t page_id, const entry& e);
  /// The cached pages that prefix `tokens` (at most max_pages), in order.
  std::vector<int32_t> hit_pages(std::span<const int32_t> tokens, int64_t max_pages) const;
  /// Stamps the page `stamp` and records `session_id` as a user of it.
  void touch(int32_t page_id, uint64_t session_id, uint64_t stamp);
  void add_user(int32_t page_id, entry& e, uint64_t session_id);
  /// Takes the page and every cached page below it out of the cache.
  void drop(int32_t page_id);
  static uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens);

  int page_tokens_;
  kv_pool& pool_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::unordered_map<int32_t, entry> entries_;
  std::set<lru_key> lru_;  ///< every cached page, evictable ones found by ref count
  std::unordered_set<uint64_t> live_sessions_;
  std::unordered_map<uint64_t, std::set<int32_t>> session_pages_;  ///< live sessions only
  uint64_t clock_ = 0;
  int64_t queried_tokens_ = 0;
  int64_t hit_tokens_ = 0;
};

}  // namespace cedar
