// `cedar gpu-bench` phases (see gpu_bench.hpp), each feeding the shard the steps the serving
// scheduler would (actors/scheduler_step.cpp): a prompt in chunks that sample only at its end;
// decoder truncation as truncate_below = prompt length - window on every item of the request;
// a prefix hit as the cached pages adopted, positions [hit - window, hit) replayed (plan_replay,
// bounded) and then the new tokens; decode one token per request per step, greedy.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <stdexcept>

#include "actors/replay.hpp"
#include "tools/cli/gpu_bench.hpp"

namespace cedar::cli::gpu_bench {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

int64_t pages_for(int64_t tokens, int page_tokens) { return (tokens + page_tokens - 1) / page_tokens; }

/// Adds the rows each layer runs for positions [first, first + n) (model.hpp's contract:
/// layers from truncate_from_layer on skip positions below truncate_below).
void add_rows(const model_args& a, int64_t first, int64_t n, int64_t truncate_below, std::vector<int64_t>& rows) {
  const int64_t kept = truncate_below < 0 ? n : std::clamp<int64_t>(first + n - truncate_below, 0, n);
  for (int l = 0; l < a.num_hidden_layers; ++l) rows[std::size_t(l)] += l >= a.truncate_from_layer ? kept : n;
}

}  // namespace

std::vector<int32_t> random_tokens(int64_t n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> pick(3, vocab - 1);
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  for (int32_t& x : t) x = pick(rng);
  return t;
}

kv_capacity bench_capacity(const options& o, const kv_layout& layout) {
  const int P = layout.page_tokens;
  int64_t pages = 0, slots = 0;
  for (int batch : o.batches) pages += batch * pages_for(o.context + o.warmup_steps + o.steps + 1, P), slots += batch;
  int64_t longest = std::max({o.prefix_tokens + o.new_tokens, o.gen_prompt});
  for (int64_t t : o.prefills) longest = std::max(longest, t);
  const int64_t runs = 2 * int64_t(o.prefills.size()) + 3;  // with and without truncation, cold + hit, generate
  pages += runs * pages_for(longest + o.gen_tokens + 1, P), slots += runs;
  kv_capacity cap;
  cap.num_pages = int32_t(pages), cap.num_slots = int32_t(slots);
  cap.page_bytes = layout.page_bytes;
  cap.slot_bytes = layout.ring_bytes() + layout.tail_floats() * sizeof(float);
  cap.budget_bytes = int64_t(pages) * int64_t(cap.page_bytes) + int64_t(slots) * int64_t(cap.slot_bytes);
  return cap;
}

runner::runner(shard& s, const kv_capacity& cap, const options& o, const ceilings& c)
    : shard_(s), args_(s.model_ref().args()), layout_(s.model_ref().layout()), cap_(cap), o_(o), ceil_(c),
      flops_(linear_flops_per_row(args_)) {}

bench_request runner::new_request(std::vector<int32_t> tokens, int64_t max_tokens) {
  bench_request r;
  r.id = next_id_++;
  r.tokens = std::move(tokens);
  const int64_t n = pages_for(max_tokens, layout_.page_tokens);
  if (next_page_ + n > cap_.num_pages || next_slot_ >= cap_.num_slots)
    throw std::runtime_error("the bench's KV capacity is spent (bench_capacity undercounts)");
  for (int64_t i = 0; i < n; ++i) r.page_ids.push_back(next_page_++);
  r.slot = next_slot_++;
  return r;
}

step_item runner::make_item(const bench_request& req, int64_t end_pos, bool sample, int64_t truncate_below) const {
  step_item it;
  it.request_id = req.id;
  it.tokens.assign(req.tokens.begin(), req.tokens.begin() + end_pos);
  it.start_pos = req.num_computed;
  it.page_ids = req.page_ids;
  it.ring_slot = req.slot;
  it.truncate_below = truncate_below;
  it.sample = sample;  // sampling: greedy (temperature 0)
  it.token_idx = req.num_generated;
  return it;
}

step_output runner::run(std::vector<step_item> items) {
  step_output out = shard_.run(run_step{next_step_++, std::move(items)});
  if (!out.error.empty()) throw std::runtime_error("step failed: " + out.error);
  return out;
}

std::vector<bench_request> runner::decode_requests(int first, int count) {
  const int calls = o_.warmup_steps + o_.steps;
  std::vector<bench_request> reqs;
  for (int b = first; b < first + count; ++b) {
    // The context's tokens (history for Engram) and the token the first step runs.
    reqs.push_back(new_request(random_tokens(o_.context + 1, args_.vocab_size, o_.seed * 1000003 + uint64_t(b)),
                               o_.context + calls + 1));
    reqs.back().num_computed = o_.context;
  }
  fill_synthetic_kv(layout_, shard_.arena(), reqs, o_.context, o_.seed, first);
  return reqs;
}

