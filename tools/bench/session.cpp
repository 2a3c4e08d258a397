// Session replay: the main agent's turns in order with think time, subagents launched after their
// parent turn (gating ones joined before the next parent turn, background ones only at the end),
// each agent with its own conversation and connection, all sharing the session's cache-bust marker.
#include <utility>

#include "tools/bench/run_state.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "tools/bench/conversation.hpp"
#include "tools/bench/filler.hpp"

namespace cedar::bench {
namespace {

namespace asio = boost::asio;
using asio::awaitable;

/// Sends one turn and folds the reply into the conversation; false if the request failed.
awaitable<bool> send_turn(run_state& st, agent_io& io, conversation& conv,
                          const trace_request& req, std::string& response_id) {
  turn_input in = conv.next_turn(req);
  const auto& cfg = st.cfg;
  std::string body;
  if (cfg.api == api_kind::chat) {
    body = chat_body(cfg.model, conv.messages(), req.num_output_tokens);
  } else {
    bool chained = !in.rewritten && !response_id.empty();
    body = responses_body(cfg.model, conv.messages(), chained ? in.first_new_idx : 0,
                          chained ? response_id : std::string(), req.num_output_tokens,
                          cfg.api == api_kind::ws);
  }
  request_outcome out =
      co_await io.client().send(std::move(body), cfg.request_timeout, [&st] { st.on_chunk(); });
  st.record(req, conv.num_tokens(), out);
  if (!out.error_kind.empty()) co_return false;
  int64_t num_reply_tokens = out.num_output_tokens.value_or(out.num_token_chunks);
  conv.add_reply(out.text.empty() ? std::string(" ") : std::move(out.text), num_reply_tokens);
  response_id = out.response_id;
  co_return true;
}

clock_type::duration think_delay(const run_state& st, double think_time_s) {
  double s = std::min(think_time_s * st.cfg.think_scale, st.cfg.max_think_s);
  return std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(s));
}

awaitable<void> run_subagent(run_state& st, const subagent_trace& sub, std::string marker,
                             uint64_t scope, pending_count* gate, pending_count& all) {
  agent_io io(st);
  conversation conv(std::move(marker), scope, 0);
  std::string response_id;
  auto prev_end = clock_type::now();
  for (size_t i = 0; i < sub.requests.size() && !st.stopping; ++i) {
    if (i > 0) co_await io.sleep_until(prev_end + think_delay(st, sub.requests[i].think_time_s));
    if (st.stopping) break;
    bool ok = co_await send_turn(st, io, conv, sub.requests[i], response_id);
    prev_end = clock_type::now();
    if (!ok) break;
  }
  if (gate) gate->done();
  all.done();
}

void launch_subagents(run_state& st, const session_trace& trace, int after_idx,
                      const std::string& marker, uint64_t scope, pending_count& gate,
                      pending_count& all) {
  for (auto& sub : trace.subagents) {
    if (sub.after_request_idx != after_idx) continue;
    all.add();
    if (!sub.background) gate.add();
    asio::co_spawn(st.io, run_subagent(st, sub, marker, scope, sub.background ? nullptr : &gate, all),
                   asio::detached);
  }
}

}  // namespace

awaitable<void> run_session(run_state& st, const session_trace& trace, bool random_start) {
  std::string marker = session_marker(st.rng());
  uint64_t scope = hash_string(trace.id);
  size_t first = random_start
                     ? std::uniform_int_distribution<size_t>(0, trace.requests.size() - 1)(st.rng)
                     : 0;
  agent_io io(st);
  conversation conv(marker, scope, trace.system_tokens);
  conv.fast_forward(trace.requests, first);
  pending_count gate(st.io), all(st.io);
  if (first == 0) launch_subagents(st, trace, -1, marker, scope, gate, all);
  std::string response_id;
  bool ok = true;
  auto prev_end = clock_type::now();
  for (size_t i = first; i < trace.requests.size() && !st.stopping; ++i) {
    const trace_request& req = trace.requests[i];
    if (i > first) {
      co_await io.sleep_until(prev_end + think_delay(st, req.think_time_s));
      co_await gate.wait();
      if (st.stopping) break;
    }
    ok = co_await send_turn(st, io, conv, req, response_id);
    prev_end = clock_type::now();
    if (!ok) break;
    launch_subagents(st, trace, int(i), marker, scope, gate, all);
  }
  co_await all.wait();
  // After a failure, pause before the next session so that a down server is not hammered.
  if (!ok && !st.stopping) co_await io.sleep_until(clock_type::now() + std::chrono::milliseconds(200));
}

}  // namespace cedar::bench
