// Engine options: the runtime knobs `cedar serve` exposes (prefix cache, replay mode, decoder
// truncation, KV dtype and the batch / memory limits), with their defaults and a parser for
// argv-style flags. Read once at start-up; the scheduler copies what it needs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace cedar {

class token_vocab;  // actors/output_grammar.hpp

/// How SWA rings are rebuilt after a prefix-cache hit of H tokens.
enum class swa_replay_mode : uint8_t {
  /// Replay tokens [H - W, H) only (W = sliding_window); each replayed window is clipped at
  /// H - W, so rings below layer 0 are approximate. The production mode.
  bounded,
  /// Replay tokens [H - W - L*(W-1), H) (L = layers, clipped at 0): every layer's window
  /// cascade lies inside the replayed rows, so each ring (and the logits after it) equals a
  /// recompute without the cache. Costs L*(W-1) more rows per hit; for comparison and for
  /// resuming preempted requests exactly.
  full,
};

/// Token positions per KV page unless --page-tokens says otherwise (kv_layout's default too).
constexpr int default_page_tokens = 64;

/// One field of a runtime event: a key and its value as text (a number when `number`).
struct runtime_event_field {
  std::string key;
  std::string text;
  bool number = false;
};

/// Where the runtime reports what an operator's log should show: a shard process joined, a
/// shard was lost, the layout was rebuilt. Called on an actor thread: quick and thread-safe.
using runtime_event_log = std::function<void(const std::string& event, const std::vector<runtime_event_field>& fields)>;

struct engine_options {
  bool prefix_cache = true;                        ///< --prefix-cache on|off
  swa_replay_mode swa_replay = swa_replay_mode::bounded;  ///< --swa-replay bounded|full
  bool decoder_truncation = true;                  ///< --decoder-truncation on|off
  bool kv_fp8 = false;                             ///< --kv-dtype fp4|fp8 (false = fp4)
  int max_num_seqs = 64;                           ///< --max-num-seqs: running requests (= SWA ring slots)
  int max_batched_tokens = 2048;                   ///< --max-batched-tokens: tokens per step
  int max_prefill_tokens_per_request = 512;        ///< --max-prefill-chunk: one request's prefill per step
  int64_t kv_budget_bytes = int64_t(1) << 30;      ///< --kv-budget-bytes: pages + rings + tails
  int page_tokens = default_page_tokens;           ///< --page-tokens: positions per KV page
  int64_t step_timeout_ms = 60000;                 ///< --step-timeout-ms: a shard reply later than this fails the step
  std::string layout = "tp1";                      ///< --layout tpN|depN: shards and how they split the model
  int shard_port = -1;                             ///< --shard-port N: accept `cedar shard --connect` (0 = any free port, -1 = off)
  std::string shard_host = "127.0.0.1";            ///< --shard-host ADDR: the address that port listens on
  /// The served vocabulary's bytes (the server's tokenizer): structured output needs it; a
  /// request with a grammar is refused without it.
  std::shared_ptr<const token_vocab> vocab;
  /// Runtime events (none reported when empty): `cedar serve` writes them to its request log.
  runtime_event_log on_event;

  /// --max-batched-tokens and --max-prefill-chunk on a GPU shard when not given (the chunk no
  /// larger than the step): large enough that each expert's weights, read once per step, serve
  /// hundreds of rows.
  static constexpr int gpu_step_tokens = 8192;

  /// One line per option, for `--help`.
  static std::string help();
};

/// The result of parsing flags: the options, the arguments not recognised (left for the
/// caller, in order), and one message per bad value (empty when all were valid).
struct engine_options_parse {
  engine_options options;
  std::vector<std::string> rest;
  std::vector<std::string> errors;
  std::set<std::string> given;  ///< the engine flags on the command line (e.g. "--kv-budget-bytes")
};

/// Parses `--flag value` and `--flag=value` forms; unknown arguments go to `rest`.
engine_options_parse parse_engine_options(const std::vector<std::string>& args,
                                          engine_options defaults = {});

/// A switch's value: on, true or 1 / off, false or 0 (the engine flags' and the model commands').
bool parse_on_off(const std::string& v, bool& out);

/// Empty if the options are consistent, else one message per problem naming the flag.
std::vector<std::string> validate(const engine_options& o);

}  // namespace cedar
