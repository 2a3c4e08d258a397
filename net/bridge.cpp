// The runtime behind the bridge: net's requests become actors' request_specs, the runtime's
// token batches become net's. The only net/ file that includes the runtime (bridge.hpp takes
// only the plain grammar type of actors/output_grammar.hpp). Cancels and session
// closes go through one worker thread, so an I/O strand never waits on an actor round trip.
//
// Conversations: net names one by a key (generate_request::session_id) and always sends the
// whole prompt. The bridge keeps, per key, a runtime session and the tokens it holds (prompts
// and completions). When the new prompt extends them, only the new tokens are submitted to the
// session, whose pages the runtime keeps warm; otherwise (the conversation was edited, a
// reply was cut off before its end token) the key moves to a fresh session with the whole
// prompt. A second turn on a key while one runs (a fork of a Responses chain) runs alone.
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include "actors/engine.hpp"
#include "net/bridge.hpp"
#include "net/json_writer.hpp"

namespace cedar::net {

namespace {

finish_reason finish_of(const std::string& reason) {
  if (reason == "stop") return finish_reason::stop;
  if (reason == "length") return finish_reason::length;
  if (reason == "cancelled") return finish_reason::cancelled;
  return finish_reason::error;
}

submit_status status_of(engine_errc c) {
  switch (c) {
    case engine_errc::prompt_too_long: return submit_status::too_long;
    case engine_errc::kv_exhausted: return submit_status::too_long;
    case engine_errc::draining: return submit_status::not_ready;
    case engine_errc::shard_failed: return submit_status::not_ready;
    case engine_errc::session_busy: return submit_status::overloaded;
    default: return submit_status::invalid;
  }
}

class runtime_bridge final : public engine_bridge {
 public:
  runtime_bridge(std::unique_ptr<cedar::engine> runtime, std::string name, std::string layout, int page_tokens)
      : runtime_(std::move(runtime)), name_(std::move(name)), layout_(std::move(layout)),
        page_tokens_(page_tokens) {
    worker_ = std::thread([this] { work(); });
  }
  ~runtime_bridge() override { shutdown(); }

  engine_summary summary() const override {
    auto m = runtime_->metrics();
    const auto& a = runtime_->args();
    std::string layout = layout_;
    if (auto l = runtime_->layout_info())
      layout = l.value().layout + " on " + std::to_string(l.value().shards.size()) + " shard(s), " + layout_;
    return {name_, layout, m.pages_total * page_tokens_, a.vocab_size,
            int(m.context_tokens ? m.context_tokens
                                 : std::min<int64_t>(a.max_position_embeddings, m.pages_total * page_tokens_))};
  }

  submit_result submit(generate_request r, token_callback on_tokens) override {
    request_spec spec;
    spec.max_tokens = r.max_tokens;
    spec.stop_ids = std::move(r.stop_ids);
    spec.ignore_eos = r.ignore_eos;
    spec.min_tokens = std::min(r.min_tokens, r.max_tokens);
    spec.sampling.temperature = r.sampling.temperature;
    spec.sampling.top_p = r.sampling.top_p;
    spec.sampling.top_k = r.sampling.top_k;
    spec.sampling.min_p = r.sampling.min_p;
    spec.sampling.frequency_penalty = r.sampling.frequency_penalty;
    spec.sampling.presence_penalty = r.sampling.presence_penalty;
    spec.sampling.repetition_penalty = r.sampling.repetition_penalty;
    for (auto [id, bias] : r.sampling.logit_bias)
      spec.sampling.bias_ids.push_back(id), spec.sampling.bias_values.push_back(bias);
    spec.sampling.seed = r.sampling.has_seed ? r.sampling.seed : random_seed();
    spec.sampling.logprobs = std::max(0, r.top_logprobs);
    spec.grammar = std::move(r.grammar);
    spec.banned_ids = std::move(r.banned_ids);
    spec.lead = std::move(r.lead);
    bool want_logprobs = r.top_logprobs >= 0;
    const uint64_t key = r.session_id;
    std::vector<int32_t> before;  // the session's tokens before this turn, restored on refusal
    if (key == 0 || !begin_turn(key, r.prompt_ids, spec, before)) spec.prompt = std::move(r.prompt_ids);
    const bool in_session = spec.session_id != 0;
    auto id = runtime_->submit(std::move(spec), [this, cb = std::move(on_tokens), want_logprobs, key,
                                                 in_session](const cedar::token_batch& b) {
      if (b.finished) forget(b.request_id);
      if (in_session) session_tokens(key, b);
      cb(convert(b, want_logprobs));
    });
    if (!id) {
      if (in_session) end_turn(key, &before);
      return {status_of(id.error().code), 0, id.error().message};
    }
    std::lock_guard lock(mutex_);
    // the final batch may have come (on an actor thread) before submit returned
    if (!finished_early_.erase(id.value())) live_.insert(id.value());
    return {submit_status::ok, id.value(), {}};
  }

