// The payloads of every runtime message, as plain structs (host data only: token ids, page
// ids, sampling params, step numbers). Policies build and read them without CAF; protocol.hpp
// gives each an inspect() so CAF can carry it, also to remote shards.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "actors/output_grammar.hpp"
#include "actors/sampler.hpp"

namespace cedar {

// ---- scheduler -> shard (hot path) ----

/// One request's slice of a step: run positions [start_pos, end_pos()) of the request.
struct step_item {
  uint64_t request_id = 0;
  /// The request's token ids [tokens_from, end_pos()): the ones before start_pos are the
  /// model's look-back (Engram n-grams), not the whole history, so a step's size does not grow
  /// with the context.
  std::vector<int32_t> tokens;
  int64_t tokens_from = 0;         ///< the position of tokens[0]
  int64_t start_pos = 0;           ///< KV positions already processed before this item
  std::vector<int32_t> page_ids;   ///< page i holds positions [i*page_tokens, (i+1)*page_tokens)
  int32_t ring_slot = -1;          ///< SWA ring and compressor tail slot
  bool replay = false;             ///< rebuild rings/tails only; cached pages are not rewritten
  int64_t truncate_below = -1;     ///< decoder layers skip rows below this position (-1: none)
  bool sample = false;             ///< sample a token after the last row
  sampling_params sampling;
  int64_t token_idx = 0;           ///< completion index of the token sampled (seeds the draw)

  int64_t end_pos() const { return tokens_from + int64_t(tokens.size()); }
};

/// Command: run one forward step. `step_id` increases by one per step.
struct run_step {
  uint64_t step_id = 0;
  std::vector<step_item> items;
};

/// One item's result, in item order.
struct item_result {
  uint64_t request_id = 0;
  bool has_token = false;
  sampled_token token;
};

/// Reply to run_step. `error` non-empty: the step failed and nothing of it may be applied.
struct step_output {
  uint64_t step_id = 0;
  std::vector<item_result> results;
  std::string error;
};

// ---- session / client <-> scheduler (control path) ----

/// What a client asks for. Either `prompt` (a fresh conversation) or, with session_id != 0,
/// the tokens to append to that session's history.
struct request_spec {
  uint64_t session_id = 0;           ///< 0 = none
  std::vector<int32_t> prompt;       ///< full prompt, or the new tokens of a session turn
  sampling_params sampling;
  int64_t max_tokens = 16;           ///< completion tokens at most (>= 1)
  std::vector<int32_t> stop_ids;     ///< besides EOS
  bool ignore_eos = false;
  int64_t min_tokens = 0;            ///< EOS and the stop ids are not sampled before this many
  output_grammar grammar;            ///< structured output (inactive: none)
  /// Never sampled (tool_choice "none": the tool-call marker). Ids past the model's vocabulary
  /// cannot be sampled anyway and are ignored.
  std::vector<int32_t> banned_ids;
  forced_lead lead;                  ///< a forced tool call (inactive: none)
};

/// Token counts of one request.
struct usage_counts {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  ///< prompt tokens whose KV came from the prefix cache
  int64_t completion_tokens = 0;
};

/// Event: tokens produced by one step for one request (possibly none when it finished
/// without a token, e.g. cancelled). finish_reason: "", "stop", "length", "cancelled", "error".
struct token_batch {
  uint64_t request_id = 0;
  uint64_t session_id = 0;
  std::vector<int32_t> ids;
  std::vector<float> logprobs;                  ///< one per id
  std::vector<std::vector<int32_t>> top_ids;    ///< per id: the top-k alternatives (if asked)
  std::vector<std::vector<float>> top_logprobs;
  bool finished = false;
  std::string finish_reason;
  std::string error;                            ///< set when finish_reason == "error"
  usage_counts usage;
};

/// Receives one request's token batches, the last with finished = true.
using token_callback = std::function<void(const token_batch&)>;

/// A point-in-time view of the scheduler (all counts since start unless noted).
struct metrics_snapshot {
  int64_t requests_running = 0;   ///< now
  int64_t requests_waiting = 0;   ///< now
  int64_t pages_total = 0;
  int64_t pages_used = 0;         ///< now: referenced by a running request
  int64_t pages_cached_idle = 0;  ///< now: held only by the prefix cache (evictable)
  int64_t pages_free = 0;         ///< now
  int64_t ring_slots_used = 0;    ///< now
  int64_t kv_bytes_used = 0;      ///< now: pages not free + rings + tails in use
  int64_t kv_budget_bytes = 0;
  int64_t prefix_queried_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t tokens_in = 0;          ///< prompt tokens computed (prefill + replay)
  int64_t tokens_out = 0;         ///< completion tokens
  int64_t replay_tokens = 0;
  int64_t preemptions = 0;
  int64_t steps = 0;
  int64_t context_tokens = 0;     ///< the longest prompt + output one request can hold (smallest group)
  std::vector<double> ttft_ms;    ///< recent samples, submit -> first token
  std::vector<double> itl_ms;     ///< recent samples, between tokens of a request
  double prefix_hit_rate() const {
    return prefix_queried_tokens ? double(prefix_hit_tokens) / prefix_queried_tokens : 0.0;
  }
};

// ---- layouts (the runtime actor; engine::switch_layout and layout_info) ----

/// Command (admin): switch to another layout ("tp4", "dep2") at the next step boundary.
struct switch_layout {
  std::string layout;
};
/// Reply to switch_layout: the outcome and what the switch cost.
struct switch_result {
  int32_t error_code = -1;       ///< -1: switched
  std::string error_message;
  std::string layout;            ///< the layout now serving
  double pause_ms = 0;           ///< admission paused -> resumed (waits for the step boundary)
  double rehome_ms = 0;          ///< of which building the new shards and re-homing KV
  int64_t requests_moved = 0;
  int64_t pages_copied = 0;
};
/// One shard as the runtime sees it.
struct shard_status {
  int32_t rank = 0;
  int32_t group = 0;             ///< data-parallel group (scheduler) it serves
  bool alive = true;
  int64_t steps = 0;             ///< steps it ran in this layout
  int64_t rows = 0;              ///< token rows it ran in this layout
  bool remote = false;           ///< runs in another process (cedar shard --connect)
  std::string device;            ///< where it computes: "cpu", "cuda:N"; "" for a remote shard
};
/// Reply to layout_atom: the layout, its shards and each group's load.
struct layout_status {
  std::string layout;
  uint64_t generation = 0;       ///< +1 per switch or rebuild
  bool switching = false;
  std::vector<shard_status> shards;
  std::vector<int64_t> group_running;  ///< [groups] requests running now
  std::vector<int64_t> group_waiting;  ///< [groups] requests waiting now
  int64_t switches = 0;
  int64_t rebuilds = 0;          ///< layouts rebuilt in place (a shard failed, or a shard process joined)
  double last_switch_ms = 0;
  std::string last_fault;        ///< what the last failed shard reported
};
/// Test hook (CEDAR_TEST_HOOKS): the shard of `rank` crashes (its actor is killed).
struct kill_shard {
  int32_t rank = 0;
};

}  // namespace cedar
