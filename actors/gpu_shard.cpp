// KV in device memory for a GPU shard, and the GPU model as its step_model (see gpu_shard.hpp).
#ifdef CEDAR_HAVE_CUDA

#include "actors/gpu_shard.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include "actors/errors.hpp"
#include "actors/sampler.hpp"
#include "kernels/collectives/nccl.hpp"
#include "kernels/cuda/cuda_ops.hpp"

namespace cedar {
namespace {

constexpr double gib = double(uint64_t(1) << 30);

}  // namespace

gpu_shard_arena::gpu_shard_arena(const kv_layout& layout, const kv_capacity& cap)
    : device_(cuda::current_device()), layout_(layout), cap_(cap),
      tail_bytes_(std::max<std::size_t>(1, layout.tail_floats()) * sizeof(float)) {
  const uint64_t need = device_bytes();
  std::size_t free_b = 0, total_b = 0;
  cuda::memory_info(&free_b, &total_b);
  if (need > free_b)
    throw std::runtime_error("KV of " + std::to_string(cap.num_pages) + " pages and " + std::to_string(cap.num_slots) +
                             " ring slots needs " + std::to_string(need >> 20) + " MiB of device memory, " +
                             std::to_string(free_b >> 20) + " MiB are free");
  const std::size_t page_b = std::size_t(cap.num_pages) * layout.page_bytes;
  const std::size_t ring_b = std::size_t(cap.num_slots) * layout.ring_bytes();
  const std::size_t tail_b = std::size_t(cap.num_slots) * tail_bytes_;
  pages_ = static_cast<uint8_t*>(cuda::device_alloc(page_b));
  rings_ = static_cast<uint8_t*>(cuda::device_alloc(ring_b));
  tails_ = static_cast<uint8_t*>(cuda::device_alloc(tail_b));
  // Zeroed as the host arena's first use zeroes its memory.
  cuda::fill_bytes(pages_, 0, page_b);
  cuda::fill_bytes(rings_, 0, ring_b);
  cuda::fill_bytes(tails_, 0, tail_b);
  cuda::synchronize();
}

gpu_shard_arena::~gpu_shard_arena() {
  cuda::set_device(device_);
  cuda::device_free(pages_);
  cuda::device_free(rings_);
  cuda::device_free(tails_);
}

uint64_t gpu_shard_arena::device_bytes() const {
  return uint64_t(cap_.num_pages) * layout_.page_bytes + uint64_t(cap_.num_slots) * (layout_.ring_bytes() + tail_bytes_);
}

uint8_t* gpu_shard_arena::page(int32_t id) {
  CEDAR_CHECK(id >= 0 && id < cap_.num_pages);
  return pages_ + std::size_t(id) * layout_.page_bytes;
}

uint8_t* gpu_shard_arena::ring(int32_t slot) {
  CEDAR_CHECK(slot >= 0 && slot < cap_.num_slots);
  return rings_ + std::size_t(slot) * layout_.ring_bytes();
}

float* gpu_shard_arena::tails(int32_t slot) {
  CEDAR_CHECK(slot >= 0 && slot < cap_.num_slots);
  return reinterpret_cast<float*>(tails_ + std::size_t(slot) * tail_bytes_);
}

void gpu_shard_arena::read_page(int32_t id, uint8_t* out) {
  cuda::set_device(device_);
  cuda::copy_to_host(out, page(id), layout_.page_bytes);
}

void gpu_shard_arena::copy_page(int32_t dst_id, kv_arena& src, int32_t src_id) {
  cuda::set_device(device_);
  if (!src.on_device()) {
    cuda::copy_to_device(page(dst_id), src.page(src_id), layout_.page_bytes);
    return;
  }
  cuda::copy_device(page(dst_id), src.page(src_id), layout_.page_bytes);  // peer copy across devices
  cuda::synchronize();
}

gpu_step_model::gpu_step_model(std::shared_ptr<const gpu_model> m, bool verbose, shard_view view,
                               std::unique_ptr<communicator> comm)
    : m_(std::move(m)), verbose_(verbose), view_(view), comm_(std::move(comm)) {
  view_.comm = comm_.get();
  if (view_.size > 1 && comm_ == nullptr) throw std::runtime_error("a multi-GPU layout rank needs a communicator");
}

void gpu_step_model::forward(std::span<forward_item> batch, std::vector<float>& logits) {
  if (!view_.tp_follower()) return m_->forward(batch, logits, nullptr, view());
  const std::size_t rows = drop_logits(batch);
  m_->forward(batch, logits, nullptr, view());
  logits.assign(rows * std::size_t(m_->args().vocab_size), 0.0f);
}

std::vector<sampled_token> gpu_step_model::forward_sample(std::span<forward_item> batch,
                                                          std::span<const sampling_params> params,
                                                          std::span<const int64_t> token_idx) {
  if (view_.tp_follower()) {
    const std::size_t rows = drop_logits(batch);
    std::vector<float> none;
    m_->forward(batch, none, nullptr, view());
    return std::vector<sampled_token>(rows);
  }
  // Top alternatives, structured output's masks and penalties need the host sampler: only those
  // rows' logits come back (CEDAR_GPU_HOST_SAMPLING=batch: every row's, the former form, kept to
  // measure against); the other rows draw on the device.
  static const bool whole_batch = [] {
    const char* v = std::getenv("CEDAR_GPU_HOST_SAMPLING");
    return v && std::string_view(v) == "batch";
  }();
  std::vector<int> host_rows;
  std::vector<cuda::sample_request> requests;
  for (std::size_t i = 0; i < params.size(); ++i) {
    requests.push_back({params[i].temperature, params[i].top_k, params[i].top_p, params[i].seed, token_idx[i]});
    if (params[i].host_only()) {
      host_rows.push_back(int(i));
      requests.back().temperature = 0;  // greedy on the device, redrawn on the host below
    }
  }
  if (whole_batch && !host_rows.empty()) return step_model::forward_sample(batch, params, token_idx);
  std::vector<int32_t> ids;
  std::vector<float> logprobs, host_logits;
  m_->forward_sample(batch, requests, ids, logprobs, nullptr, view(), host_rows, &host_logits);
  std::vector<sampled_token> out(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) out[i].token_id = ids[i], out[i].logprob = logprobs[i];
  const std::size_t vocab = std::size_t(m_->args().vocab_size);
  for (std::size_t h = 0; h < host_rows.size(); ++h) {
    const auto row = std::size_t(host_rows[h]);
    out[row] = sample(std::span<const float>(host_logits).subspan(h * vocab, vocab), params[row], token_idx[row]);
  }
  return out;
}

std::unique_ptr<kv_arena> gpu_step_model::make_arena(const kv_capacity& cap) const {
  cuda::set_device(m_->device());
  auto arena = std::make_unique<gpu_shard_arena>(m_->layout(), cap);
  if (verbose_) {
    const kv_layout& l = m_->layout();
    std::size_t free_b = 0, total_b = 0;
    cuda::memory_info(&free_b, &total_b);
    std::fprintf(stderr,
                 "cedar: KV on the device: %d pages of %d tokens (%.2f GiB, %lld tokens) + %d ring slots "
                 "(%.3f GiB); %.2f GiB of the device's %.2f GiB left free\n",
                 cap.num_pages, l.page_tokens, double(cap.num_pages) * double(l.page_bytes) / gib,
                 (long long)cap.num_pages * l.page_tokens, cap.num_slots,
                 double(arena->device_bytes() - uint64_t(cap.num_pages) * l.page_bytes) / gib, double(free_b) / gib,
                 double(total_b) / gib);
  }
  return arena;
}

namespace {

class gpu_rank_source final : public rank_source {
 public:
  gpu_rank_source(std::vector<std::shared_ptr<const gpu_model>> models, bool verbose)
      : models_(std::move(models)), verbose_(verbose) {
    if (models_.empty()) throw std::runtime_error("a GPU rank source needs a model");
    for (std::size_t r = 0; r < models_.size(); ++r)
      if (models_[r]->placement().rank != int(r) || models_[r]->placement().size != int(models_.size()))
        throw std::runtime_error("GPU model " + std::to_string(r) + " is not placed as rank " + std::to_string(r) +
                                 " of " + std::to_string(models_.size()));
  }
  const model_args& args() const override { return models_[0]->args(); }
  const kv_layout& layout() const override { return models_[0]->layout(); }
  std::string check(const layout_spec& spec) const override {
    const int n = int(models_.size());
    if (spec.num_shards == n) return {};
    return "the GPU models are placed for " + std::to_string(n) + " device" + (n > 1 ? "s" : "") + ": " +
           (n == 1 ? "tp1" : "tp" + std::to_string(n) + " or dep" + std::to_string(n)) + " only";
  }
  layout_ranks make(const layout_spec& spec, int first, std::chrono::milliseconds) override {
    if (const std::string why = check(spec); !why.empty()) throw std::runtime_error(why);
    const int n = spec.num_shards;
    std::vector<std::unique_ptr<communicator>> comms(n);
    if (n > 1) {
      std::vector<int> devices;
      for (const auto& m : models_) devices.push_back(m->device());
      comms = make_gpu_group(devices);
    }
    layout_ranks out;
    for (int r = first; r < n; ++r) {
      const shard_view view = make_shard_view(args(), spec.mode, r, n, comms[r].get());
      out.models.push_back(std::make_unique<gpu_step_model>(models_[r], verbose_, view, std::move(comms[r])));
    }
    return out;
  }

 private:
  std::vector<std::shared_ptr<const gpu_model>> models_;
  bool verbose_ = false;
};

}  // namespace

std::shared_ptr<rank_source> make_gpu_rank_source(std::vector<std::shared_ptr<const gpu_model>> models, bool verbose) {
  return std::make_shared<gpu_rank_source>(std::move(models), verbose);
}

std::vector<std::string> on_rank_threads(int n, const std::function<void(int rank)>& fn) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  return errors;
}

std::vector<std::unique_ptr<communicator>> make_gpu_group(const std::vector<int>& devices) {
  const int n = int(devices.size());
  std::vector<std::unique_ptr<communicator>> comms(n);
  if (n == 0) return comms;
  const nccl_group_id id = nccl_make_group_id();
  const std::vector<std::string> errors =
      on_rank_threads(n, [&](int r) { comms[r] = make_nccl_communicator(id, r, n, devices[r]); });
  for (int r = 0; r < n; ++r)
    if (!errors[r].empty())
      throw collective_error("rank " + std::to_string(r) + " on device " + std::to_string(devices[r]) + ": " +
                             errors[r]);
  return comms;
}

}  // namespace cedar

#endif  // CEDAR_HAVE_CUDA