void runner::decode_step(std::vector<bench_request>& reqs) {
  std::vector<step_item> items;
  for (const bench_request& req : reqs) {
    items.push_back(make_item(req, req.num_computed + 1, true, -1));
    if (o_.temperature > 0)  // --temperature, --top-p
      items.back().sampling = {.temperature = o_.temperature, .top_p = o_.top_p, .seed = o_.seed + req.id};
  }
  if (o_.logprobs > 0 && !items.empty()) items.front().sampling.logprobs = o_.logprobs;  // --logprobs: one request
  const step_output out = run(std::move(items));
  for (std::size_t b = 0; b < reqs.size(); ++b) {
    ++reqs[b].num_computed, ++reqs[b].num_generated;
    reqs[b].tokens.push_back(out.results[b].token.token_id);
  }
}

decode_result runner::decode(int batch) {
  const int calls = o_.warmup_steps + o_.steps;
  decode_result r;
  r.batch = batch, r.context = o_.context, r.steps = o_.steps;
  const auto t0 = clock_type::now();
  std::vector<bench_request> reqs = decode_requests(0, batch);
  r.fill_s = seconds_since(t0);
  if (o_.progress)
    std::fprintf(stderr, "gpu-bench: decode batch %d: synthetic KV of %lld tokens per request in %.2f s\n", batch,
                 (long long)o_.context, r.fill_s);
  double timed_s = 0;
  r.min_step_ms = 1e300;
  for (int step = 0; step < calls; ++step) {
    const auto ts = clock_type::now();
    decode_step(reqs);
    const double s = seconds_since(ts);
    if (step >= o_.warmup_steps) timed_s += s, r.min_step_ms = std::min(r.min_step_ms, 1e3 * s);
    if (o_.progress && (step + 1 == calls || (step + 1) % 8 == 0))
      std::fprintf(stderr, "gpu-bench: decode batch %d: step %d of %d, %.2f ms\n", batch, step + 1, calls, 1e3 * s);
  }
  r.step_ms = 1e3 * timed_s / std::max(1, o_.steps);
  r.tok_s = r.step_ms > 0 ? 1e3 * batch / r.step_ms : 0;
  finish_decode_result(r, args_, layout_, ceil_, 1);
  return r;
}

void finish_decode_result(decode_result& r, const model_args& args, const kv_layout& layout, const ceilings& c,
                          int devices) {
  r.experts_touched = expected_experts_touched(args, r.batch);
  r.parts = decode_step_bytes(args, layout, r.context, r.batch);
  r.floor_bytes = 0;
  for (const step_bytes_part& p : r.parts) r.floor_bytes += p.bytes;
  if (c.copy_gbps > 0) {
    r.floor_ms = r.floor_bytes / (c.copy_gbps * 1e6 * devices);
    r.floor_fraction = r.step_ms > 0 ? r.floor_ms / r.step_ms : 0;
  }
}

runner::prefill_run& runner::prefill_cached(int64_t tokens, bool truncate) {
  const auto key = std::make_pair(tokens, truncate);
  if (auto it = runs_.find(key); it != runs_.end()) return it->second;
  prefill_run pr;
  pr.req = new_request(random_tokens(tokens, args_.vocab_size, o_.seed * 7919 + uint64_t(tokens)),
                        tokens + o_.gen_tokens + 1);
  bench_request& req = pr.req;
  prefill_result& r = pr.result;
  r.tokens = tokens, r.truncated = truncate, r.chunk = o_.chunk;
  r.rows_per_layer.assign(std::size_t(args_.num_hidden_layers), 0);
  const int64_t truncate_below = truncate ? tokens - layout_.window : -1;  // the scheduler's admit
  const auto t0 = clock_type::now();
  while (req.num_computed < tokens) {
    const int64_t n = std::min<int64_t>(o_.chunk, tokens - req.num_computed);
    const bool last = req.num_computed + n == tokens;
    const step_output out = run({make_item(req, req.num_computed + n, last, truncate_below)});
    add_rows(args_, req.num_computed, n, truncate_below, r.rows_per_layer);
    req.num_computed += n;
    if (last) pr.first_token = out.results[0].token.token_id, ++req.num_generated;
    if (o_.progress)
      std::fprintf(stderr, "gpu-bench: prefill %lld%s: %lld of %lld tokens, %.2f s\n", (long long)tokens,
                   truncate ? " (truncated)" : "", (long long)req.num_computed, (long long)tokens, seconds_since(t0));
  }
  r.seconds = seconds_since(t0);
  req.tokens.push_back(pr.first_token);
  r.tok_s = double(tokens) / std::max(r.seconds, 1e-9);
  for (int64_t rows : r.rows_per_layer) r.rows_total += rows;
  r.linear_flops = linear_flops_of(flops_, r.rows_per_layer, 1);
  r.tflops = r.linear_flops / std::max(r.seconds, 1e-9) / 1e12;
  r.blas_fraction = ceil_.blas_tflops > 0 ? r.tflops / ceil_.blas_tflops : 0;
  return runs_.emplace(key, std::move(pr)).first->second;
}

