// KV memory accounting for one scheduler: global-KV pages (page_tokens positions of every KV
// source's records), SWA ring slots (one per running request, each with its compressor
// tails), ref counts and free lists, all within a byte budget. Plain C++, owned and touched
// only by the scheduler's thread. The bytes themselves live in a kv_arena of the same capacity.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/model/kv_layout.hpp"

namespace cedar {

/// How a byte budget splits into ring slots and pages.
struct kv_capacity {
  int32_t num_pages = 0;
  int32_t num_slots = 0;
  std::size_t page_bytes = 0;
  std::size_t slot_bytes = 0;   ///< one SWA ring + its compressor tails (fp32)
  int64_t budget_bytes = 0;
};

/// Reserves one slot per allowed running request (fewer if the budget cannot hold them), and
/// gives the rest of the budget to pages.
kv_capacity plan_kv_capacity(const kv_layout& layout, int64_t budget_bytes, int max_num_seqs);

class kv_pool {
 public:
  explicit kv_pool(kv_capacity cap);

  /// A free page with ref count 1, or -1 when none is free (the caller may evict from the
  /// prefix cache and retry).
  int32_t alloc_page();
  /// Adds a reference (a prefix hit, a second holder).
  void retain(int32_t page_id);
  /// Drops a reference. At zero an uncached page returns to the free list; a cached page
  /// stays with the prefix cache (idle, evictable). Returns the new count.
  int32_t release(int32_t page_id);
  /// The prefix cache marks (true) or unmarks (false) a page; unmarking an idle page frees it.
  void set_cached(int32_t page_id, bool cached);

  int32_t ref_count(int32_t page_id) const { return pages_[page_id].refs; }
  bool is_cached(int32_t page_id) const { return pages_[page_id].cached; }

  /// A free ring slot, or -1.
  int32_t alloc_slot();
  void free_slot(int32_t slot);

  const kv_capacity& capacity() const { return cap_; }
  int32_t num_pages_free() const { return int32_t(free_pages_.size()); }
  int32_t num_pages_idle_cached() const { return num_idle_cached_; }
  int32_t num_pages_referenced() const { return cap_.num_pages - num_pages_free() - num_idle_cached_; }
  int32_t num_slots_free() const { return int32_t(free_slots_.size()); }
  int32_t num_slots_used() const { return cap_.num_slots - num_slots_free(); }
  /// Bytes holding live data: every page not on the free list, every slot in use.
  int64_t bytes_in_use() const;

 private:
  struct page_state {
    int32_t refs = 0;
    bool cached = false;
  };
  kv_capacity cap_;
  std::vector<page_state> pages_;
  std::vector<int32_t> free_pages_;  ///< LIFO: recently freed pages are reused first
  std::vector<int32_t> free_slots_;
  int32_t num_idle_cached_ = 0;
};

}  // namespace cedar
