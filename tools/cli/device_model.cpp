// The model commands' devices (see device_model.hpp): CPU model, GPU model, and the GPU model
// as a shard's step_model.
#include "tools/cli/device_model.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "actors/shard.hpp"
#include "config/model_config.hpp"
#include "kernels/checkpoint/safetensors.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/model/inventory.hpp"
#include "kernels/model/random_weights.hpp"
#include "tools/cli/model_source.hpp"

#ifdef CEDAR_HAVE_CUDA
#include "actors/gpu_shard.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda_model/gpu_model.hpp"
#endif

namespace cedar::cli {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

constexpr double gib = double(uint64_t(1) << 30);

/// Prints a "<what>: X GiB of Y GiB" line to stderr each time `done` crosses another tenth of
/// `total` (every byte is counted in both).
struct tenths_printer {
  const char* what;
  clock_type::time_point t0 = clock_type::now();
  uint64_t printed = 0;
  void operator()(uint64_t done, uint64_t total) {
    const uint64_t tenth = done * 10 / std::max<uint64_t>(1, total);
    if (tenth <= printed) return;
    printed = tenth;
    std::fprintf(stderr, "cedar: %s: %.2f GiB of %.2f GiB, %.1f s\n", what, double(done) / gib, double(total) / gib,
                 seconds_since(t0));
  }
};

class cpu_cli_model final : public cli_model {
 public:
  explicit cpu_cli_model(std::unique_ptr<model> m) : m_(std::move(m)) {}
  const model_args& args() const override { return m_->args(); }
  const kv_layout& layout() const override { return m_->layout(); }
  void forward(std::span<forward_item> batch, std::vector<float>& logits) override { m_->forward(batch, logits); }
  std::shared_ptr<request_kv> new_request(int64_t max_tokens) override {
    auto req = std::make_shared<owned_request>(m_->layout(), max_tokens);
    return std::shared_ptr<request_kv>(req, &req->kv);
  }

 private:
  std::unique_ptr<model> m_;
};

#ifdef CEDAR_HAVE_CUDA

std::unique_ptr<gpu_model> upload(const model_args& args, std::shared_ptr<const tensor_map> weights, kv_dtype dtype,
                                  int page_tokens, gpu_kernels kernels, bool dense_bf16, bool verbose,
                                  gpu_placement placement = {}) {
  const auto t0 = clock_type::now();
  tenths_printer print{"upload to the device"};
  std::optional<clock_type::time_point> first_copy;  // the host-side binding is done by then
  const upload_progress_fn progress = [&](uint64_t done, uint64_t total) {
    if (!first_copy) first_copy = clock_type::now();
    if (verbose) print(done, total);
  };
  auto m = std::make_unique<gpu_model>(args, std::move(weights), dtype, progress, kernels, dense_bf16, placement,
                                       page_tokens);
  const double s = seconds_since(t0);
  const double prepare_s = first_copy ? std::chrono::duration<double>(*first_copy - t0).count() : 0.0;
  const double copy_s = std::max(s - prepare_s, 1e-9);
  if (verbose)
    std::fprintf(stderr,
                 "cedar: %.2f GiB of weights on the device in %.1f s (binding on the host %.1f s, copies %.2f s "
                 "= %.1f GB/s) (%s)\n",
                 double(m->weight_bytes()) / gib, s, prepare_s, copy_s, double(m->weight_bytes()) / 1e9 / copy_s,
                 cuda::status().c_str());
  if (verbose && m->host_weight_bytes() > 0)
    std::fprintf(stderr, "cedar: %.2f GiB of Engram tables in pinned host memory, read over the bus\n",
                 double(m->host_weight_bytes()) / gib);
  return m;
}

class gpu_cli_model final : public cli_model {
 public:
  explicit gpu_cli_model(std::unique_ptr<gpu_model> m) : m_(std::move(m)) {}
  const model_args& args() const override { return m_->args(); }
  const kv_layout& layout() const override { return m_->layout(); }
  void forward(std::span<forward_item> batch, std::vector<float>& logits) override { m_->forward(batch, logits); }
  std::shared_ptr<request_kv> new_request(int64_t max_tokens) override {
    // One arena per request, sized for it: the CLI runs one request at a time.
    const kv_layout& l = m_->layout();
    std::size_t free_b = 0, total_b = 0;
    cuda::memory_info(&free_b, &total_b);
    const double need = double(max_tokens / l.page_tokens + 1) * double(l.page_bytes);
    auto arena = std::make_shared<gpu_kv_arena>(l, (need + 0.5 * double(l.page_bytes)) / double(std::max<std::size_t>(1, free_b)));
    auto kv = arena->allocate(max_tokens);
    if (!kv) throw std::runtime_error("not enough device memory for the KV of " + std::to_string(max_tokens) + " tokens");
    auto held = std::make_shared<request_kv>(std::move(*kv));
    return std::shared_ptr<request_kv>(held.get(), [arena, held](request_kv* p) { arena->release(*p); });
  }

