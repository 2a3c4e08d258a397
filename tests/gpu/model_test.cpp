// The whole model on the GPU against the CPU model (random weights, presets micro and tiny):
// 20 prompts of 3..39 tokens, prefill then greedy decode; the greedy tokens must be identical and
// every logit within 1e-3 of the largest |logit|. The ops reproduce the CPU's bits (including
// exp and log1p, expf_port.hpp), so the printed figures are expected to be exact; the bound is
// there for a device libm or toolkit change. Also: prefill logits of every row, and a batch of
// requests gives each request the logits it gets alone (batch invariance on the device); pages of
// 4 tokens give the CPU's logits too, and the fast kernels' logits do not depend on the page size.
// On a failure the first layer whose largest |residual| differs is printed.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <tuple>

#include "config/model_config.hpp"
#include "kernels/cuda_model/gpu_model.hpp"
#include "kernels/model/model.hpp"
#include "kernels/model/random_weights.hpp"
#include "tests/gpu/gpu_test_util.hpp"
#include "tests/gpu/preset_weights.hpp"
#include "tests/kernels/model_test_util.hpp"

using namespace cedar;
using namespace cedar::gpu_test;

namespace {

constexpr double logit_bound = 1e-3;

struct pair_of_models {
  std::shared_ptr<const tensor_map> weights;
  std::unique_ptr<model> cpu;
  std::unique_ptr<gpu_model> gpu;
  std::unique_ptr<gpu_kv_arena> arena;
};

pair_of_models& load(const std::string& preset, kv_dtype dtype = kv_dtype::fp4,
                     int page_tokens = default_page_tokens) {
  static std::map<std::tuple<std::string, int, int>, pair_of_models> cache;
  pair_of_models& p = cache[{preset, int(dtype), page_tokens}];
  if (!p.cpu) {
    std::string error;
    const auto args = load_model_args(preset, &error);
    REQUIRE_MESSAGE(args.has_value(), error);
    p.weights = std::make_shared<tensor_map>(make_random_weights(*args, 1234));
    p.cpu = std::make_unique<model>(*args, p.weights, dtype, page_tokens);
    const auto t0 = std::chrono::steady_clock::now();
    p.gpu = std::make_unique<gpu_model>(*args, p.weights, dtype, upload_progress_fn{}, gpu_kernels::exact, false,
                                        gpu_placement{}, page_tokens);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  %s: %.1f MiB of weights on the device in %.2f s\n", preset.c_str(),
                double(p.gpu->weight_bytes()) / (1 << 20), s);
    p.arena = std::make_unique<gpu_kv_arena>(p.gpu->layout(), 0.05);
  }
  return p;
}

/// A request on the device: KV from the arena, history kept on the host.
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
  forward_item item(std::span<const int32_t> tokens, logits_mode mode) {
    forward_item it;
    it.kv = &kv;
    it.history = history;
    it.tokens = tokens;
    it.logits = mode;
    return it;
  }
};

std::vector<float> run_gpu(const gpu_model& m, gpu_request& r, std::span<const int32_t> tokens,
                           logits_mode mode = logits_mode::last, forward_stats* stats = nullptr) {
  forward_item it = r.item(tokens, mode);
  std::vector<float> logits;
  m.forward(std::span<forward_item>(&it, 1), logits, stats);
  r.history.insert(r.history.end(), tokens.begin(), tokens.end());
  return logits;
}

struct diff_stats {
  double max_rel = 0;
  std::size_t same = 0, total = 0;
  void add(const std::vector<float>& g, const std::vector<float>& c) {
    REQUIRE(g.size() == c.size());
    float max_ref = 0, max_err = 0;
    for (std::size_t i = 0; i < c.size(); ++i) {
      max_ref = std::max(max_ref, std::fabs(c[i]));
      max_err = std::max(max_err, std::isfinite(g[i]) ? std::fabs(g[i] - c[i]) : INFINITY);
      same += std::memcmp(&g[i], &c[i], 4) == 0;
    }
    total += c.size();
    max_rel = std::max(max_rel, double(max_err) / std::max(1e-30, double(max_ref)));
  }
};

