// The shared state of one concurrency point: phase and window, the connections to abort at the
// end, and the accumulators the finished requests feed. Touched only by the point's io_context
// thread (driver.cpp and session.cpp).
#pragma once

#include <utility>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <random>
#include <unordered_set>

#include "tools/bench/driver.hpp"

namespace cedar::bench {

struct run_state;

/// An agent's connection and its think-time timer; registered so that the end of the window can
/// abort both.
class agent_io {
 public:
  explicit agent_io(run_state& st);
  ~agent_io();
  agent_io(const agent_io&) = delete;
  agent_io& operator=(const agent_io&) = delete;

  stream_client& client() { return *client_; }
  boost::asio::awaitable<void> sleep_until(clock_type::time_point when);
  void cancel();

 private:
  run_state& st_;
  std::unique_ptr<stream_client> client_;
  boost::asio::steady_timer timer_;
};

/// Counts outstanding tasks; wait() returns once none is left.
class pending_count {
 public:
  explicit pending_count(boost::asio::io_context& io) : wake_(io) {}
  void add() { ++num_pending_; }
  void done() {
    if (--num_pending_ == 0) wake_.cancel();
  }
  boost::asio::awaitable<void> wait();

 private:
  int num_pending_ = 0;
  boost::asio::steady_timer wake_;
};

struct run_state {
  run_state(const bench_config& c, boost::asio::io_context& i, int concurrency);

  const bench_config& cfg;
  boost::asio::io_context& io;
  std::mt19937_64 rng;
  clock_type::time_point start_at, measure_start, measure_end;
  bool stopping = false;
  size_t next_trace_idx = 0;
  std::unordered_set<agent_io*> live_agents;
  pending_count lanes;
  boost::asio::steady_timer* progress_timer = nullptr;  ///< cancelled at the end

  // Accumulated over the measured window.
  point_result result;
  std::vector<double> ttft_ms, itl_ms, e2e_ms;
  int64_t num_cached_tokens = 0, num_prompt_tokens_with_cache_info = 0;
  // Progress (whole run).
  int64_t num_done_total = 0, num_chunks_total = 0, num_errors_total = 0;

  bool in_window(clock_type::time_point t) const { return t >= measure_start && t < measure_end; }
  const session_trace& next_trace();
  void on_chunk();
  /// Accounts one finished request; `num_prompt_estimate` is used when usage is absent.
  void record(const trace_request& req, int64_t num_prompt_estimate, const request_outcome& out);
};

/// Replays one session (main agent and its subagents) from a lane; returns when all of its
/// agents are done, or stopped.
boost::asio::awaitable<void> run_session(run_state& st, const session_trace& trace,
                                         bool random_start);

}  // namespace cedar::bench