  void cancel(uint64_t request_id) override {
    post([this, request_id] { runtime_->cancel(request_id); });
  }

  void close_session(uint64_t key) override {
    std::lock_guard lock(mutex_);
    auto it = sessions_.find(key);
    if (it == sessions_.end()) return;
    if (it->second.busy) {  // closed when its turn ends
      it->second.closing = true;
      return;
    }
    close_locked(it);
  }

  engine_metrics metrics() const override {
    auto m = runtime_->metrics();
    engine_metrics e;
    e.num_running = int(m.requests_running);
    e.num_waiting = int(m.requests_waiting);
    e.num_kv_pages_used = m.pages_used;
    e.num_kv_pages_cached = m.pages_cached_idle;
    e.num_kv_pages_free = m.pages_free;
    e.num_prefix_lookup_tokens = m.prefix_queried_tokens;
    e.num_prefix_hit_tokens = m.prefix_hit_tokens;
    e.topology_state = stopping_ ? "draining" : "serving";
    {
      std::lock_guard lock(mutex_);
      e.num_sessions_open = int64_t(sessions_.size());
      e.num_session_turns_extended = turns_extended_;
      e.num_session_turns_restarted = turns_restarted_;
    }
    if (auto l = runtime_->layout_info()) {
      const layout_status& s = l.value();
      e.topology = s.layout;
      if (s.switching) e.topology_state = "switching";
      e.num_shards = int(s.shards.size());
      e.num_shards_alive = 0;
      for (auto& shard : s.shards) e.num_shards_alive += shard.alive ? 1 : 0;
      e.num_layout_switches = s.switches;
      e.num_layout_rebuilds = s.rebuilds;
      e.group_running = s.group_running;
      e.group_waiting = s.group_waiting;
    }
    return e;
  }

  std::string layout_status_json() const override {
    auto l = runtime_->layout_info();
    if (!l) return {};
    const layout_status& s = l.value();
    json_writer w;
    w.obj().kv("layout", s.layout).kv("generation", int64_t(s.generation)).kv("switching", s.switching)
        .kv("switches", s.switches).kv("rebuilds", s.rebuilds).kv("last_switch_ms", s.last_switch_ms)
        .kv("last_fault", s.last_fault);
    w.key("shards").arr();
    for (const shard_status& sh : s.shards)
      w.obj().kv("rank", int(sh.rank)).kv("group", int(sh.group)).kv("alive", sh.alive).kv("remote", sh.remote)
          .kv("device", sh.device)
          .kv("steps", sh.steps).kv("rows", sh.rows).end_obj();
    w.end_arr().key("groups").arr();
    for (std::size_t g = 0; g < s.group_running.size(); ++g)
      w.obj().kv("group", int(g)).kv("running", s.group_running[g]).kv("waiting", s.group_waiting[g]).end_obj();
    w.end_arr().end_obj();
    return w.take();
  }

  std::string kill_shard(int rank) override {
    const status s = runtime_->kill_shard(rank);
    return s.ok() ? std::string() : s.error().message;
  }

  void switch_layout(const std::string& layout,
                     std::function<void(int, std::string, std::string)> done) override {
    runtime_->switch_layout(layout, [done = std::move(done)](outcome<switch_result> r) {
      // another switch running: 409, worth a retry; anything else the request's fault
      const auto status = [](engine_errc c) { return c == engine_errc::busy ? 409 : 400; };
      if (!r) return done(status(r.error().code), r.error().message, {});
      const switch_result& s = r.value();
      if (s.error_code != -1) return done(status(engine_errc(s.error_code)), s.error_message, {});
      char line[256];
      std::snprintf(line, sizeof line,
                    "{\"layout\":\"%s\",\"pause_ms\":%.3f,\"rehome_ms\":%.3f,\"requests_moved\":%lld,"
                    "\"pages_copied\":%lld}",
                    s.layout.c_str(), s.pause_ms, s.rehome_ms, (long long)s.requests_moved,
                    (long long)s.pages_copied);
      done(200, {}, line);
    });
  }

  bool ready() const override {
    // ready() asks the scheduler; cache it briefly so every request does not pay a round trip.
    auto now = std::chrono::steady_clock::now();
    std::lock_guard lock(ready_mutex_);
    if (now - ready_checked_ > std::chrono::milliseconds(200)) {
      ready_ = !stopping_ && runtime_->ready();
      ready_checked_ = now;
    }
    return ready_;
  }

  void shutdown() override {
    std::set<uint64_t> live;
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
      wake_.notify_one();
      live = live_;
    }
    worker_.join();
    for (uint64_t id : live) runtime_->cancel(id);
    runtime_->drain(2000);
  }