void greedy_prompts(const std::string& preset, kv_dtype dtype, int prompts, int decode_steps,
                    int page_tokens = default_page_tokens) {
  pair_of_models& p = load(preset, dtype, page_tokens);
  const int vocab = p.cpu->args().vocab_size;
  int identical = 0;
  diff_stats d;
  for (int i = 0; i < prompts; ++i) {
    const int len = 3 + (i * 7) % 37;  // 3 .. 39 tokens: below, at and above the window
    const auto prompt = test::random_tokens(len, vocab, 1000 + i);
    test::test_request cr(p.cpu->layout(), len + decode_steps);
    gpu_request gr(*p.arena, len + decode_steps);
    forward_stats cs, gs;
    bool reported = false;
    // The first layer whose largest |residual| differs, at the first step whose logits differ.
    const auto report = [&](int step, const std::vector<float>& g, const std::vector<float>& c) {
      if (reported || g == c) return;
      reported = true;
      for (int l = 0; l < p.cpu->args().num_hidden_layers; ++l) {
        if (cs.max_abs_residual[l] == gs.max_abs_residual[l]) continue;
        const layer_info& li = p.cpu->args().layers[l];
        std::printf("    prompt %d (len %d) step %d: first residual difference at layer %d (ratio %d, "
                    "mode %d, engram %d, candidates %d): %.9g vs %.9g\n", i, len, step, l,
                    li.compress_ratio, int(li.mode), int(li.has_engram), int(li.uses_candidates),
                    gs.max_abs_residual[l], cs.max_abs_residual[l]);
        return;
      }
      std::printf("    prompt %d step %d: residual maxima equal, logits differ\n", i, step);
    };
    auto cl = test::run(*p.cpu, cr, prompt, logits_mode::last, -1, &cs);
    auto gl = run_gpu(*p.gpu, gr, prompt, logits_mode::last, &gs);
    d.add(gl, cl);
    report(0, gl, cl);
    std::vector<int32_t> ct, gt;
    for (int s = 0; s < decode_steps; ++s) {
      const int32_t c = int32_t(test::argmax(cl)), g = int32_t(test::argmax(gl));
      ct.push_back(c);
      gt.push_back(g);
      const int32_t next[1] = {c};  // both continue with the CPU's token
      cl = test::run(*p.cpu, cr, next, logits_mode::last, -1, &cs);
      gl = run_gpu(*p.gpu, gr, next, logits_mode::last, &gs);
      d.add(gl, cl);
      report(s + 1, gl, cl);
    }
    identical += ct == gt;
  }
  std::printf("  model %-5s kv %s, pages of %d: greedy tokens identical for %d/%d prompts (%d decode steps "
              "each); logits rel err %.3e (bound %.0e), bit-identical %.2f%%\n",
              preset.c_str(), dtype == kv_dtype::fp4 ? "fp4" : "fp8", page_tokens, identical, prompts, decode_steps,
              d.max_rel, logit_bound, 100.0 * double(d.same) / double(d.total));
  CHECK(identical == prompts);
  CHECK(d.max_rel <= logit_bound);
}

}  // namespace

TEST_CASE("gpu model: greedy tokens and logits equal the CPU model's (micro, tiny)") {
  if (!have_gpu()) return;
  greedy_prompts("micro", kv_dtype::fp4, 20, 8);
  greedy_prompts("micro", kv_dtype::fp8, 5, 4);
  greedy_prompts("tiny", kv_dtype::fp4, 20, 6);
  greedy_prompts("micro", kv_dtype::fp4, 5, 4, 4);  // pages of 4 tokens: a prompt spans up to 11
}