 private:
  std::unique_ptr<gpu_model> m_;
};

#endif  // CEDAR_HAVE_CUDA

}  // namespace

std::optional<device_kind> parse_device(const std::string& text) {
  if (text == "cpu") return device_kind::cpu;
  if (text == "cuda") return device_kind::cuda;
  return std::nullopt;
}

std::optional<gpu_kernels> parse_gpu_kernels(const std::string& text) {
  if (text == "exact") return gpu_kernels::exact;
  if (text == "fast") return gpu_kernels::fast;
  return std::nullopt;
}

std::string device_unavailable(device_kind device) {
  if (device == device_kind::cpu) return {};
#ifdef CEDAR_HAVE_CUDA
  if (cuda::available()) return {};
  return "--device cuda: " + cuda::status();
#else
  return "--device cuda: cedar was built without CUDA (rebuild with nvcc present or -DCEDAR_CUDA=ON)";
#endif
}

std::shared_ptr<const tensor_map> load_weights(const std::string& dir_or_preset, const model_args& args,
                                               uint64_t seed, bool verbose, std::string* error) {
  const auto t0 = clock_type::now();
  auto weights = std::make_shared<tensor_map>();
  std::error_code ec;
  if (std::filesystem::is_directory(dir_or_preset, ec)) {
    if (!read_safetensors(dir_or_preset, *weights, error)) return nullptr;
    const auto problems = check_tensors(args, *weights);
    if (!problems.empty()) {
      *error = "checkpoint " + dir_or_preset + " does not match its config.json:" + list_problems(problems);
      return nullptr;
    }
    if (verbose) std::fprintf(stderr, "cedar: opened %s in %.1f s\n", dir_or_preset.c_str(), seconds_since(t0));
    return weights;
  }
  tenths_printer print{"random weights"};
  progress_fn progress;
  if (verbose) progress = [&](uint64_t done, uint64_t total) { print(done, total); };
  *weights = make_random_weights(args, seed, progress);
  if (verbose)
    std::fprintf(stderr, "cedar: random weights for %s (seed %llu) generated in host memory in %.1f s\n",
                 dir_or_preset.c_str(), static_cast<unsigned long long>(seed), seconds_since(t0));
  return weights;
}

