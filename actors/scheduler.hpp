// The scheduler's policy: waiting and running queues, the step loop (continuous batching,
// chunked prefill under a token budget, decode batching, preemption under KV pressure),
// stop conditions, cancellation, and the prefix cache / replay / kv_pool it drives.
// Plain C++ and single-threaded: the scheduler actor owns one and calls it from its thread;
// tests drive it directly (next_step -> a shard -> apply).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "actors/errors.hpp"
#include "actors/kv_pool.hpp"
#include "actors/messages.hpp"
#include "actors/prefix_cache.hpp"
#include "actors/request.hpp"
#include "actors/transfer.hpp"
#include "config/engine_options.hpp"
#include "config/model_args.hpp"

namespace cedar {

class scheduler {
 public:
  /// `layout` must be the one the shards' model uses (same page size and dtype).
  scheduler(const model_args& args, const kv_layout& layout, const engine_options& options);

  /// Validates and queues a request (spec.prompt = the full prompt). Returns its id.
  /// accepted: the request was answered before a drain began (a submission held by a layout
  /// switch), so a drain does not refuse it.
  outcome<uint64_t> submit(request_spec spec, bool accepted = false);
  /// What submit would refuse `spec` for (its checks, without admitting it), or nothing.
  std::optional<engine_error> check(const request_spec& spec, bool accepted = false) const;
  /// Cancels a waiting or running request; its KV is freed at the next step boundary and a
  /// final batch with finish_reason "cancelled" is emitted.
  status cancel(uint64_t request_id);

  /// The next step to run, or nothing when no request can run. At most one step is in
  /// flight: call apply() with its output before asking for another.
  std::optional<run_step> next_step();
  /// Applies a shard's output. A reply for a step other than the one in flight is ignored
  /// (late or duplicate); returns whether it was applied.
  bool apply(const step_output& out);
  /// Token batches produced since the last call, in order.
  std::vector<token_batch> take_events();

  void session_opened(uint64_t session_id);
  void session_closed(uint64_t session_id);
  /// Stops admitting new requests (submit answers `draining`); running ones finish.
  void drain() { draining_ = true; }

  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  bool step_in_flight() const { return in_flight_.has_value(); }
  /// The id of the step in flight, or 0.
  uint64_t in_flight_step_id() const { return in_flight_ ? in_flight_->step_id : 0; }
  int64_t context_tokens() const { return context_tokens_; }
  metrics_snapshot metrics() const;
  const kv_pool& pool() const { return pool_; }
  const prefix_cache& cache() const { return cache_; }

  // scheduler_transfer.cpp: moving requests to another scheduler (layout switch, rebuild).
  /// Forgets the step in flight without applying it: its requests run those positions again,
  /// except those in `failed`, which finish with finish_reason "error" ("shard failed: " + error).
  void abandon_step(const std::vector<uint64_t>& failed = {}, const std::string& error = {});
  /// Removes and returns every running then waiting request (oldest first). Their KV is not
  /// released: the scheduler is about to be dropped. No step may be in flight.
  std::vector<request_transfer> take_requests();
  /// The prefix cache's chains of full pages, most recently used first.
  std::vector<page_chain> cached_chains() const { return cache_.export_chains(); }
  /// Caches a chain from another scheduler: allocates pages for what is not cached yet (as
  /// many as the pool holds) and publishes them; the caller copies the bytes in before the
  /// next step.
  adopted_pages adopt_chain(const page_chain& chain);
  /// Marks an adopted chain as used now: re-homing adopts chains most recent first (so they
  /// get the pages), then touches them least recent first, so the LRU order carries over.
  void touch_chain(const page_chain& chain) { cache_.touch_prefix(chain.tokens, chain.session_id); }
  /// Queues a moved request behind the ones already queued (adopt before new submissions);
  /// it resumes through the prefix cache (and SWA replay) like a preempted request.
  void adopt_request(request_transfer t);
  /// New requests get ids from `next` on (schedulers of one runtime use disjoint ranges).
  void set_next_request_id(uint64_t next) { next_request_id_ = next; }

 private:
  // scheduler_step.cpp: the stages of next_step().
  void reap_cancelled();
  void run_capacity_stage();
  void preempt(uint64_t request_id);
  void admit(uint64_t request_id);
  std::vector<step_item> run_budget_stage();
  bool ensure_pages(request_state& r, int64_t end_pos);
  step_item make_item(request_state& r, int64_t num_tokens);

  // scheduler.cpp: bookkeeping.
  /// Emits a final batch (no tokens) and retires the request.
  void finish(request_state& r, const char* reason, std::string error = {});
  /// Frees the request's KV (publishing its full pages first) and forgets it.
  void retire(request_state& r);
  void release_kv(request_state& r);
  void publish_full_pages(request_state& r);
  void append_token(request_state& r, const item_result& res, token_batch& batch);
  const char* stop_reason(const request_state& r) const;
  /// Structured output: moves r.matcher over r's newest token (starting it at the grammar's
  /// start token); false when the token does not fit the grammar.
  bool follow_grammar(request_state& r) const;
  /// A forced lead: moves r over its newest token (starting the lead at its `after` token and
  /// ending it once a choice is spelled in full); false when the token left every choice.
  bool follow_lead(request_state& r) const;
  /// The ids the next token may take: inside a forced lead, the choices' next ids; else the
  /// grammar's (when it has started); less the banned ids either way, and less EOS and the stop
  /// ids before min_tokens; EOS alone when nothing is left.
  std::vector<uint64_t> allowed_tokens(const request_state& r) const;
  token_batch make_batch(const request_state& r) const;
  void record_sample(std::vector<double>& samples, double ms);

  model_args args_;
  kv_layout layout_;
  engine_options options_;
  int64_t context_tokens_ = 0;
  int64_t lookback_ = 0;  ///< tokens before an item's first position that its step carries
  kv_pool pool_;
  prefix_cache cache_;
  std::map<uint64_t, request_state> requests_;  ///< every waiting or running request
  std::deque<uint64_t> waiting_;                ///< arrival order (preempted ones in front)
  std::vector<uint64_t> running_;               ///< admission order, oldest first
  struct flight_item {
    uint64_t request_id = 0;
    int64_t end_pos = 0;
    bool replay = false;
  };
  struct in_flight_step {
    uint64_t step_id = 0;
    std::vector<flight_item> items;
  };
  std::optional<in_flight_step> in_flight_;
  uint64_t next_step_id_ = 1;
  uint64_t next_request_id_ = 1;
  bool draining_ = false;
  std::vector<token_batch> events_;
  metrics_snapshot counters_;
};

}  // namespace cedar
