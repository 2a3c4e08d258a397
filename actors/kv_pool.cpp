// Page and ring-slot accounting (see kv_pool.hpp).
#include "actors/kv_pool.hpp"

#include <algorithm>

#include "actors/errors.hpp"

namespace cedar {

kv_capacity plan_kv_capacity(const kv_layout& layout, int64_t budget_bytes, int max_num_seqs) {
  kv_capacity c;
  c.page_bytes = layout.page_bytes;
  c.slot_bytes = layout.ring_bytes() + layout.tail_floats() * sizeof(float);
  c.budget_bytes = budget_bytes;
  const int64_t max_slots = c.slot_bytes ? budget_bytes / int64_t(c.slot_bytes) : max_num_seqs;
  c.num_slots = int32_t(std::min<int64_t>(max_num_seqs, max_slots));
  const int64_t left = budget_bytes - int64_t(c.num_slots) * int64_t(c.slot_bytes);
  c.num_pages = c.page_bytes ? int32_t(std::max<int64_t>(0, left / int64_t(c.page_bytes))) : 0;
  return c;
}

kv_pool::kv_pool(kv_capacity cap) : cap_(cap), pages_(cap.num_pages) {
  for (int32_t p = cap.num_pages - 1; p >= 0; --p) free_pages_.push_back(p);
  for (int32_t s = cap.num_slots - 1; s >= 0; --s) free_slots_.push_back(s);
}

int32_t kv_pool::alloc_page() {
  if (free_pages_.empty()) return -1;
  const int32_t p = free_pages_.back();
  free_pages_.pop_back();
  CEDAR_CHECK(pages_[p].refs == 0 && !pages_[p].cached);
  pages_[p].refs = 1;
  return p;
}

void kv_pool::retain(int32_t p) {
  auto& s = pages_.at(p);
  if (s.refs == 0) {
    CEDAR_CHECK(s.cached);  // only an idle cached page can be revived
    --num_idle_cached_;
  }
  ++s.refs;
}

int32_t kv_pool::release(int32_t p) {
  auto& s = pages_.at(p);
  CEDAR_CHECK(s.refs > 0);
  if (--s.refs == 0) {
    if (s.cached)
      ++num_idle_cached_;
    else
      free_pages_.push_back(p);
  }
  return s.refs;
}

void kv_pool::set_cached(int32_t p, bool cached) {
  auto& s = pages_.at(p);
  if (s.cached == cached) return;
  CEDAR_CHECK(cached ? s.refs > 0 : true);
  s.cached = cached;
  if (!cached && s.refs == 0) {
    --num_idle_cached_;
    free_pages_.push_back(p);
  }
}

int32_t kv_pool::alloc_slot() {
  if (free_slots_.empty()) return -1;
  const int32_t s = free_slots_.back();
  free_slots_.pop_back();
  return s;
}

void kv_pool::free_slot(int32_t s) {
  CEDAR_CHECK(s >= 0 && s < cap_.num_slots);
  CEDAR_CHECK(std::find(free_slots_.begin(), free_slots_.end(), s) == free_slots_.end());
  free_slots_.push_back(s);
}

int64_t kv_pool::bytes_in_use() const {
  return int64_t(cap_.num_pages - num_pages_free()) * int64_t(cap_.page_bytes) +
         int64_t(num_slots_used()) * int64_t(cap_.slot_bytes);
}

}  // namespace cedar
