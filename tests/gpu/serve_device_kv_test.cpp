// The GPU model served through the engine with its KV in device memory (actors/gpu_shard.hpp),
// against the CPU engine on micro (random weights): greedy prompts give the same tokens,
// including one that hits the prefix cache and a request cancelled mid-stream, and afterwards no
// page or ring slot is held. Also: page copies between host and device arenas (the re-homing
// path) keep every byte, and the pinned host-to-device copy rate (the weight upload's ceiling).
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>

#include "actors/engine.hpp"
#include "actors/gpu_shard.hpp"
#include "config/model_config.hpp"
#include "kernels/model/random_weights.hpp"
#include "tests/gpu/gpu_test_util.hpp"
#include "tests/gpu/preset_weights.hpp"

using namespace cedar;

namespace {

/// Collects every request's tokens and its last batch.
struct collector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, token_batch> last;

  token_callback callback() {
    return [this](const token_batch& b) {
      std::lock_guard<std::mutex> lock(mu);
      auto& v = tokens[b.request_id];
      v.insert(v.end(), b.ids.begin(), b.ids.end());
      if (b.finished) last[b.request_id] = b;
      cv.notify_all();
    };
  }
  void wait_done(uint64_t id) {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return last.count(id) > 0; }));
  }
  void wait_tokens(uint64_t id, std::size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return tokens[id].size() >= n || last.count(id); }));
  }
};

const gpu_test::preset_weights& micro() { return gpu_test::random_preset("micro", 1234); }

engine_options serve_options() {
  engine_options o;
  o.max_num_seqs = 4;
  o.max_batched_tokens = 512;
  o.max_prefill_tokens_per_request = 128;
  o.kv_budget_bytes = 16 << 20;
  return o;
}

std::vector<int32_t> random_prompt(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = int32_t(3 + g() % 20000);
  return p;
}

/// One finished request: its tokens, why it ended and the prompt tokens the cache served.
struct answer {
  std::vector<int32_t> tokens;
  std::string finish_reason;
  int64_t cached_tokens = 0;
};

answer run_one(engine& e, const request_spec& spec) {
  collector c;
  const uint64_t id = e.submit(spec, c.callback()).value();
  c.wait_done(id);
  return {c.tokens[id], c.last[id].finish_reason, c.last[id].usage.cached_prompt_tokens};
}

/// The greedy prompts: a 300-token prompt, a short one, then the first one's 280 tokens and a
/// new tail (its first 256 tokens, whole pages of 64 or 256, come from the prefix cache).
std::vector<request_spec> prompts() {
  std::vector<request_spec> out;
  const auto long_prompt = random_prompt(300, 1);
  for (const auto& p : {long_prompt, random_prompt(19, 2)}) {
    request_spec s;
    s.prompt = p;
    s.max_tokens = 12;
    s.ignore_eos = true;
    out.push_back(s);
  }
  request_spec hit = out[0];
  hit.prompt.resize(280);
  const auto tail = random_prompt(30, 3);
  hit.prompt.insert(hit.prompt.end(), tail.begin(), tail.end());
  out.push_back(hit);
  return out;
}

}  // namespace

