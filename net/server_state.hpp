// What every connection shares: options, the engine bridge, the prompt codec, metrics, the store
// of Responses conversations, the drain flag and the request log. Created once by run_server;
// connections hold it by shared_ptr. Everything here is thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "config/engine_options.hpp"
#include "net/api_types.hpp"
#include "net/bridge.hpp"
#include "net/metrics.hpp"
#include "net/prompt_codec.hpp"

namespace cedar::net {

/// One request-log value. Text is quoted in JSON lines (and in key=value lines where it must be);
/// a number or a boolean is written bare in both, so a JSON log reader gets numbers. An empty
/// text value is left out of the line.
struct log_value {
  std::string text;
  bool literal = false;  ///< a number or a boolean

  log_value(std::string s) : text(std::move(s)) {}
  log_value(const char* s) : text(s) {}
  log_value(bool b) : text(b ? "true" : "false"), literal(true) {}
  template <std::integral T>
    requires(!std::same_as<T, bool> && !std::same_as<T, char>)
  log_value(T n) : text(std::to_string(n)), literal(true) {}
  /// Milliseconds with three decimals ("12.345"), a number; not finite: the text "nan".
  static log_value millis(double ms);
};

/// One field of a log line: its key and value (a field with an empty value is left out).
using log_field = std::pair<std::string_view, log_value>;

/// `cedar serve` options (engine options travel in engine_config).
struct serve_options {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;      ///< default: the engine's model name
  std::string api_key;                ///< empty: no key needed for /v1/*
  std::string admin_key;              ///< empty: /admin/* answers 404
  std::string tokenizer_path;         ///< empty: the default tokenizer.json
  int num_threads = 2;                ///< io_context threads
  int64_t max_body_bytes = 8 << 20;
  int64_t max_header_bytes = 16 << 10;
  int64_t max_ws_message_bytes = 8 << 20;
  int64_t max_queued_bytes = 8 << 20; ///< per connection: unsent output beyond this closes it
  int max_connections = 16384;
  int max_active_generations = 4096;  ///< beyond this, 429
  int idle_timeout_s = 60;            ///< keep-alive, header read and WebSocket idle limit
  int write_timeout_s = 30;           ///< a write stalled this long closes the connection
  int drain_timeout_s = 30;
  int default_max_tokens = 2048;
  int max_stored_responses = 4096;    ///< Responses conversations kept for previous_response_id
  int64_t max_stored_mib = 1024;      ///< and the memory they may take (a turn holds its whole chain)
  bool log_json = false;              ///< request log as JSON lines instead of key=value
  bool log_requests = true;
};

/// A finished Responses turn kept for previous_response_id: the whole conversation so far.
struct stored_response {
  std::string id;
  std::vector<chat_message> conversation;  ///< input + the assistant's reply, in order
  std::string instructions;
  uint64_t session_id = 0;                 ///< engine session keeping this chain's KV warm
  std::shared_ptr<const chat_context> context;  ///< the conversation rendered and tokenized so far
  std::string json;                        ///< the final response object
  size_t bytes = 0;                        ///< about what this turn takes in memory
};

/// LRU store of Responses turns. Evicting the last turn of a chain closes its engine session.
class response_store {
 public:
  /// Keeps at most `capacity` turns and `capacity_bytes` of them (by stored_response::bytes);
  /// the least recently used go first, but the newest turn is always kept.
  response_store(size_t capacity, size_t capacity_bytes, engine_bridge* engine)
      : capacity_(capacity), capacity_bytes_(capacity_bytes), engine_(engine) {}
  void put(std::shared_ptr<const stored_response> r);
  std::shared_ptr<const stored_response> get(const std::string& id);
  bool erase(const std::string& id);
  size_t size() const;
  size_t bytes() const;
  /// Closes the engine session unless a stored turn still uses it (a turn that was not stored,
  /// or a WebSocket that closed).
  void release(uint64_t session_id);

 private:
  using entry = std::shared_ptr<const stored_response>;
  mutable std::mutex mutex_;
  size_t capacity_;
  size_t capacity_bytes_;
  size_t bytes_ = 0;
  engine_bridge* engine_;
  std::list<entry> lru_;  ///< most recent first
  std::unordered_map<std::string, std::list<entry>::iterator> index_;
  std::unordered_map<uint64_t, int> session_refs_;

  /// Drops `victim`'s entry (the caller erased it from lru_); returns a session to close or 0.
  uint64_t forget_locked(const entry& victim);
};

struct server_state {
  serve_options options;
  std::unique_ptr<engine_bridge> engine;
  std::unique_ptr<prompt_codec> codec;
  std::string model_name;
  server_metrics metrics;
  std::unique_ptr<response_store> responses;
  std::atomic<bool> draining{false};
  /// Set (release) once engine, model_name and responses are in place: connections are accepted
  /// while the model loads, and until then every request is answered 503 without reading them.
  std::atomic<bool> loaded{false};
  std::atomic<uint64_t> next_id{1};
  std::chrono::system_clock::time_point started = std::chrono::system_clock::now();

  /// A fresh id with a prefix, e.g. "chatcmpl-00001a2b3c4d5e6f".
  std::string new_id(const char* prefix);
  /// One line to stderr (JSON or key=value per options.log_json) with a "ts" field first.
  void log(std::initializer_list<log_field> fields) { log(std::span(fields.begin(), fields.size())); }
  void log(std::span<const log_field> fields);
  /// A runtime event (a shard joined or was lost, a rebuild) as one log line: "event" first.
  void log_event(const std::string& event, const std::vector<runtime_event_field>& fields);
  /// The line log() writes, without the newline (for tests).
  std::string format_log_line(std::string_view ts, std::span<const log_field> fields) const;
  std::string format_log_line(std::string_view ts, std::initializer_list<log_field> fields) const {
    return format_log_line(ts, std::span(fields.begin(), fields.size()));
  }
  bool ready() const { return !draining.load() && engine && engine->ready(); }

 private:
  std::mutex log_mutex_;
};

}  // namespace cedar::net