TEST_CASE("gpu model, fast kernels: the logits do not depend on the KV page size") {
  if (!have_gpu()) return;
  const gpu_test::preset_weights& micro = gpu_test::random_preset("micro", 4321);
  const auto logits_with_pages = [&](int page_tokens) {
    const gpu_model m(micro.args, micro.weights, kv_dtype::fp4, upload_progress_fn{}, gpu_kernels::fast, false,
                      gpu_placement{}, page_tokens);
    REQUIRE(m.layout().page_tokens == page_tokens);
    gpu_kv_arena arena(m.layout(), 0.02);
    std::vector<float> all;
    for (int i = 0; i < 4; ++i) {
      const int len = 5 + 11 * i;  // 5 .. 38 tokens, past the window of 8
      gpu_request r(arena, len + 6);
      std::vector<int32_t> tokens = test::random_tokens(len, m.args().vocab_size, 900 + i);
      for (int s = 0; s <= 6; ++s) {
        const std::vector<float> l = run_gpu(m, r, tokens);
        all.insert(all.end(), l.begin(), l.end());
        tokens = {int32_t(test::argmax(l))};
      }
    }
    return all;
  };
  const std::vector<float> big = logits_with_pages(256), small = logits_with_pages(4);
  REQUIRE(big.size() == small.size());
  std::size_t same = 0;
  for (std::size_t i = 0; i < big.size(); ++i) same += std::memcmp(&big[i], &small[i], sizeof(float)) == 0;
  std::printf("  fast kernels, pages of 4 against 256: %zu of %zu logits bit-identical\n", same, big.size());
  CHECK(same == big.size());
}

TEST_CASE("gpu model: prefill logits of every row, and a batch equals each request alone") {
  if (!have_gpu()) return;
  pair_of_models& p = load("micro");
  const int vocab = p.cpu->args().vocab_size;
  const auto tokens = test::random_tokens(33, vocab, 77);
  test::test_request cr(p.cpu->layout(), 33);
  gpu_request gr(*p.arena, 33);
  diff_stats d;
  d.add(run_gpu(*p.gpu, gr, tokens, logits_mode::all), test::run(*p.cpu, cr, tokens, logits_mode::all));
  std::printf("  prefill, all 33 rows: logits rel err %.3e, bit-identical %.2f%%\n", d.max_rel,
              100.0 * double(d.same) / double(d.total));
  CHECK(d.max_rel <= logit_bound);

  // three requests of different lengths in one call vs each alone (GPU only): same bits
  const int lens[3] = {5, 17, 30};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<float>> alone;
  for (int i = 0; i < 3; ++i) {
    prompts.push_back(test::random_tokens(lens[i], vocab, 500 + i));
    gpu_request r(*p.arena, lens[i]);
    alone.push_back(run_gpu(*p.gpu, r, prompts[i]));
  }
  std::vector<std::unique_ptr<gpu_request>> reqs;
  std::vector<forward_item> batch;
  for (int i = 0; i < 3; ++i) {
    reqs.push_back(std::make_unique<gpu_request>(*p.arena, lens[i]));
    batch.push_back(reqs.back()->item(prompts[i], logits_mode::last));
  }
  std::vector<float> logits;
  p.gpu->forward(batch, logits);
  REQUIRE(logits.size() == std::size_t(3) * vocab);
  for (int i = 0; i < 3; ++i)
    CHECK(std::memcmp(logits.data() + std::size_t(i) * vocab, alone[i].data(), sizeof(float) * vocab) == 0);
}


