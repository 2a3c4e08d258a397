// The scheduler policy's bookkeeping: submit / cancel validation, applying a step's output
// (tokens appended, stop conditions, pages published), finishing and metrics. The stages
// that build a step are in scheduler_step.cpp.
#include "actors/scheduler.hpp"

#include <algorithm>

namespace cedar {
namespace {

constexpr std::size_t max_latency_samples = 4096;

double ms_between(steady_time a, steady_time b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

const char* errc_name(engine_errc c) {
  switch (c) {
    case engine_errc::prompt_too_long: return "prompt_too_long";
    case engine_errc::bad_params: return "bad_params";
    case engine_errc::unknown_session: return "unknown_session";
    case engine_errc::unknown_request: return "unknown_request";
    case engine_errc::session_busy: return "session_busy";
    case engine_errc::cancelled: return "cancelled";
    case engine_errc::kv_exhausted: return "kv_exhausted";
    case engine_errc::draining: return "draining";
    case engine_errc::shard_failed: return "shard_failed";
    case engine_errc::busy: return "busy";
  }
  return "unknown";
}

scheduler::scheduler(const model_args& args, const kv_layout& layout, const engine_options& options)
    : args_(args),
      layout_(layout),
      options_(options),
      pool_(plan_kv_capacity(layout, options.kv_budget_bytes, options.max_num_seqs)),
      cache_(layout.page_tokens, pool_) {
  CEDAR_CHECK(layout.page_tokens == options.page_tokens);
  context_tokens_ = std::min<int64_t>(args.max_position_embeddings,
                                      int64_t(pool_.capacity().num_pages) * layout.page_tokens);
  lookback_ = args.history_lookback();
}

std::optional<engine_error> scheduler::check(const request_spec& spec, bool accepted) const {
  const int64_t n = int64_t(spec.prompt.size());
  if (draining_ && !accepted)
    return engine_error{engine_errc::draining, "the engine is draining and takes no new requests"};
  if (n == 0) return engine_error{engine_errc::bad_params, "the prompt is empty"};
  if (spec.min_tokens < 0 || spec.min_tokens > spec.max_tokens)
    return engine_error{engine_errc::bad_params, "min_tokens must be in [0, max_tokens]"};
  if (spec.max_tokens < 1)
    return engine_error{engine_errc::bad_params,
                        "max_tokens must be >= 1 (got " + std::to_string(spec.max_tokens) + ")"};
  for (int32_t t : spec.prompt)
    if (t < 0 || t >= args_.vocab_size)
      return engine_error{engine_errc::bad_params, "prompt token id " + std::to_string(t) + " is outside [0, " +
                                                       std::to_string(args_.vocab_size) + ")"};
  for (int32_t t : spec.stop_ids)
    if (t < 0 || t >= args_.vocab_size)
      return engine_error{engine_errc::bad_params, "stop id " + std::to_string(t) + " is outside the vocabulary"};
  if (auto e = validate(spec.sampling, args_.vocab_size); !e.empty()) return engine_error{engine_errc::bad_params, e};
  if (spec.grammar.active()) {
    if (!options_.vocab)
      return engine_error{engine_errc::bad_params, "structured output needs the served tokenizer's vocabulary"};
    if (std::size_t(spec.grammar.root) >= spec.grammar.nodes.size())
      return engine_error{engine_errc::bad_params, "the response format's grammar has no root node"};
  }
  for (const auto& choice : spec.lead.choices) {
    if (choice.empty()) return engine_error{engine_errc::bad_params, "a forced tool call's choice has no token"};
    for (int32_t t : choice)
      if (t < 0 || t >= args_.vocab_size)
        return engine_error{engine_errc::bad_params,
                            "forced token id " + std::to_string(t) + " is outside the vocabulary"};
  }
  if (spec.lead.active() && spec.grammar.active())
    return engine_error{engine_errc::bad_params, "a forced tool call cannot also follow a response format"};
  if (pool_.capacity().num_slots == 0 || pool_.capacity().num_pages == 0)
    return engine_error{engine_errc::kv_exhausted, "the KV budget holds no page or no ring slot"};
  if (n >= context_tokens_) {
    const bool by_kv = context_tokens_ < args_.max_position_embeddings;
    return engine_error{by_kv ? engine_errc::kv_exhausted : engine_errc::prompt_too_long,
                        "the prompt has " + std::to_string(n) + " tokens; the " +
                            (by_kv ? std::string("KV budget") : std::string("context")) + " holds at most " +
                            std::to_string(context_tokens_ - 1) + " prompt tokens"};
  }
  return std::nullopt;
}

outcome<uint64_t> scheduler::submit(request_spec spec, bool accepted) {
  if (auto e = check(spec, accepted)) return *e;
  const int64_t n = int64_t(spec.prompt.size());
  const uint64_t id = next_request_id_++;
  request_state r;
  r.id = id;
  r.tokens = spec.prompt;
  r.prompt_len = n;
  r.spec = std::move(spec);
  r.spec.prompt.clear();  // kept once, in tokens
  r.spec.sampling.prompt_ids.clear();  // the request's own, below: not copied into every step
  if (r.spec.sampling.repetition_penalty != 1.f) {
    auto& ids = r.prompt_ids;
    ids = r.tokens;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  }
  r.submit_time = std::chrono::steady_clock::now();
  if (r.spec.grammar.active() && r.spec.grammar.start_after < 0) r.matcher.emplace();
  if (r.spec.lead.active() && r.spec.lead.after < 0) r.lead_begin = r.prompt_len;
  requests_.emplace(id, std::move(r));
  waiting_.push_back(id);
  return id;
}

status scheduler::cancel(uint64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end())
    return engine_error{engine_errc::unknown_request,
                        "request " + std::to_string(request_id) + " is not running (unknown or already finished)"};
  it->second.cancel_requested = true;
  if (!in_flight_) reap_cancelled();
  return ok_t{};
}

bool scheduler::apply(const step_output& out) {
  if (!in_flight_ || out.step_id != in_flight_->step_id) return false;
  const in_flight_step step = std::move(*in_flight_);
  in_flight_.reset();
  ++counters_.steps;
  for (std::size_t i = 0; i < step.items.size(); ++i) {
    auto it = requests_.find(step.items[i].request_id);
    CEDAR_CHECK(it != requests_.end());
    request_state& r = it->second;
    if (!out.error.empty()) {
      finish(r, "error", "shard failed: " + out.error);
      continue;
    }
    CEDAR_CHECK(i < out.results.size() && out.results[i].request_id == r.id);
    if (step.items[i].replay) {
      r.num_computed = r.replay_to;
      r.replay_from = r.replay_to = -1;
    } else {
      counters_.tokens_in += std::max<int64_t>(0, std::min(step.items[i].end_pos, r.prompt_len) - r.num_computed);
      r.num_computed = step.items[i].end_pos;
    }
    publish_full_pages(r);
    if (r.cancel_requested || !out.results[i].has_token) continue;
    token_batch batch = make_batch(r);
    append_token(r, out.results[i], batch);
    if (!follow_grammar(r)) {  // a shard that ignored the mask: a broken invariant, reported
      finish(r, "error", "the sampled token leaves the response format");
      continue;
    }
    if (!follow_lead(r)) {
      finish(r, "error", "the sampled token leaves the forced tool call");
      continue;
    }
    const char* reason = stop_reason(r);
    batch.usage.completion_tokens = r.completion_tokens();
    if (reason) batch.finished = true, batch.finish_reason = reason;
    events_.push_back(std::move(batch));
    if (reason) retire(r);
  }
  reap_cancelled();
  return true;
}

void scheduler::append_token(request_state& r, const item_result& res, token_batch& batch) {
  const auto now = std::chrono::steady_clock::now();
  if (r.completion_tokens() == 0)
    record_sample(counters_.ttft_ms, ms_between(r.submit_time, now));
  else
    record_sample(counters_.itl_ms, ms_between(r.last_token_time, now));
  r.last_token_time = now;
  r.tokens.push_back(res.token.token_id);
  if (r.spec.sampling.has_penalty()) ++r.seen[res.token.token_id];
  ++counters_.tokens_out;
  batch.ids.push_back(res.token.token_id);
  batch.logprobs.push_back(res.token.logprob);
  if (r.spec.sampling.logprobs > 0) {
    batch.top_ids.push_back(res.token.top_ids);
    batch.top_logprobs.push_back(res.token.top_logprobs);
  }
}

bool scheduler::follow_grammar(request_state& r) const {
  if (!r.spec.grammar.active()) return true;
  const int32_t token = r.tokens.back();
  if (!r.matcher) {
    if (token == r.spec.grammar.start_after) r.matcher.emplace();
    return true;
  }
  if (token == args_.eos_token_id) return r.matcher->can_end(r.spec.grammar);
  if (token >= options_.vocab->size()) return false;
  for (char c : options_.vocab->bytes(token))
    if (!r.matcher->feed(r.spec.grammar, uint8_t(c))) return false;
  return true;
}

namespace {

/// The ids that continue r's forced lead (the lead started, not done): the next id of every
/// choice that the tokens since the lead's start begin; `whole` is set when they spell one.
std::vector<int32_t> lead_next(const request_state& r, bool* whole = nullptr) {
  const auto done = r.tokens.begin() + r.lead_begin;
  const auto n = std::size_t(r.tokens.end() - done);
  std::vector<int32_t> next;
  for (const auto& choice : r.spec.lead.choices) {
    if (choice.size() < n || !std::equal(done, r.tokens.end(), choice.begin())) continue;
    if (choice.size() == n) {
      if (whole) *whole = true;
    } else {
      next.push_back(choice[n]);
    }
  }
  return next;
}

}  // namespace

bool scheduler::follow_lead(request_state& r) const {
  if (!r.spec.lead.active() || r.lead_done) return true;
  if (r.lead_begin < 0) {
    if (r.tokens.back() == r.spec.lead.after) r.lead_begin = int64_t(r.tokens.size());
    return true;
  }
  bool whole = false;
  const bool more = !lead_next(r, &whole).empty();
  r.lead_done = whole;
  return whole || more;
}

std::vector<uint64_t> scheduler::allowed_tokens(const request_state& r) const {
  const std::size_t words = (std::size_t(args_.vocab_size) + 63) / 64;
  std::vector<uint64_t> mask;
  if (r.in_lead()) {
    mask.assign(words, 0);
    for (int32_t id : lead_next(r))
      if (id >= 0 && id < args_.vocab_size) mask[std::size_t(id) / 64] |= uint64_t{1} << (id % 64);
  } else {
    mask = r.matcher ? options_.vocab->allowed(r.spec.grammar, *r.matcher)
                     : std::vector<uint64_t>(words, ~uint64_t{0});
  }
  mask.resize(words, 0);
  if (const std::size_t extra = mask.size() * 64 - std::size_t(args_.vocab_size); extra > 0)
    mask.back() &= ~uint64_t{0} >> extra;  // no id past the model's vocabulary
  auto ban = [&](int32_t id) {
    if (id >= 0 && id < args_.vocab_size) mask[std::size_t(id) / 64] &= ~(uint64_t{1} << (id % 64));
  };
  for (int32_t id : r.spec.banned_ids) ban(id);
  if (r.completion_tokens() < r.spec.min_tokens) {
    ban(args_.eos_token_id);
    for (int32_t id : r.spec.stop_ids) ban(id);
  }
  if (std::all_of(mask.begin(), mask.end(), [](uint64_t w) { return w == 0; }))
    mask[std::size_t(args_.eos_token_id) / 64] |= uint64_t{1} << (args_.eos_token_id % 64);  // a dead end: stop
  return mask;
}

const char* scheduler::stop_reason(const request_state& r) const {
  const int32_t last = r.tokens.back();
  if (!r.spec.ignore_eos && last == args_.eos_token_id) return "stop";
  if (std::find(r.spec.stop_ids.begin(), r.spec.stop_ids.end(), last) != r.spec.stop_ids.end()) return "stop";
  if (r.completion_tokens() >= r.spec.max_tokens) return "length";
  if (int64_t(r.tokens.size()) >= context_tokens_) return "length";
  return nullptr;
}

token_batch scheduler::make_batch(const request_state& r) const {
  token_batch b;
  b.request_id = r.id;
  b.session_id = r.spec.session_id;
  b.usage.prompt_tokens = r.prompt_len;
  b.usage.cached_prompt_tokens = r.cached_prompt_tokens;
  b.usage.completion_tokens = r.completion_tokens();
  return b;
}

void scheduler::publish_full_pages(request_state& r) {
  const int64_t full = std::min<int64_t>(r.num_computed / layout_.page_tokens, int64_t(r.pages.size()));
  if (!options_.prefix_cache || full <= r.published_pages) return;
  cache_.publish(r.tokens, r.pages, full, r.spec.session_id);
  r.published_pages = full;
}

void scheduler::release_kv(request_state& r) {
  publish_full_pages(r);
  for (int32_t p : r.pages) pool_.release(p);
  r.pages.clear();
  r.published_pages = 0;
  if (r.slot >= 0) pool_.free_slot(r.slot);
  r.slot = -1;
  r.num_computed = 0;
  r.replay_from = r.replay_to = -1;
}

void scheduler::finish(request_state& r, const char* reason, std::string error) {
  token_batch b = make_batch(r);
  b.finished = true;
  b.finish_reason = reason;
  b.error = std::move(error);
  events_.push_back(std::move(b));
  retire(r);
}

void scheduler::retire(request_state& r) {
  release_kv(r);
  const uint64_t id = r.id;
  std::erase(running_, id);
  std::erase(waiting_, id);
  requests_.erase(id);
}

std::vector<token_batch> scheduler::take_events() { return std::exchange(events_, {}); }

void scheduler::session_opened(uint64_t session_id) { cache_.session_opened(session_id); }
void scheduler::session_closed(uint64_t session_id) { cache_.session_closed(session_id); }

void scheduler::record_sample(std::vector<double>& samples, double ms) {
  if (samples.size() >= max_latency_samples) samples.erase(samples.begin(), samples.begin() + max_latency_samples / 2);
  samples.push_back(ms);
}

metrics_snapshot scheduler::metrics() const {
  metrics_snapshot m = counters_;
  m.requests_running = int64_t(running_.size());
  m.requests_waiting = int64_t(waiting_.size());
  m.pages_total = pool_.capacity().num_pages;
  m.context_tokens = context_tokens_;
  m.pages_free = pool_.num_pages_free();
  m.pages_cached_idle = pool_.num_pages_idle_cached();
  m.pages_used = pool_.num_pages_referenced();
  m.ring_slots_used = pool_.num_slots_used();
  m.kv_bytes_used = pool_.bytes_in_use();
  m.kv_budget_bytes = pool_.capacity().budget_bytes;
  m.prefix_queried_tokens = cache_.queried_tokens();
  m.prefix_hit_tokens = cache_.hit_tokens();
  return m;
}

}  // namespace cedar