TEST_CASE("gpu serve: the engine on the GPU shard with device KV gives the CPU engine's tokens (micro)") {
  if (!gpu_test::have_gpu()) return;
  const gpu_test::preset_weights& m = micro();
  const engine_options o = serve_options();
  auto gpu = engine::start(std::make_unique<gpu_step_model>(std::make_unique<gpu_model>(m.args, m.weights), false), o);
  REQUIRE_MESSAGE(gpu.ok(), gpu.error().message);
  auto cpu = engine::start(m.args, m.weights, o);
  REQUIRE_MESSAGE(cpu.ok(), cpu.error().message);

  const auto specs = prompts();
  std::vector<answer> on_gpu, on_cpu;
  for (const request_spec& s : specs) on_gpu.push_back(run_one(*gpu.value(), s));
  for (const request_spec& s : specs) on_cpu.push_back(run_one(*cpu.value(), s));
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CAPTURE(i);
    CHECK(on_gpu[i].tokens.size() == 12);
    CHECK(on_gpu[i].tokens == on_cpu[i].tokens);
    CHECK(on_gpu[i].finish_reason == "length");
    CHECK(on_gpu[i].cached_tokens == on_cpu[i].cached_tokens);
  }
  CHECK(on_gpu[2].cached_tokens == 256);  // the third prompt's first 256 tokens came from the cache

  // Cancelled mid-stream: the tokens it got are the first ones the CPU engine gives.
  request_spec long_spec = specs[1];
  long_spec.prompt.push_back(77);
  long_spec.max_tokens = 400;
  collector c;
  const uint64_t id = gpu.value()->submit(long_spec, c.callback()).value();
  c.wait_tokens(id, 3);
  CHECK(gpu.value()->cancel(id).ok());
  c.wait_done(id);
  CHECK(c.last[id].finish_reason == "cancelled");
  const std::vector<int32_t> got = c.tokens[id];
  REQUIRE(!got.empty());
  long_spec.max_tokens = int64_t(got.size());
  CHECK(run_one(*cpu.value(), long_spec).tokens == got);

  const metrics_snapshot after = gpu.value()->metrics();
  CHECK(after.requests_running == 0);
  CHECK(after.pages_used == 0);
  CHECK(after.ring_slots_used == 0);
  CHECK(after.pages_free + after.pages_cached_idle == after.pages_total);
  std::printf("  gpu serve: %zu prompts + 1 cancelled after %zu tokens equal the CPU engine; %lld pages, "
              "%lld free + %lld cached idle afterwards\n",
              specs.size(), got.size(), (long long)after.pages_total, (long long)after.pages_free,
              (long long)after.pages_cached_idle);
}

TEST_CASE("gpu serve: page copies between host and device arenas keep the bytes") {
  if (!gpu_test::have_gpu()) return;
  const kv_layout layout = kv_layout::make(micro().args, kv_dtype::fp4);
  const kv_capacity cap = plan_kv_capacity(layout, int64_t(layout.page_bytes) * 4 + 2 * int64_t(64 << 10), 2);
  REQUIRE(cap.num_pages >= 3);
  host_kv_arena host(layout, cap), back(layout, cap);
  gpu_shard_arena dev_a(layout, cap), dev_b(layout, cap);
  std::mt19937 g(5);
  for (std::size_t i = 0; i < layout.page_bytes; ++i) host.page(1)[i] = uint8_t(g());
  dev_a.copy_page(2, host, 1);   // host -> device
  dev_b.copy_page(0, dev_a, 2);  // device -> device
  dev_a.copy_page(0, dev_a, 2);  // within one arena
  back.copy_page(2, dev_b, 0);   // device -> host
  std::vector<uint8_t> read(layout.page_bytes);
  dev_a.read_page(0, read.data());
  CHECK(std::memcmp(back.page(2), host.page(1), layout.page_bytes) == 0);
  CHECK(std::memcmp(read.data(), host.page(1), layout.page_bytes) == 0);
  dev_a.read_page(1, read.data());  // untouched pages start zeroed
  CHECK(std::all_of(read.begin(), read.end(), [](uint8_t b) { return b == 0; }));
}

TEST_CASE("gpu serve: pinned and pageable host-to-device copy rates (the weight upload's ceiling)") {
  if (!gpu_test::have_gpu()) return;
  const std::size_t bytes = std::size_t(1) << 30;
  void *pinned = nullptr, *dev = nullptr;
  REQUIRE(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault) == cudaSuccess);
  REQUIRE(cudaMalloc(&dev, bytes) == cudaSuccess);
  std::vector<uint8_t> pageable(bytes, 1);
  std::memset(pinned, 1, bytes);
  const auto best_gbs = [&](const void* src) {
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      REQUIRE(cudaMemcpy(dev, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, double(bytes) / 1e9 / s);
    }
    return best;
  };
  const double pinned_gbs = best_gbs(pinned), pageable_gbs = best_gbs(pageable.data());
  std::printf("  host -> device, 1 GiB cudaMemcpy, best of 3: pinned %.1f GB/s, pageable %.1f GB/s\n", pinned_gbs,
              pageable_gbs);
  CHECK(pinned_gbs > 1.0);
  cudaFree(dev);
  cudaFreeHost(pinned);
}