 private:
  static token_batch convert(const cedar::token_batch& b, bool want_logprobs) {
    token_batch out;
    out.ids = b.ids;
    if (want_logprobs) {
      out.logprobs = b.logprobs;
      out.top.resize(b.top_ids.size());
      for (size_t i = 0; i < b.top_ids.size(); ++i)
        for (size_t k = 0; k < b.top_ids[i].size(); ++k)
          out.top[i].push_back({b.top_ids[i][k], k < b.top_logprobs[i].size() ? b.top_logprobs[i][k] : 0.f});
    }
    if (b.finished) out.finished = finish_of(b.finish_reason);
    out.error = b.error;
    out.num_prompt_tokens = int(b.usage.prompt_tokens);
    out.num_cached_tokens = int(b.usage.cached_prompt_tokens);
    return out;
  }

  /// Points `spec` at key's runtime session: the new tokens when `prompt` extends what the
  /// session holds, else a fresh session and the whole prompt. False: run without a session.
  bool begin_turn(uint64_t key, std::vector<int32_t>& prompt, request_spec& spec, std::vector<int32_t>& before) {
    uint64_t stale = 0;
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return false;
      conversation& c = sessions_[key];
      if (c.busy || c.closing) return false;
      c.busy = true;
      const bool extends = c.runtime_id != 0 && c.tokens.size() < prompt.size() &&
                           std::equal(c.tokens.begin(), c.tokens.end(), prompt.begin());
      if (extends) {
        ++turns_extended_;
        spec.session_id = c.runtime_id;
        spec.prompt.assign(prompt.begin() + std::ptrdiff_t(c.tokens.size()), prompt.end());
        before = c.tokens;
        c.tokens = std::move(prompt);
        return true;
      }
      if (c.runtime_id) ++turns_restarted_;
      stale = std::exchange(c.runtime_id, 0);
      c.tokens.clear();
    }
    if (stale) runtime_->close_session(stale);
    auto opened = runtime_->open_session();
    std::lock_guard lock(mutex_);
    conversation& c = sessions_[key];
    if (!opened) {
      sessions_.erase(key);
      return false;
    }
    c.runtime_id = opened.value();
    spec.session_id = c.runtime_id;
    spec.prompt = prompt;
    c.tokens = std::move(prompt);
    return true;
  }

  /// A session turn's batch: the runtime appended its tokens to the session; so do we.
  void session_tokens(uint64_t key, const cedar::token_batch& b) {
    std::lock_guard lock(mutex_);
    auto it = sessions_.find(key);
    if (it == sessions_.end()) return;
    it->second.tokens.insert(it->second.tokens.end(), b.ids.begin(), b.ids.end());
    if (!b.finished) return;
    it->second.busy = false;
    if (it->second.closing) close_locked(it);
  }

  /// A session turn was refused: the session holds `before` again.
  void end_turn(uint64_t key, std::vector<int32_t>* before) {
    std::lock_guard lock(mutex_);
    auto it = sessions_.find(key);
    if (it == sessions_.end()) return;
    it->second.tokens = std::move(*before);
    it->second.busy = false;
    if (it->second.closing) close_locked(it);
  }

  struct conversation {
    uint64_t runtime_id = 0;        ///< the runtime's session (0 = none yet)
    std::vector<int32_t> tokens;    ///< what that session holds: prompts and completions
    bool busy = false;              ///< a turn is running
    bool closing = false;           ///< close when that turn ends
  };

  void close_locked(std::unordered_map<uint64_t, conversation>::iterator it) {
    uint64_t id = it->second.runtime_id;
    sessions_.erase(it);
    if (id && !stopping_) {
      jobs_.push_back([this, id] { runtime_->close_session(id); });
      wake_.notify_one();
    }
  }

  void forget(uint64_t request_id) {
    std::lock_guard lock(mutex_);
    if (!live_.erase(request_id)) finished_early_.insert(request_id);
  }

  static uint64_t random_seed() {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    return rng();
  }

  void post(std::function<void()> job) {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    jobs_.push_back(std::move(job));
    wake_.notify_one();
  }

  void work() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::unique_ptr<cedar::engine> runtime_;
  std::string name_, layout_;
  int page_tokens_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  std::set<uint64_t> live_;  ///< submitted and not finished
  std::set<uint64_t> finished_early_;  ///< finished before submit() returned their id
  std::unordered_map<uint64_t, conversation> sessions_;  ///< by net's conversation key
  int64_t turns_extended_ = 0, turns_restarted_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread worker_;
  mutable std::mutex ready_mutex_;
  mutable bool ready_ = false;
  mutable std::chrono::steady_clock::time_point ready_checked_{};
};

}  // namespace

std::unique_ptr<engine_bridge> make_runtime_bridge(std::unique_ptr<cedar::engine> runtime, std::string model_name,
                                                   std::string layout, int page_tokens) {
  return std::make_unique<runtime_bridge>(std::move(runtime), std::move(model_name), std::move(layout),
                                          page_tokens);
}

}  // namespace cedar::net
