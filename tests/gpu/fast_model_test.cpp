// The whole GPU model with the fast kernel set (gpu_kernels::fast) against the CPU model, random
// weights, presets micro and tiny: 20 prompts of 3..39 tokens, prefill then 6 greedy decode
// steps, both sides continuing with the CPU's token. Each fast op is bounded on its own
// (fast_linear_test.cpp: linears within 2^-16 of sum|xw|, measured worst ~3e-6 at prefill size);
// the model is not a smooth function of them: a last-bit difference that moves an activation
// across an FP8 rounding point, a KV value across an FP4 one (2^-2 steps), or an indexer score
// across the k-th, changes that value by a whole quantization step, and the random-weight
// presets amplify it through the layers and the KV of later steps. So logits are compared
// relative to the logit scale (max |logit| of the step) and greedy tokens by agreement rate.
// How far is "close"? The test measures it: the same CPU model with ONE FP8 weight code of layer
// 0's wq_a moved by one step (the smallest change a checkpoint can have) is run in lockstep, and
// the fast GPU model must agree with the CPU model about as well as that perturbed CPU model
// does (greedy agreement at least its rate minus 0.2, logit error at most twice its error plus
// 0.05 of the logit scale). Measured on the dev box (CPU, 2026-11-29): the one-code change gives
// micro 75.0 % agreement and 0.47 of max|logit|, tiny 59.3 % and 0.80; on the H200 the fast
// model gave micro 73.6 % and 0.47. A wrong scale, a lost K block or a swapped row gives ~0 %
// agreement and fails. Also: a batch gives each request the bits it gets alone (every op below
// its threshold is batch-invariant).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#include "config/model_config.hpp"
#include "kernels/checkpoint/tensor_map.hpp"
#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda_model/gpu_model.hpp"
#include "kernels/model/model.hpp"
#include "kernels/model/random_weights.hpp"
#include "tests/gpu/gpu_test_util.hpp"
#include "tests/kernels/model_test_util.hpp"

using namespace cedar;
using namespace cedar::gpu_test;

namespace {

// See the header: the margins over the one-code perturbation of the CPU model.
constexpr double rate_margin = 0.2;
constexpr double error_factor = 2.0, error_slack = 0.05;

struct fast_pair {
  std::shared_ptr<const tensor_map> weights;
  std::unique_ptr<model> cpu, perturbed;
  std::unique_ptr<gpu_model> gpu;
  std::unique_ptr<gpu_kv_arena> arena;
};

fast_pair& load(const std::string& preset) {
  static std::map<std::string, fast_pair> cache;
  fast_pair& p = cache[preset];
  if (!p.cpu) {
    std::string error;
    const auto args = load_model_args(preset, &error);
    REQUIRE_MESSAGE(args.has_value(), error);
    p.weights = std::make_shared<tensor_map>(make_random_weights(*args, 1234));
    p.cpu = std::make_unique<model>(*args, p.weights, kv_dtype::fp4);
    // the same weights with one FP8 code of layer 0's wq_a one step away
    auto pert = std::make_shared<tensor_map>(*p.weights);
    const std::string name = "layers.0.attn.wq_a.weight";
    const tensor_entry* e = p.weights->find(name);
    REQUIRE(e != nullptr);
    uint8_t* bytes = pert->add_owned(name, e->dtype, e->shape);
    std::memcpy(bytes, e->data, e->num_bytes());
    uint8_t& code = bytes[e->num_bytes() / 3];
    code ^= ((code ^ 1) & 0x7F) == 0x7F ? 2 : 1;  // never onto the NaN code
    p.perturbed = std::make_unique<model>(*args, pert, kv_dtype::fp4);
    p.gpu = std::make_unique<gpu_model>(*args, p.weights, kv_dtype::fp4, upload_progress_fn{}, gpu_kernels::fast);
    REQUIRE(p.gpu->kernels() == gpu_kernels::fast);
    p.arena = std::make_unique<gpu_kv_arena>(p.gpu->layout(), 0.05);
  }
  return p;
}

struct gpu_request {
  gpu_kv_arena& arena;
  request_kv kv;
  std::vector<int32_t> history;
  gpu_request(gpu_kv_arena& a, int64_t max_tokens) : arena(a) {
    auto k = a.allocate(max_tokens);
    REQUIRE(k.has_value());
    kv = std::move(*k);
  }
  ~gpu_request() { arena.release(kv); }
  std::vector<float> run(const gpu_model& m, std::span<const int32_t> tokens) {
    forward_item it;
    it.kv = &kv;
    it.history = history;
    it.tokens = tokens;
    it.logits = logits_mode::last;
    std::vector<float> logits;
    m.forward(std::span<forward_item>(&it, 1), logits);
    history.insert(history.end(), tokens.begin(), tokens.end());
    return logits;
  }
};

struct agreement {
  double max_rel = 0;
  int steps = 0, same_token = 0;
  void add(const std::vector<float>& g, const std::vector<float>& c) {
    REQUIRE(g.size() == c.size());
    double max_ref = 0, max_err = 0;
    for (std::size_t i = 0; i < c.size(); ++i) {
      max_ref = std::max(max_ref, double(std::fabs(c[i])));
      max_err = std::max(max_err, std::isfinite(g[i]) ? std::fabs(double(g[i]) - c[i]) : INFINITY);
    }
    max_rel = std::max(max_rel, max_err / std::max(1e-30, max_ref));
    ++steps;
    same_token += test::argmax(g) == test::argmax(c);
  }
  double rate() const { return steps ? double(same_token) / steps : 1.0; }
};

struct comparison {
  agreement fast, perturbed;  ///< the GPU fast model and the perturbed CPU model, each vs the CPU model
  void check() const {
    CHECK(fast.rate() >= perturbed.rate() - rate_margin);
    CHECK(fast.max_rel <= error_factor * perturbed.max_rel + error_slack);
  }
};

comparison greedy_prompts(const std::string& preset, int prompts, int decode_steps, const char* what) {
  fast_pair& p = load(preset);
  const int vocab = p.cpu->args().vocab_size;
  comparison c;
  for (int i = 0; i < prompts; ++i) {
    const int len = 3 + (i * 7) % 37;
    const auto prompt = test::random_tokens(len, vocab, 1000 + i);
    test::test_request cr(p.cpu->layout(), len + decode_steps), pr(p.perturbed->layout(), len + decode_steps);
    gpu_request gr(*p.arena, len + decode_steps);
    auto cl = test::run(*p.cpu, cr, prompt);
    auto pl = test::run(*p.perturbed, pr, prompt);
    auto gl = gr.run(*p.gpu, prompt);
    c.fast.add(gl, cl);
    c.perturbed.add(pl, cl);
    for (int s = 0; s < decode_steps; ++s) {
      const int32_t next[1] = {int32_t(test::argmax(cl))};
      cl = test::run(*p.cpu, cr, next);
      pl = test::run(*p.perturbed, pr, next);
      gl = gr.run(*p.gpu, next);
      c.fast.add(gl, cl);
      c.perturbed.add(pl, cl);
    }
  }
  std::printf("  %-5s %-7s fast GPU: greedy equal %d/%d (%.1f%%), logits max err %.3e of max|logit|; "
              "CPU with one weight code moved: %.1f%%, %.3e\n",
              preset.c_str(), what, c.fast.same_token, c.fast.steps, 100 * c.fast.rate(), c.fast.max_rel,
              100 * c.perturbed.rate(), c.perturbed.max_rel);
  return c;
}

}  // namespace