TEST_CASE("gpu model with host KV (the shard's kv_arena): same logits as the CPU model") {
  if (!have_gpu()) return;
  pair_of_models& p = load("micro");
  const int vocab = p.cpu->args().vocab_size;
  const auto prompt = test::random_tokens(21, vocab, 4242);
  test::test_request cr(p.cpu->layout(), 25), hr(p.cpu->layout(), 25);
  diff_stats d;
  const auto step = [&](std::span<const int32_t> tokens) {
    const auto c = test::run(*p.cpu, cr, tokens);
    forward_item it = hr.item(tokens, logits_mode::last);
    std::vector<float> g;
    p.gpu->forward_host_kv(std::span<forward_item>(&it, 1), g);
    hr.history.insert(hr.history.end(), tokens.begin(), tokens.end());
    d.add(g, c);
    return c;
  };
  auto logits = step(prompt);
  for (int s = 0; s < 4; ++s) {
    const int32_t next[1] = {int32_t(test::argmax(logits))};
    logits = step(next);
  }
  CHECK(hr.kv.num_tokens == cr.kv.num_tokens);
  CHECK(hr.ring == cr.ring);  // the KV bytes written back equal the CPU model's
  CHECK(hr.page_mem == cr.page_mem);
  CHECK(hr.tails == cr.tails);
  std::printf("  host-KV bridge, 21 + 4 tokens: logits rel err %.3e, bit-identical %.2f%%\n", d.max_rel,
              100.0 * double(d.same) / double(d.total));
  CHECK(d.max_rel <= logit_bound);
}

TEST_CASE("gpu model: a mixed batch (decode, prefill, chunk, decoder truncation, replay) equals the CPU's") {
  if (!have_gpu()) return;
  for (const std::string preset : {"micro", "tiny"}) {
    pair_of_models& p = load(preset);
    const model& m = *p.cpu;
    const int vocab = m.args().vocab_size, W = m.args().sliding_window;
    const auto ta = test::random_tokens(21, vocab, 6), tb = test::random_tokens(7, vocab, 7),
               tc = test::random_tokens(18, vocab, 8), td = test::random_tokens(27, vocab, 15),
               te = test::random_tokens(24, vocab, 16);
    struct requests {
      test::test_request a, b, c, d, e;
      explicit requests(const kv_layout& l) : a(l, 32), b(l, 32), c(l, 32), d(l, 32), e(l, 32) {}
    };
    // Both sides are prepared by the CPU model, so the step under test starts from equal KV.
    const auto prepare = [&](requests& r) {
      test::run(m, r.a, std::span(ta).first(20));
      test::run(m, r.c, std::span(tc).first(13));
      test::run(m, r.e, te);
      r.e.kv.num_tokens = int64_t(te.size()) - W;
      r.e.history.resize(te.size() - W);
    };
    const auto make_items = [&](requests& r) {
      std::vector<forward_item> items = {
          r.a.item(std::span(ta).subspan(20, 1)), r.b.item(tb, logits_mode::all),
          r.c.item(std::span(tc).subspan(13, 5)), r.d.item(td),
          r.e.item(std::span(te).last(W), logits_mode::last)};
      items[3].truncate_below = int64_t(td.size()) - W;
      items[4].replay = true;
      return items;
    };
    requests cpu_r(m.layout()), gpu_r(m.layout());
    prepare(cpu_r);
    prepare(gpu_r);
    auto cpu_items = make_items(cpu_r), gpu_items = make_items(gpu_r);
    std::vector<float> cpu_logits, gpu_logits;
    m.forward(cpu_items, cpu_logits);
    p.gpu->forward_host_kv(gpu_items, gpu_logits);
    diff_stats d;
    d.add(gpu_logits, cpu_logits);
    std::printf("  %s mixed batch with truncation and replay: logits rel err %.3e, bit-identical %.2f%%\n",
                preset.c_str(), d.max_rel, 100.0 * double(d.same) / double(d.total));
    CHECK(d.max_rel <= logit_bound);
    CHECK(gpu_r.a.ring == cpu_r.a.ring);
    CHECK(gpu_r.b.page_mem == cpu_r.b.page_mem);
    CHECK(gpu_r.c.page_mem == cpu_r.c.page_mem);
    CHECK(gpu_r.d.ring == cpu_r.d.ring);
    CHECK(gpu_r.e.ring == cpu_r.e.ring);
    CHECK(gpu_r.e.page_mem == cpu_r.e.page_mem);
    CHECK(gpu_r.e.tails == cpu_r.e.tails);
  }
}
