// `cedar churn`: many requests of random lengths through the engine under KV pressure, a share
// of them cancelled mid-stream at random points; then checks that every page and ring slot is
// free again and that a random sample of the completed requests streamed exactly the tokens a
// stand-alone run gives (a fresh engine, prefix cache off, one request at a time). Prints the
// counts (completed, cancelled, preemptions), the time, and PASS / FAIL; exits 1 on FAIL.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "actors/engine.hpp"
#include "actors/shard.hpp"
#include "config/model_config.hpp"
#include "kernels/checkpoint/safetensors.hpp"
#include "kernels/model/random_weights.hpp"
#include "tools/cli/flags.hpp"
#include "tools/cli/model_source.hpp"
#include "tools/cli/registry.hpp"

namespace {

using namespace cedar;

struct churn_args {
  std::string model = "micro";
  uint64_t seed = 1;
  int requests = 2000;
  int prompt_min = 8, prompt_max = 64;
  int gen_min = 1, gen_max = 16;
  int cancel_pct = 20;
  int verify = 100;
  int inflight = 64;    ///< requests submitted and not yet finished, at most
  int kv_pages = -1;    ///< pages in the KV budget besides one ring slot per running request (-1: 2 x max-num-seqs)
  engine_options options;
};

/// Every request's streamed tokens and finish reason, filled from actor threads.
struct streams {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, std::string> reason;
  int finished = 0;

