// Device KV memory (gpu_model.hpp): global-KV pages carved from one allocation sized from a
// fraction of the free device memory, plus a ring and tails per request.
#ifdef CEDAR_HAVE_CUDA

#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda_model/gpu_model.hpp"

namespace cedar {

// ---- KV arena ----------------------------------------------------------------------------------

gpu_kv_arena::gpu_kv_arena(const kv_layout& layout, double memory_fraction) : layout_(layout) {
  std::size_t free_b = 0, total_b = 0;
  cuda::memory_info(&free_b, &total_b);
  const std::size_t want = std::size_t(double(free_b) * std::clamp(memory_fraction, 0.0, 0.95));
  const int64_t pages = int64_t(want / std::max<std::size_t>(1, layout.page_bytes));
  if (pages <= 0) throw std::runtime_error("gpu_kv_arena: no room for one KV page");
  base_ = static_cast<uint8_t*>(cuda::device_alloc(std::size_t(pages) * layout.page_bytes));
  for (int64_t p = pages - 1; p >= 0; --p) free_.push_back(base_ + std::size_t(p) * layout.page_bytes);
}

gpu_kv_arena::~gpu_kv_arena() { cuda::device_free(base_); }

std::optional<request_kv> gpu_kv_arena::allocate(int64_t max_tokens) {
  const int64_t need = max_tokens / layout_.page_tokens + 1;
  if (need > int64_t(free_.size())) return std::nullopt;
  request_kv kv;
  for (int64_t i = 0; i < need; ++i) {
    kv.pages.push_back(free_.back());
    free_.pop_back();
  }
  used_ += need;
  kv.swa_ring = static_cast<uint8_t*>(cuda::device_alloc(layout_.ring_bytes()));
  kv.tails = static_cast<float*>(cuda::device_alloc(layout_.tail_floats() * sizeof(float)));
  cuda::fill_bytes(kv.swa_ring, 0, layout_.ring_bytes());
  cuda::fill_bytes(kv.tails, 0, layout_.tail_floats() * sizeof(float));
  for (uint8_t* p : kv.pages) cuda::fill_bytes(p, 0, layout_.page_bytes);
  cuda::synchronize();
  return kv;
}

void gpu_kv_arena::release(request_kv& kv) {
  for (uint8_t* p : kv.pages) free_.push_back(p);
  used_ -= int64_t(kv.pages.size());
  kv.pages.clear();
  cuda::device_free(kv.swa_ring);
  cuda::device_free(kv.tails);
  kv.swa_ring = nullptr;
  kv.tails = nullptr;
  kv.num_tokens = 0;
}


}  // namespace cedar

#endif  // CEDAR_HAVE_CUDA