TEST_CASE("gpu model, fast kernels: as close to the CPU model as a one-code weight change (micro, tiny)") {
  if (!have_gpu()) return;
  for (const char* preset : {"micro", "tiny"}) greedy_prompts(preset, 20, 6, "default").check();
  // every linear and the experts through the bf16 path (cuBLAS; the experts on sm_90a: wgmma)
  const cuda::fast::tuning saved = cuda::fast::tuning_now();
  cuda::fast::tuning_now() = {0, 0, 0, 0};
  const comparison c = greedy_prompts("micro", 20, 6, "bf16");
  cuda::fast::tuning_now() = saved;
  c.check();
}

TEST_CASE("gpu model, fast kernels: Engram tables in host memory give the bits of tables on the device") {
  if (!have_gpu()) return;
  fast_pair& p = load("micro");
  REQUIRE(p.gpu->host_weight_bytes() == 0);  // auto: micro fits the device with its tables
  ::setenv("CEDAR_GPU_ENGRAM_TABLES", "host", 1);
  const gpu_model host(p.cpu->args(), p.weights, kv_dtype::fp4, upload_progress_fn{}, gpu_kernels::fast);
  ::unsetenv("CEDAR_GPU_ENGRAM_TABLES");
  // the tables left the device image for host memory (there each one's codes padded to 256 bytes)
  REQUIRE(host.weight_bytes() < p.gpu->weight_bytes());
  const uint64_t moved = p.gpu->weight_bytes() - host.weight_bytes();
  CHECK(host.host_weight_bytes() >= moved);
  CHECK(host.host_weight_bytes() < moved + 2 * 256);
  gpu_kv_arena arena(host.layout(), 0.05);
  const int vocab = p.cpu->args().vocab_size;
  const auto prompt = test::random_tokens(23, vocab, 77);
  gpu_request on_device(*p.arena, 23 + 4), on_host(arena, 23 + 4);
  auto want = on_device.run(*p.gpu, prompt), got = on_host.run(host, prompt);
  for (int s = 0; s <= 4; ++s) {
    INFO("step " << s);
    REQUIRE(got.size() == want.size());
    CHECK(std::memcmp(got.data(), want.data(), sizeof(float) * want.size()) == 0);
    if (s == 4) break;
    const int32_t next[1] = {int32_t(test::argmax(want))};
    want = on_device.run(*p.gpu, next), got = on_host.run(host, next);
  }
}

