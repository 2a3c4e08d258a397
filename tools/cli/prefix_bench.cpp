// `cedar prefix-bench`: a multi-turn conversation through the engine, once with the prefix
// cache and once without: per turn the prompt, the tokens served from the cache and the time
// to first token; then the hit rate of turns 2.. and the TTFT ratio. Also prints the KV bytes
// per token the cache stores (global KV only) against what caching the SWA window would cost.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "actors/engine.hpp"
#include "actors/shard.hpp"
#include "config/model_config.hpp"
#include "tools/cli/flags.hpp"
#include "tools/cli/model_source.hpp"
#include "tools/cli/registry.hpp"

namespace {

using namespace cedar;

struct bench_args {
  std::string model = "micro";
  uint64_t seed = 1;
  int turns = 10, prefix_tokens = 4096, turn_tokens = 200, gen_tokens = 8;
  engine_options options;
};

struct turn_result {
  int64_t prompt_tokens = 0, cached_tokens = 0;
  double ttft_ms = 0;
};

/// Runs the conversation on a fresh engine; one result per turn.
std::vector<turn_result> run_conversation(const bench_args& a, engine_options o, std::string* error) {
  auto m = cli::open_model(a.model, a.seed, o.kv_fp8 ? kv_dtype::fp8 : kv_dtype::fp4, error, o.page_tokens);
  if (!m) return {};
  auto started = engine::start(wrap_model(std::shared_ptr<const model>(std::move(m))), o);
  if (!started) return *error = started.error().message, std::vector<turn_result>{};
  auto& eng = *started.value();
  const uint64_t sid = eng.open_session().value();
  std::mt19937 g(uint32_t(a.seed));
  std::vector<turn_result> out;
  for (int t = 0; t < a.turns; ++t) {
    request_spec s;
    s.session_id = sid;
    s.max_tokens = a.gen_tokens;
    s.ignore_eos = true;
    s.prompt.resize(std::size_t((t == 0 ? a.prefix_tokens : 0) + a.turn_tokens));
    for (auto& id : s.prompt) id = int32_t(3 + g() % 100000);
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    turn_result r;
    const auto t0 = std::chrono::steady_clock::now();
    auto sub = eng.submit(s, [&](const token_batch& b) {
      std::lock_guard<std::mutex> lock(mu);
      if (r.ttft_ms == 0 && !b.ids.empty())
        r.ttft_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (b.finished) done = true, r.prompt_tokens = b.usage.prompt_tokens, r.cached_tokens = b.usage.cached_prompt_tokens;
      cv.notify_all();
    });
    if (!sub) return *error = sub.error().message, std::vector<turn_result>{};
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    out.push_back(r);
  }
  return out;
}

void print_storage() {
  std::string error;
  auto real = load_model_args("deepseek-v4.1-flash", &error);
  if (!real) return;
  const kv_layout l = kv_layout::make(*real, kv_dtype::fp4);
  const double swa = double(l.num_layers) * double(l.swa_record_bytes);
  std::printf("storage (real config, fp4): prefix cache holds global KV only: %.0f B/token; caching the SWA\n"
              "  window too would add %.0f B/token (%d layers x %zu B), %.1fx the global KV; a running request's\n"
              "  ring is %zu B\n",
              l.bytes_per_token(), swa, l.num_layers, l.swa_record_bytes, swa / l.bytes_per_token(), l.ring_bytes());
}

int prefix_bench_main(int argc, char** argv) {
  bench_args a;
  std::vector<std::string> rest(argv + 1, argv + argc);
  auto parsed = parse_engine_options(rest, a.options);
  for (std::size_t i = 0; i + 1 < parsed.rest.size(); i += 2) {
    const std::string& k = parsed.rest[i];
    int v = 0;
    if (k != "--model" && !cedar::cli::read_integer(parsed.rest[i + 1], v, 0)) {
      parsed.errors.push_back(k + ": not a non-negative integer: " + parsed.rest[i + 1]);
      continue;
    }
    if (k == "--model") a.model = parsed.rest[i + 1];
    else if (k == "--seed") a.seed = uint64_t(v);
    else if (k == "--turns") a.turns = v;
    else if (k == "--prefix") a.prefix_tokens = v;
    else if (k == "--turn-tokens") a.turn_tokens = v;
    else if (k == "--gen") a.gen_tokens = v;
    else parsed.errors.push_back("unknown option " + k);
  }
  if (!parsed.errors.empty() || parsed.rest.size() % 2) {
    std::fprintf(stderr,
                 "usage: cedar prefix-bench [--model PRESET|DIR] [--seed S] [--turns 10] [--prefix 4096]\n"
                 "                          [--turn-tokens 200] [--gen 8] [engine options]\n%s",
                 engine_options::help().c_str());
    for (auto& e : parsed.errors) std::fprintf(stderr, "error: %s\n", e.c_str());
    return 2;
  }
  a.options = parsed.options;
  engine_options off = a.options;
  off.prefix_cache = false;
  std::string error;
  const auto on_r = run_conversation(a, a.options, &error);
  const auto off_r = on_r.empty() ? on_r : run_conversation(a, off, &error);
  if (on_r.empty() || off_r.empty()) return std::fprintf(stderr, "prefix-bench: %s\n", error.c_str()), 1;
  std::printf("model %s, %d turns, %d-token prefix, %d new tokens per turn, %d generated\n", a.model.c_str(), a.turns,
              a.prefix_tokens, a.turn_tokens, a.gen_tokens);
  std::printf("turn  prompt  cached  hit%%   ttft_on_ms  ttft_off_ms  off/on\n");
  int64_t prompt = 0, cached = 0;
  double on_ms = 0, off_ms = 0;
  for (std::size_t t = 0; t < on_r.size(); ++t) {
    const auto& r = on_r[t];
    std::printf("%4zu  %6lld  %6lld  %5.1f  %10.1f  %11.1f  %6.1fx\n", t + 1, (long long)r.prompt_tokens,
                (long long)r.cached_tokens, 100.0 * r.cached_tokens / r.prompt_tokens, r.ttft_ms, off_r[t].ttft_ms,
                off_r[t].ttft_ms / r.ttft_ms);
    if (t == 0) continue;
    prompt += r.prompt_tokens, cached += r.cached_tokens, on_ms += r.ttft_ms, off_ms += off_r[t].ttft_ms;
  }
  std::printf("turns 2-%zu: prefix hit rate %.1f%% of prompt tokens; mean TTFT %.1f ms (cache on) vs %.1f ms "
              "(off): %.1fx lower\n",
              on_r.size(), 100.0 * cached / std::max<int64_t>(1, prompt), on_ms / (on_r.size() - 1),
              off_ms / (on_r.size() - 1), off_ms / on_ms);
  print_storage();
  return 0;
}

}  // namespace

CEDAR_COMMAND("prefix-bench", "multi-turn prefix-cache benchmark: hit rate and TTFT, cache on vs off",
              prefix_bench_main);
