// One generation in flight, owned by the connection that asked for it: submits to the engine,
// receives token batches (posted from engine threads onto the connection's strand), parses them
// into deltas, applies stop strings, and hands deltas to the API's response_writer, which frames
// them for the transport. Cancels its engine request when destroyed or cancelled.
#pragma once

#include <boost/asio/any_io_executor.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "net/api_error.hpp"
#include "net/bridge.hpp"
#include "net/prompt_codec.hpp"

namespace cedar::net {

struct server_state;

/// Where frames go: an SSE stream, a WebSocket, or (non-streaming) one HTTP body.
class frame_sink {
 public:
  virtual ~frame_sink() = default;
  /// One event: `event` names it (SSE "event:" line; empty for none), `json` is the payload.
  /// emitted_at is when the engine produced the newest token it carries.
  virtual void send_frame(std::string_view event, std::string json,
                          std::chrono::steady_clock::time_point emitted_at) = 0;
  /// The generation ended and every frame has been sent to send_frame.
  virtual void generation_done() = 0;
};

/// One logprob entry of a generated token.
struct token_logprobs {
  int32_t id = 0;
  float logprob = 0;
  std::vector<token_logprob> top;
};

/// Everything a generation produced, accumulated.
struct turn_result {
  std::string reasoning;
  std::string content;
  std::vector<tool_call> tool_calls;
  std::vector<token_logprobs> logprobs;
  finish_reason finished = finish_reason::none;
  /// The server ended it: a stop string, or a second tool call with parallel_tool_calls false.
  bool stopped_early = false;
  std::string error;
  int num_prompt_tokens = 0;
  int num_cached_tokens = 0;
  int num_completion_tokens = 0;
  int num_reasoning_tokens = 0;
  /// OpenAI's finish_reason string: stop, length, tool_calls, cancelled, error.
  std::string finish_reason_text() const;
};

/// Frames one API's output. Called on the connection's strand.
class response_writer {
 public:
  virtual ~response_writer() = default;
  /// Before the first token (streaming: e.g. response.created).
  virtual void begin(frame_sink&) {}
  /// New deltas of one engine batch; `result` already includes them.
  virtual void deltas(const std::vector<stream_delta>& deltas, const token_batch& batch,
                      const turn_result& result, frame_sink& sink) = 0;
  /// The end: final events (streaming) or the whole body (non-streaming, event name empty).
  virtual void end(const turn_result& result, frame_sink& sink) = 0;
};

class generation : public std::enable_shared_from_this<generation> {
 public:
  generation(std::shared_ptr<server_state> state, boost::asio::any_io_executor strand,
             std::unique_ptr<output_stream> parser, std::unique_ptr<response_writer> writer,
             std::vector<std::string> stop, bool parallel_tool_calls, frame_sink* sink);
  ~generation();

  /// Submits to the engine; an error (429/503/400) means nothing was started. prompt_param: the
  /// request field the prompt came from (messages, prompt, input), which a prompt past the
  /// context window's 400 names.
  std::optional<api_error> start(generate_request request, const std::string& prompt_param);
  /// Sends the opening frames (e.g. response.created); call once the sink is ready for them.
  void open_stream();
  /// Stops early (client gone, response.cancel): the engine request is cancelled and the
  /// writer's end() runs with finish_reason cancelled. Must run on the strand.
  void cancel();
  /// The sink is going away: no more frames, just cancel the engine request.
  void detach();

  bool finished() const { return done_; }
  const turn_result& result() const { return result_; }
  std::chrono::steady_clock::time_point started_at() const { return started_at_; }
  /// When the request arrived (default: when this was made, after the prompt was rendered):
  /// TTFT counts from it. Set before the first token can arrive (on the strand, after start).
  void set_received_at(std::chrono::steady_clock::time_point t) { started_at_ = t; }
  double ttft_seconds() const { return ttft_s_; }

 private:
  void on_batch(token_batch batch);
  void apply(std::vector<stream_delta>& deltas);
  void filter_stop(std::vector<stream_delta>& deltas, bool final);
  /// parallel_tool_calls false: a tool call after the first, and all after it, is dropped.
  void limit_tool_calls(std::vector<stream_delta>& deltas);
  void finish(finish_reason why, std::string error = {});

  std::shared_ptr<server_state> state_;
  boost::asio::any_io_executor strand_;
  std::unique_ptr<output_stream> parser_;
  std::unique_ptr<response_writer> writer_;
  std::vector<std::string> stop_;
  bool parallel_tool_calls_;
  frame_sink* sink_;
  turn_result result_;
  std::string stop_hold_;  ///< content held back while it may start a stop string
  uint64_t request_id_ = 0;
  bool submitted_ = false;
  bool done_ = false;
  bool cancel_sent_ = false;
  std::chrono::steady_clock::time_point started_at_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_token_at_{};
  double ttft_s_ = 0;
};

}  // namespace cedar::net