TEST_CASE("gpu model, fast kernels: a batch gives each request the bits it gets alone") {
  if (!have_gpu()) return;
  fast_pair& p = load("micro");
  const int vocab = p.cpu->args().vocab_size;
  const int lens[3] = {3, 5, 7};  // 15 rows: every op below its threshold (bf16 GEMV: 16)
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<float>> alone;
  for (int i = 0; i < 3; ++i) {
    prompts.push_back(test::random_tokens(lens[i], vocab, 500 + i));
    gpu_request r(*p.arena, lens[i]);
    alone.push_back(r.run(*p.gpu, prompts[i]));
  }
  std::vector<std::unique_ptr<gpu_request>> reqs;
  std::vector<forward_item> batch;
  for (int i = 0; i < 3; ++i) {
    reqs.push_back(std::make_unique<gpu_request>(*p.arena, lens[i]));
    forward_item it;
    it.kv = &reqs.back()->kv;
    it.tokens = prompts[i];
    it.logits = logits_mode::last;
    batch.push_back(it);
  }
  std::vector<float> logits;
  p.gpu->forward(batch, logits);
  REQUIRE(logits.size() == std::size_t(3) * vocab);
  for (int i = 0; i < 3; ++i)
    CHECK(std::memcmp(logits.data() + std::size_t(i) * vocab, alone[i].data(), sizeof(float) * vocab) == 0);
}

TEST_CASE("gpu model, fast kernels: decode steps batched give each request its per-item compressor's bits") {
  // A step of one-row items runs the compressor for all of them at once (merging each item's
  // pair against its parked token, storing through each item's page table); a step with any
  // longer item runs it per item. Request a steps alone (the batched path, one item); request
  // b, same tokens, steps next to request c, which brings two tokens each step (the per-item
  // path). Four steps cover both parities of the ratio-2 pairs. 3 rows: every op batch-invariant.
  if (!have_gpu()) return;
  fast_pair& p = load("micro");
  const int vocab = p.cpu->args().vocab_size, steps = 4;
  const auto prompt = test::random_tokens(6, vocab, 700);
  const auto other = test::random_tokens(4 + 2 * steps, vocab, 701);
  gpu_request a(*p.arena, 6 + steps), b(*p.arena, 6 + steps), c(*p.arena, 4 + 2 * steps);
  a.run(*p.gpu, prompt);
  b.run(*p.gpu, prompt);
  c.run(*p.gpu, std::span<const int32_t>(other).first(4));
  int equal = 0;
  for (int s = 0; s < steps; ++s) {
    const int32_t next[1] = {int32_t((s * 37 + 11) % vocab)};
    const std::vector<float> alone = a.run(*p.gpu, next);
    std::vector<forward_item> batch(2);
    batch[0].kv = &b.kv, batch[0].history = b.history, batch[0].tokens = next;
    batch[1].kv = &c.kv, batch[1].history = c.history;
    batch[1].tokens = std::span<const int32_t>(other).subspan(4 + 2 * s, 2);
    batch[0].logits = batch[1].logits = logits_mode::last;
    std::vector<float> logits;
    p.gpu->forward(batch, logits);
    b.history.push_back(next[0]);
    c.history.insert(c.history.end(), other.begin() + 4 + 2 * s, other.begin() + 6 + 2 * s);
    REQUIRE(logits.size() == std::size_t(2) * vocab);
    equal += std::memcmp(logits.data(), alone.data(), sizeof(float) * vocab) == 0;
  }
  CHECK(equal == steps);
}

TEST_CASE("gpu model, fast kernels: a prefill call's scratch stays under gpu_step_reserve_bytes (micro, tiny)") {
  if (!have_gpu()) return;
  // serving sizes the KV with this estimate (tools/cli/device_model.cpp); under it, a step of
  // --max-batched-tokens rows cannot run the device out of memory
  for (const char* preset : {"micro", "tiny"}) {
    fast_pair& p = load(preset);
    for (const int n : {512, 2048}) {
      const auto prompt = test::random_tokens(n, p.cpu->args().vocab_size, 900 + n);
      gpu_request r(*p.arena, n);
      cuda::synchronize();
      cuda::reset_scratch_high_water();
      r.run(*p.gpu, prompt);
      cuda::synchronize();
      const uint64_t high = cuda::scratch_high_water(), reserve = uint64_t(gpu_step_reserve_bytes(p.cpu->args(), n));
      MESSAGE(preset, " n=", n, ": scratch high-water ", high, " B, reserve ", reserve, " B");
      CHECK(high > 0);
      CHECK(high <= reserve);
    }
  }
}