  token_callback callback() {
    return [this](const token_batch& b) {
      std::lock_guard<std::mutex> lock(mu);
      auto& v = tokens[b.request_id];
      v.insert(v.end(), b.ids.begin(), b.ids.end());
      if (b.finished) reason[b.request_id] = b.finish_reason.empty() ? "?" : b.finish_reason, ++finished;
      cv.notify_all();
    };
  }
};

request_spec random_spec(std::mt19937_64& g, const churn_args& a, int vocab) {
  request_spec s;
  s.prompt.resize(std::size_t(std::uniform_int_distribution<int>(a.prompt_min, a.prompt_max)(g)));
  for (auto& t : s.prompt) t = int32_t(3 + g() % uint64_t(vocab - 3));
  s.max_tokens = std::uniform_int_distribution<int>(a.gen_min, a.gen_max)(g);
  s.ignore_eos = true;
  if (g() % 2) s.sampling.temperature = 0.8f, s.sampling.top_p = 0.95f, s.sampling.seed = g();
  return s;
}

/// The tokens `s` streams alone on `eng` (which runs nothing else).
std::vector<int32_t> run_alone(engine& eng, const request_spec& s, std::string* reason) {
  streams k;
  auto id = eng.submit(s, k.callback());
  if (!id) return *reason = id.error().message, std::vector<int32_t>{};
  std::unique_lock<std::mutex> lock(k.mu);
  k.cv.wait(lock, [&] { return k.finished > 0; });
  *reason = k.reason[id.value()];
  return k.tokens[id.value()];
}

/// DIR (config.json + safetensors) or PRESET (random weights from `seed`), with the engine's
/// page size; nullptr and *error on failure.
std::shared_ptr<const model> open_paged_model(const std::string& dir_or_preset, uint64_t seed, kv_dtype dtype,
                                              int page_tokens, std::string* error) {
  auto args = cli::load_serving_args(dir_or_preset, error);
  if (!args) return nullptr;
  auto weights = std::make_shared<tensor_map>();
  if (std::filesystem::is_directory(dir_or_preset)) {
    if (!read_safetensors(dir_or_preset, *weights, error)) return nullptr;
  } else {
    *weights = make_random_weights(*args, seed);
  }
  try {
    return std::make_shared<const model>(*args, std::move(weights), dtype, page_tokens);
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int churn(const churn_args& a) {
  std::string error;
  std::shared_ptr<const model> m = open_paged_model(a.model, a.seed, a.options.kv_fp8 ? kv_dtype::fp8 : kv_dtype::fp4,
                                                    a.options.page_tokens, &error);
  if (!m) return std::fprintf(stderr, "churn: %s\n", error.c_str()), 1;
  const kv_layout& layout = m->layout();
  engine_options o = a.options;
  const int kv_pages = a.kv_pages >= 0 ? a.kv_pages : 2 * o.max_num_seqs;
  const int64_t slot_bytes = int64_t(layout.ring_bytes() + layout.tail_floats() * sizeof(float));
  o.kv_budget_bytes = o.max_num_seqs * slot_bytes + kv_pages * int64_t(layout.page_bytes);
  auto started = engine::start(wrap_model(m), o);
  if (!started) return std::fprintf(stderr, "churn: %s\n", started.error().message.c_str()), 1;
  engine& eng = *started.value();
  const int vocab = m->args().vocab_size;
  std::printf("churn: model %s, %d requests, prompts %d-%d, generated %d-%d, %d%% cancelled, up to %d in flight\n"
              "       max-num-seqs %d, pages of %d tokens, KV budget %lld B (%d slots + %d pages), swa-replay %s\n",
              a.model.c_str(), a.requests, a.prompt_min, a.prompt_max, a.gen_min, a.gen_max, a.cancel_pct, a.inflight,
              o.max_num_seqs, o.page_tokens, (long long)o.kv_budget_bytes, o.max_num_seqs, kv_pages,
              o.swa_replay == swa_replay_mode::full ? "full" : "bounded");
  std::fflush(stdout);

  std::mt19937_64 g(a.seed * 7919 + 13);
  streams k;
  std::vector<uint64_t> ids;
  std::map<uint64_t, request_spec> specs;
  std::map<uint64_t, std::size_t> cancel_at;  // cancel once this many tokens streamed
  int cancels_sent = 0, cancels_late = 0, submitted = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto last_report = t0;
  for (;;) {
    int finished = 0;
    {
      std::lock_guard<std::mutex> lock(k.mu);
      finished = k.finished;
    }
    while (submitted < a.requests && submitted - finished < a.inflight) {
      request_spec s = random_spec(g, a, vocab);
      auto id = eng.submit(s, k.callback());
      if (!id) return std::fprintf(stderr, "churn: submit: %s\n", id.error().message.c_str()), 1;
      ids.push_back(id.value());
      if (int(g() % 100) < a.cancel_pct) cancel_at[id.value()] = std::size_t(g() % uint64_t(s.max_tokens));
      specs[id.value()] = std::move(s);
      ++submitted;
    }
    std::vector<uint64_t> to_cancel;
    {
      std::lock_guard<std::mutex> lock(k.mu);
      for (auto it = cancel_at.begin(); it != cancel_at.end();) {
        if (k.reason.count(it->first)) {
          ++cancels_late, it = cancel_at.erase(it);  // finished before its cancel point came
        } else if (k.tokens[it->first].size() >= it->second) {
          to_cancel.push_back(it->first), it = cancel_at.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (uint64_t id : to_cancel) {
      if (eng.cancel(id).ok()) ++cancels_sent;
      else ++cancels_late;
    }
    if (finished == a.requests) break;
    if (seconds_since(last_report) > 30) {
      last_report = std::chrono::steady_clock::now();
      std::printf("  %.0f s: %d submitted, %d finished\n", seconds_since(t0), submitted, finished);
      std::fflush(stdout);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double churn_s = seconds_since(t0);
  const metrics_snapshot mx = eng.metrics();

  int completed = 0, cancelled = 0, other = 0;
  std::vector<uint64_t> done_ids;
  for (uint64_t id : ids) {
    const std::string& r = k.reason[id];
    if (r == "length") ++completed, done_ids.push_back(id);
    else if (r == "cancelled") ++cancelled;
    else ++other, std::fprintf(stderr, "  request %llu finished with \"%s\"\n", (unsigned long long)id, r.c_str());
  }
  const bool no_leak = mx.pages_used == 0 && mx.ring_slots_used == 0 && mx.requests_running == 0 &&
                       mx.requests_waiting == 0 && mx.pages_free + mx.pages_cached_idle == mx.pages_total;
  std::printf("churn done in %.1f s: %d completed, %d cancelled (%d cancels sent, %d came after the finish), "
              "%d other; %lld preemptions, %lld steps, %lld prompt tokens computed (%lld replayed), %lld generated, "
              "prefix hit rate %.1f%%\n",
              churn_s, completed, cancelled, cancels_sent, cancels_late, other, (long long)mx.preemptions,
              (long long)mx.steps, (long long)mx.tokens_in, (long long)mx.replay_tokens, (long long)mx.tokens_out,
              100.0 * mx.prefix_hit_rate());
  std::printf("leak check: pages used %lld, ring slots used %lld, running %lld, waiting %lld, free %lld + cached "
              "idle %lld of %lld pages: %s\n",
              (long long)mx.pages_used, (long long)mx.ring_slots_used, (long long)mx.requests_running,
              (long long)mx.requests_waiting, (long long)mx.pages_free, (long long)mx.pages_cached_idle,
              (long long)mx.pages_total, no_leak ? "PASS" : "FAIL");
  std::fflush(stdout);

  // Stand-alone runs on a fresh engine without the prefix cache, one request at a time.
  engine_options alone_o = a.options;
  alone_o.prefix_cache = false;
  alone_o.kv_budget_bytes = std::max<int64_t>(alone_o.kv_budget_bytes, o.kv_budget_bytes);
  auto alone_eng = engine::start(wrap_model(m), alone_o);
  if (!alone_eng) return std::fprintf(stderr, "churn: %s\n", alone_eng.error().message.c_str()), 1;
  std::shuffle(done_ids.begin(), done_ids.end(), g);
  done_ids.resize(std::min<std::size_t>(done_ids.size(), std::size_t(std::max(0, a.verify))));
  int same = 0;
  const auto t1 = std::chrono::steady_clock::now();
  for (uint64_t id : done_ids) {
    std::string reason;
    const auto want = run_alone(*alone_eng.value(), specs[id], &reason);
    if (want == k.tokens[id] && reason == "length") ++same;
    else std::fprintf(stderr, "  request %llu differs from its stand-alone run\n", (unsigned long long)id);
  }
  std::printf("verified %d of %zu sampled completed requests equal their stand-alone runs (%.1f s)\n", same,
              done_ids.size(), seconds_since(t1));
  const bool pass = no_leak && other == 0 && same == int(done_ids.size()) && completed + cancelled == a.requests;
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

int churn_main(int argc, char** argv) {
  churn_args a;
  a.options.page_tokens = 16;
  a.options.max_num_seqs = 16;
  a.options.max_batched_tokens = 256;
  a.options.max_prefill_tokens_per_request = 64;
  std::vector<std::string> rest(argv + 1, argv + argc);
  auto parsed = parse_engine_options(rest, a.options);
  for (std::size_t i = 0; i + 1 < parsed.rest.size(); i += 2) {
    const std::string& key = parsed.rest[i];
    int v = 0;
    if (key != "--model" && !cedar::cli::read_integer(parsed.rest[i + 1], v, 0)) {
      parsed.errors.push_back(key + ": not a non-negative integer: " + parsed.rest[i + 1]);
      continue;
    }
    if (key == "--model") a.model = parsed.rest[i + 1];
    else if (key == "--seed") a.seed = uint64_t(v);
    else if (key == "--requests") a.requests = v;
    else if (key == "--prompt-min") a.prompt_min = v;
    else if (key == "--prompt-max") a.prompt_max = v;
    else if (key == "--gen-min") a.gen_min = v;
    else if (key == "--gen-max") a.gen_max = v;
    else if (key == "--cancel-pct") a.cancel_pct = v;
    else if (key == "--verify") a.verify = v;
    else if (key == "--inflight") a.inflight = v;
    else if (key == "--kv-pages") a.kv_pages = v;
    else parsed.errors.push_back("unknown option " + key);
  }
  if (a.requests < 1 || a.prompt_min < 1 || a.prompt_max < a.prompt_min || a.gen_min < 1 || a.gen_max < a.gen_min ||
      a.inflight < 1 || a.cancel_pct < 0 || a.cancel_pct > 100)
    parsed.errors.push_back("need requests, inflight, prompt-min, gen-min >= 1, max >= min, cancel-pct in 0..100");
  if (!parsed.errors.empty() || parsed.rest.size() % 2) {
    std::fprintf(stderr,
                 "usage: cedar churn [--model PRESET|DIR] [--seed 1] [--requests 2000] [--prompt-min 8]\n"
                 "                   [--prompt-max 64] [--gen-min 1] [--gen-max 16] [--cancel-pct 20]\n"
                 "                   [--verify 100] [--inflight 64] [--kv-pages N (default 2 x max-num-seqs)]\n"
                 "                   [engine options; defaults here: --page-tokens 16 --max-num-seqs 16\n"
                 "                    --max-batched-tokens 256 --max-prefill-chunk 64; --kv-budget-bytes is\n"
                 "                    replaced by max-num-seqs ring slots + kv-pages pages]\n%s",
                 engine_options::help().c_str());
    for (auto& e : parsed.errors) std::fprintf(stderr, "error: %s\n", e.c_str());
    return 2;
  }
  a.options = parsed.options;
  return churn(a);
}

}  // namespace

CEDAR_COMMAND("churn", "many random requests with cancellations under KV pressure: leak check and stand-alone equality",
              churn_main);