std::unique_ptr<cli_model> open_cli_model(const std::string& dir_or_preset, uint64_t seed, kv_dtype dtype,
                                          device_kind device, gpu_kernels kernels, bool dense_bf16, bool verbose,
                                          std::string* error) {
  if (device == device_kind::cpu) {
    auto m = open_model(dir_or_preset, seed, dtype, error, default_page_tokens, verbose);
    if (!m) return nullptr;
    return std::make_unique<cpu_cli_model>(std::move(m));
  }
  if (std::string why = device_unavailable(device); !why.empty()) {
    *error = why;
    return nullptr;
  }
#ifdef CEDAR_HAVE_CUDA
  auto args = load_serving_args(dir_or_preset, error);
  if (!args) return nullptr;
  auto weights = load_weights(dir_or_preset, *args, seed, verbose, error);
  if (!weights) return nullptr;
  try {
    return std::make_unique<gpu_cli_model>(
        upload(*args, std::move(weights), dtype, default_page_tokens, kernels, dense_bf16, verbose));
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
#else
  (void)kernels, (void)dense_bf16;
  return nullptr;
#endif
}

std::unique_ptr<step_model> make_gpu_step_model(const model_args& args, std::shared_ptr<const tensor_map> weights,
                                                kv_dtype dtype, int page_tokens, gpu_kernels kernels, bool dense_bf16,
                                                bool verbose, std::string* error) {
  if (std::string why = device_unavailable(device_kind::cuda); !why.empty()) {
    *error = why;
    return nullptr;
  }
#ifdef CEDAR_HAVE_CUDA
  try {
    return std::make_unique<gpu_step_model>(
        upload(args, std::move(weights), dtype, page_tokens, kernels, dense_bf16, verbose), verbose);
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
#else
  (void)args, (void)weights, (void)dtype, (void)page_tokens, (void)kernels, (void)dense_bf16, (void)verbose;
  return nullptr;
#endif
}

std::shared_ptr<rank_source> make_gpu_layout_source(const model_args& args, std::shared_ptr<const tensor_map> weights,
                                                    kv_dtype dtype, int page_tokens, gpu_kernels kernels,
                                                    bool dense_bf16, int size, bool verbose, std::string* error) {
  if (std::string why = device_unavailable(device_kind::cuda); !why.empty()) {
    *error = why;
    return nullptr;
  }
#ifdef CEDAR_HAVE_CUDA
  if (cuda::device_count() < size) {
    const int have = cuda::device_count();
    *error = "a " + std::to_string(size) + "-rank layout needs " + std::to_string(size) + " CUDA devices; " +
             (have == 1 ? std::string("only one is present") : std::to_string(have) + " are present");
    return nullptr;
  }
  if (size > 1 && kernels != gpu_kernels::fast) {
    *error = "multi-GPU layouts run the fast kernel set (--gpu-kernels fast)";
    return nullptr;
  }
  // every rank's weights at once, each from its own thread onto its own device
  std::vector<std::shared_ptr<const gpu_model>> models(size);
  const std::vector<std::string> errors = on_rank_threads(size, [&](int r) {
    cuda::set_device(r);
    models[r] =
        upload(args, weights, dtype, page_tokens, kernels, dense_bf16, verbose && r == 0, gpu_placement{r, size});
  });
  for (int r = 0; r < size; ++r)
    if (!errors[r].empty()) {
      *error = "device " + std::to_string(r) + ": " + errors[r];
      return nullptr;
    }
  return make_gpu_rank_source(std::move(models), verbose);
#else
  (void)args, (void)weights, (void)dtype, (void)page_tokens, (void)kernels, (void)dense_bf16, (void)size,
      (void)verbose;
  return nullptr;
#endif
}

void select_gpu(int device) {
#ifdef CEDAR_HAVE_CUDA
  cuda::set_device(device);
#else
  (void)device;
#endif
}

void set_gpu_batch_invariant(bool on) {
#ifdef CEDAR_HAVE_CUDA
  cuda::fast::set_batch_invariant(on);
#else
  (void)on;
#endif
}

std::optional<int64_t> gpu_kv_budget(const kv_layout& layout, double fraction, int64_t budget_bytes, int max_num_seqs,
                                     int64_t reserve_bytes, bool verbose, std::string* error) {
#ifdef CEDAR_HAVE_CUDA
  std::size_t free_b = 0, total_b = 0;
  cuda::memory_info(&free_b, &total_b);
  const auto gib_text = [](double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / gib);
    return std::string(buf);
  };
  const std::string free_text = gib_text(double(free_b)) + " of the device's " + gib_text(double(total_b)) +
                                " are free after the weights, " + gib_text(double(reserve_bytes)) +
                                " of them kept for a step's activations (--max-batched-tokens)";
  char fraction_text[48];
  std::snprintf(fraction_text, sizeof fraction_text, "--gpu-memory-fraction %.2f", fraction);
  if (!(fraction > 0 && fraction <= 1)) {
    *error = "--gpu-memory-fraction must be in (0, 1]";
    return std::nullopt;
  }
  const int64_t usable = int64_t(free_b) - reserve_bytes;
  if (usable <= 0) {
    *error = "no device memory left for KV: " + free_text + "; lower --max-batched-tokens";
    return std::nullopt;
  }
  const bool given = budget_bytes > 0;
  if (!given) budget_bytes = int64_t(double(usable) * fraction);
  if (given && budget_bytes > usable) {
    *error = "--kv-budget-bytes " + std::to_string(budget_bytes) + " does not fit on the device: " + free_text;
    return std::nullopt;
  }
  const kv_capacity cap = plan_kv_capacity(layout, budget_bytes, max_num_seqs);
  if (cap.num_pages < 1 || cap.num_slots < 1) {
    *error = "the KV budget of " + gib_text(double(budget_bytes)) + " (" +
             (given ? "--kv-budget-bytes" : fraction_text) +
             ") holds no KV page (" + std::to_string(cap.page_bytes) + " B) and ring slot (" +
             std::to_string(cap.slot_bytes) + " B): " + free_text;
    return std::nullopt;
  }
  if (verbose)
    std::fprintf(stderr, "cedar: KV budget %s (%s): %s\n", gib_text(double(budget_bytes)).c_str(),
                 given ? "--kv-budget-bytes" : fraction_text,
                 free_text.c_str());
  return budget_bytes;
#else
  (void)layout, (void)fraction, (void)budget_bytes, (void)max_num_seqs, (void)reserve_bytes, (void)verbose;
  *error = device_unavailable(device_kind::cuda);
  return std::nullopt;
#endif
}

}  // namespace cedar::cli
