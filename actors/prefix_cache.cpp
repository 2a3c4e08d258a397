// Chained-hash prefix cache with session-aware LRU eviction (see prefix_cache.hpp).
#include "actors/prefix_cache.hpp"

#include <algorithm>

#include "actors/errors.hpp"

namespace cedar {

prefix_cache::prefix_cache(int page_tokens, kv_pool& pool) : page_tokens_(page_tokens), pool_(pool) {}

uint64_t prefix_cache::chain_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
  for (int32_t t : tokens) {
    h ^= uint64_t(uint32_t(t)) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  }
  return h ^ (h >> 33);
}

prefix_cache::lru_key prefix_cache::key_of(int32_t page_id, const entry& e) {
  return {!e.sessions.empty(), e.last_use, page_id};
}

void prefix_cache::add_user(int32_t page_id, entry& e, uint64_t session_id) {
  if (session_id == 0) return;
  e.last_session = session_id;
  if (!live_sessions_.count(session_id)) return;
  if (std::find(e.sessions.begin(), e.sessions.end(), session_id) != e.sessions.end()) return;
  e.sessions.push_back(session_id);
  session_pages_[session_id].insert(page_id);
}

void prefix_cache::touch(int32_t page_id, uint64_t session_id, uint64_t stamp) {
  entry& e = entries_.at(page_id);
  lru_.erase(key_of(page_id, e));
  add_user(page_id, e, session_id);
  e.last_use = stamp;  // always newer: stamps come from the one clock
  lru_.insert(key_of(page_id, e));
}

std::vector<int32_t> prefix_cache::hit_pages(std::span<const int32_t> tokens, int64_t max_pages) const {
  std::vector<int32_t> hit;
  uint64_t parent = 0;
  for (int64_t i = 0; i < max_pages && (i + 1) * page_tokens_ <= int64_t(tokens.size()); ++i) {
    auto page = tokens.subspan(i * page_tokens_, page_tokens_);
    const uint64_t h = chain_hash(parent, page);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const entry& e = entries_.at(it->second);
    if (e.parent_hash != parent || !std::equal(page.begin(), page.end(), e.tokens.begin())) break;
    hit.push_back(it->second);
    parent = h;
  }
  return hit;
}

void prefix_cache::touch_prefix(std::span<const int32_t> tokens, uint64_t session_id) {
  const std::vector<int32_t> hit = hit_pages(tokens, int64_t(tokens.size()) / page_tokens_);
  for (auto p = hit.rbegin(); p != hit.rend(); ++p) touch(*p, session_id, ++clock_);  // tail first, as lookup
}

prefix_cache::peek_result prefix_cache::peek(std::span<const int32_t> tokens, int64_t max_pages) const {
  peek_result r;
  for (int32_t p : hit_pages(tokens, max_pages)) ++r.pages, r.idle_pages += pool_.ref_count(p) == 0;
  return r;
}

std::vector<int32_t> prefix_cache::lookup(std::span<const int32_t> tokens, int64_t max_pages, uint64_t session_id,
                                          bool count) {
  std::vector<int32_t> hit = hit_pages(tokens, max_pages);
  // tail first: the root gets the newest stamp
  for (auto p = hit.rbegin(); p != hit.rend(); ++p) {
    pool_.retain(*p);
    touch(*p, session_id, ++clock_);
  }
  if (count) {
    queried_tokens_ += int64_t(tokens.size());
    hit_tokens_ += int64_t(hit.size()) * page_tokens_;
  }
  return hit;
}

void prefix_cache::publish(std::span<const int32_t> tokens, std::span<const int32_t> page_ids,
                           int64_t num_full_pages, uint64_t session_id) {
  CEDAR_CHECK(num_full_pages * page_tokens_ <= int64_t(tokens.size()) && num_full_pages <= int64_t(page_ids.size()));
  // Page i is stamped newer than page i+1 (tail first, as lookup does).
  const uint64_t base = clock_;
  clock_ += uint64_t(std::max<int64_t>(num_full_pages, 0));
  uint64_t parent = 0;
  for (int64_t i = 0; i < num_full_pages; ++i) {
    auto page = tokens.subspan(i * page_tokens_, page_tokens_);
    const uint64_t h = chain_hash(parent, page);
    const int32_t p = page_ids[i];
    const uint64_t stamp = base + uint64_t(num_full_pages - i);
    auto it = by_hash_.find(h);
    if (it != by_hash_.end()) {
      touch(it->second, session_id, stamp);  // this prefix, cached here or on another page
    } else if (pool_.is_cached(p)) {
      break;  // the page is cached for another chain: nothing below could be reached
    } else {
      by_hash_.emplace(h, p);
      entry e{h, parent, std::vector<int32_t>(page.begin(), page.end()), {}, 0, stamp, {}};
      add_user(p, e, session_id);
      lru_.insert(key_of(p, e));
      entries_.emplace(p, std::move(e));
      pool_.set_cached(p, true);
      if (parent != 0) entries_.at(by_hash_.at(parent)).children.push_back(p);
    }
    parent = h;
  }
}

bool prefix_cache::evict_one() {
  // An idle page with cached pages below it is a prefix that a running request computed again
  // on a page of its own (both prefilled it at once) while its later pages were cached below
  // this copy: evicting it cuts them off, so it goes only when no other page is idle, and takes
  // them out of the cache with it.
  int32_t extended = -1;
  for (const lru_key& k : lru_) {
    const int32_t p = std::get<2>(k);
    if (pool_.ref_count(p) > 0) continue;
    if (entries_.at(p).children.empty()) {
      drop(p);
      return true;
    }
    if (extended < 0) extended = p;
  }
  if (extended < 0) return false;
  drop(extended);
  return true;
}

void prefix_cache::drop(int32_t page_id) {
  const uint64_t parent = entries_.at(page_id).parent_hash;
  if (parent != 0) std::erase(entries_.at(by_hash_.at(parent)).children, page_id);
  std::vector<int32_t> todo{page_id};
  while (!todo.empty()) {
    const int32_t p = todo.back();
    todo.pop_back();
    const entry& e = entries_.at(p);
    todo.insert(todo.end(), e.children.begin(), e.children.end());
    by_hash_.erase(e.hash);
    for (uint64_t s : e.sessions) session_pages_[s].erase(p);
    lru_.erase(key_of(p, e));
    entries_.erase(p);
    pool_.set_cached(p, false);  // an idle page is free now, a held one once released
  }
}

void prefix_cache::session_opened(uint64_t session_id) {
  if (session_id != 0) live_sessions_.insert(session_id);
}

void prefix_cache::session_closed(uint64_t session_id) {
  if (!live_sessions_.erase(session_id)) return;
  auto pages = session_pages_.find(session_id);
  if (pages == session_pages_.end()) return;
  for (int32_t p : pages->second) {
    entry& e = entries_.at(p);
    lru_.erase(key_of(p, e));
    std::erase(e.sessions, session_id);
    lru_.insert(key_of(p, e));
  }
  session_pages_.erase(pages);
}

}  // namespace cedar