prefill_result runner::prefill(int64_t tokens, bool truncate) { return prefill_cached(tokens, truncate).result; }

truncation_result runner::truncation(int64_t tokens) {
  truncation_result t;
  t.full = prefill(tokens, false);
  t.truncated = prefill(tokens, true);
  t.speedup = t.full.seconds / std::max(t.truncated.seconds, 1e-9);
  return t;
}

prefix_result runner::prefix() {
  prefix_result r;
  r.prefix_tokens = o_.prefix_tokens, r.new_tokens = o_.new_tokens, r.truncated = o_.truncate;
  const int P = layout_.page_tokens;
  const int64_t total = o_.prefix_tokens + o_.new_tokens;
  const replay_plan plan = plan_replay(o_.prefix_tokens, layout_.window, layout_.num_layers, swa_replay_mode::bounded);
  if (o_.prefix_tokens % P != 0 || plan.cached_tokens != o_.prefix_tokens)
    throw std::runtime_error("--prefix-tokens must be whole pages of " + std::to_string(P) +
                             " tokens, longer than the window");
  // The cold turn: the whole prompt prefilled; its first pages are what the prefix cache holds.
  prefill_run& cold = prefill_cached(total, o_.truncate);
  r.cold_ttft_s = cold.result.seconds;
  // The hit: a fresh slot (rings and tails zero), the cached pages adopted, its own pages after.
  bench_request hit = new_request(std::vector<int32_t>(cold.req.tokens.begin(), cold.req.tokens.begin() + total),
                                  total + 1);
  std::copy_n(cold.req.page_ids.begin(), o_.prefix_tokens / P, hit.page_ids.begin());
  hit.num_computed = plan.replay_from;
  r.replay_tokens = plan.replay_tokens();
  const int64_t truncate_below = o_.truncate ? total - layout_.window : -1;
  step_item replay = make_item(hit, plan.cached_tokens, false, truncate_below);
  replay.replay = true;
  auto t0 = clock_type::now();
  run({std::move(replay)});
  r.replay_s = seconds_since(t0);
  hit.num_computed = plan.cached_tokens;
  t0 = clock_type::now();
  const step_output out = run({make_item(hit, total, true, truncate_below)});
  r.new_s = seconds_since(t0);
  r.hit_ttft_s = r.replay_s + r.new_s;
  r.speedup = r.cold_ttft_s / std::max(r.hit_ttft_s, 1e-9);
  r.first_token_equal = out.results[0].token.token_id == cold.first_token;
  if (o_.progress)
    std::fprintf(stderr, "gpu-bench: prefix %lld + %d: cold %.2f s, hit %.3f s (replay %lld tokens %.3f s)\n",
                 (long long)o_.prefix_tokens, o_.new_tokens, r.cold_ttft_s, r.hit_ttft_s,
                 (long long)r.replay_tokens, r.replay_s);
  return r;
}

generate_result runner::generate(double load_s) {
  generate_result g;
  g.prompt_tokens = o_.gen_prompt, g.gen_tokens = o_.gen_tokens, g.truncated = o_.truncate, g.load_s = load_s;
  prefill_run& prompt_run = prefill_cached(o_.gen_prompt, o_.truncate);
  g.prefill_s = prompt_run.result.seconds;
  g.prefill_tok_s = prompt_run.result.tok_s;
  bench_request& req = prompt_run.req;
  const auto t0 = clock_type::now();
  for (int step = 1; step < o_.gen_tokens; ++step) {
    const step_output out = run({make_item(req, req.num_computed + 1, true, -1)});
    ++req.num_computed, ++req.num_generated;
    req.tokens.push_back(out.results[0].token.token_id);
    if (o_.progress && step % 32 == 0)
      std::fprintf(stderr, "gpu-bench: generate: %d of %d tokens, %.2f s\n", step, o_.gen_tokens, seconds_since(t0));
  }
  g.decode_s = seconds_since(t0);
  g.decode_tok_s = o_.gen_tokens > 1 ? (o_.gen_tokens - 1) / std::max(g.decode_s, 1e-9) : 0;
  runs_.erase({o_.gen_prompt, o_.truncate});  // its KV has moved on past the prompt
  return g;
}

}  // namespace cedar::cli::gpu_bench
