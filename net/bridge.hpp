// The one door between net/ and the runtime: a plain C++ engine interface (no CAF, no Beast).
// net/ submits token prompts and receives token batches through callbacks; the runtime (actors/)
// or the null engine sits behind it. Callbacks arrive on engine threads: the server posts them
// onto the connection's strand before touching any socket state.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actors/output_grammar.hpp"

namespace cedar {
class engine;
}

namespace cedar::net {

/// How to pick each next token.
struct sampling_params {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;           ///< 0 = off
  uint64_t seed = 0;
  bool has_seed = false;
  float frequency_penalty = 0.0f;  ///< [-2, 2], over the completion's tokens so far
  float presence_penalty = 0.0f;   ///< [-2, 2]
  float min_p = 0.0f;              ///< [0, 1]: vLLM's cut relative to the likeliest token
  float repetition_penalty = 1.0f;  ///< > 0, vLLM's: over the prompt and the completion; 1 = off
  std::vector<std::pair<int32_t, float>> logit_bias;  ///< token id -> added to its logit, [-100, 100]
};

/// One generation: the full prompt of a conversation (the runtime's prefix cache finds the
/// shared part), sampling, and when to stop.
struct generate_request {
  std::vector<int32_t> prompt_ids;
  /// Conversation key (a WebSocket or a Responses chain; 0 = none): the runtime keeps this
  /// session's KV warm between turns until close_session.
  uint64_t session_id = 0;
  sampling_params sampling;
  int max_tokens = 256;
  std::vector<int32_t> stop_ids;  ///< generation ends after emitting one of these
  bool ignore_eos = false;        ///< the model's end token does not end it
  int min_tokens = 0;             ///< the end token and stop_ids are not sampled before this many
  int top_logprobs = -1;          ///< -1: no logprobs; 0: the chosen token's only; k: k alternatives
  output_grammar grammar;         ///< structured output (net/response_format.hpp); inactive: none
  std::vector<int32_t> banned_ids;  ///< never sampled (tool_choice "none": the tool-call marker)
  forced_lead lead;                 ///< the reply opens with one of these (a forced tool_choice)
};

/// One alternative token with its log-probability.
struct token_logprob {
  int32_t id = 0;
  float logprob = 0;
};

/// Why a generation ended.
enum class finish_reason : uint8_t { none, stop, length, cancelled, error };

/// A batch of new tokens for one request, delivered in order; the last one has finished set.
struct token_batch {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;                    ///< one per id when logprobs were asked
  std::vector<std::vector<token_logprob>> top;    ///< top_logprobs alternatives per id
  finish_reason finished = finish_reason::none;
  std::string error;                              ///< set when finished == error
  int num_prompt_tokens = 0;                      ///< set on every batch
  int num_cached_tokens = 0;                      ///< prompt tokens served from the prefix cache
  std::chrono::steady_clock::time_point emitted_at = std::chrono::steady_clock::now();
};

/// Called on an engine thread; never concurrently for one request.
using token_callback = std::function<void(token_batch)>;

/// Why submit refused a request (becomes a client error in net/).
enum class submit_status : uint8_t { ok, overloaded, not_ready, too_long, invalid };

struct submit_result {
  submit_status status = submit_status::ok;
  uint64_t request_id = 0;  ///< valid when status == ok
  std::string message;      ///< for the client when status != ok
};

/// Live engine figures for /metrics and the chat page.
struct engine_metrics {
  int num_running = 0;
  int num_waiting = 0;
  int64_t num_kv_pages_used = 0;    ///< referenced by running requests
  int64_t num_kv_pages_cached = 0;  ///< held only by the prefix cache (evictable)
  int64_t num_kv_pages_free = 0;
  int64_t num_prefix_lookup_tokens = 0;  ///< prompt tokens looked up in the prefix cache
  int64_t num_prefix_hit_tokens = 0;     ///< of those, found cached
  int64_t num_sessions_open = 0;         ///< conversations holding a runtime session
  int64_t num_session_turns_extended = 0;   ///< turns that sent only their new tokens
  int64_t num_session_turns_restarted = 0;  ///< turns that did not extend the session (a fresh one)
  std::string topology = "single";       ///< current layout, e.g. "tp4", "dep2"
  std::string topology_state = "serving";  ///< serving, switching, draining
  int num_shards = 1;
  int num_shards_alive = 1;
  int64_t num_layout_switches = 0;
  int64_t num_layout_rebuilds = 0;       ///< layouts rebuilt in place after a shard failed
  std::vector<int64_t> group_running;    ///< per data-parallel group (scheduler)
  std::vector<int64_t> group_waiting;
};

/// What startup prints and /v1/models reports.
struct engine_summary {
  std::string model_name;
  std::string layout;          ///< e.g. "cpu x1, tp1"
  int64_t kv_capacity_tokens = 0;
  int vocab_size = 0;
  int max_context_tokens = 0;
};

/// The engine as net/ sees it. Every method is thread-safe.
class engine_bridge {
 public:
  virtual ~engine_bridge() = default;
  virtual engine_summary summary() const = 0;
  /// Queues a generation. The callback receives token batches until one has finished set
  /// (also after cancel: then finished == cancelled).
  virtual submit_result submit(generate_request request, token_callback on_tokens) = 0;
  /// Stops a request and frees its KV at the next step boundary; a no-op once it finished.
  virtual void cancel(uint64_t request_id) = 0;
  /// Lets the runtime drop a session's retained KV.
  virtual void close_session(uint64_t session_id) = 0;
  virtual engine_metrics metrics() const = 0;
  virtual bool ready() const = 0;
  /// Switches the parallel layout ("tp4", "dep2", ...) while serving; `done` gets an HTTP
  /// status (200, 400 for a layout the model cannot take, 409 while another switch runs, 404
  /// without layouts), an error message (empty on success) and a one-line summary, on an
  /// engine thread.
  virtual void switch_layout(const std::string& layout,
                             std::function<void(int status, std::string error, std::string summary)> done) {
    (void)layout;
    done(404, "This engine has no parallel layouts", {});
  }
  /// The layout, its shards (alive, steps and token rows run, remote) and each data-parallel
  /// group's load, as one JSON object (GET /admin/status); empty when there are no layouts.
  virtual std::string layout_status_json() const { return {}; }
  /// Test builds (CEDAR_TEST_HOOKS): shard `rank` crashes and the runtime rebuilds the layout
  /// (POST /admin/kill-shard). Returns an error message, empty on success.
  virtual std::string kill_shard(int rank) {
    (void)rank;
    return "this engine has no shards";
  }
  /// Stops the engine: running requests end with finished == cancelled. Blocks until done.
  virtual void shutdown() = 0;
};

/// The null engine: every step (step_us apart; 0 = no wait) emits one token to every running
/// request, with no model and no KV: `token` until max_tokens, or, when `script` is not empty,
/// the script's tokens and then the request's first stop id. Measures what the server itself
/// costs per streamed token; a script drives the output parser end to end (tool calls).
/// fail_after > 0: every request ends with an engine error after that many tokens (tests).
std::unique_ptr<engine_bridge> make_null_engine(int step_us, int32_t token, std::vector<int32_t> script = {},
                                                int fail_after = 0);

/// Wraps the runtime (actors/engine.hpp), built by the caller from a model. page_tokens sizes
/// the reported KV capacity; layout is a line for the start-up banner.
std::unique_ptr<engine_bridge> make_runtime_bridge(std::unique_ptr<cedar::engine> runtime,
                                                   std::string model_name, std::string layout,
                                                   int page_tokens);

}  // namespace cedar::net
