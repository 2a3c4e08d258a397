// One concurrency point: spawn the lanes, run the warm-up, open the measured window (scraping the
// server's /metrics at both ends), abort everything at its end, then reduce the samples.
#include <utility>

#include "tools/bench/run_state.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <cstdio>

#include "tools/bench/prometheus.hpp"

namespace cedar::bench {
namespace {
namespace asio = boost::asio;
using asio::awaitable;

double ms_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
double seconds_since(clock_type::time_point a) { return ms_between(a, clock_type::now()) / 1000; }

awaitable<void> sleep_for(asio::io_context& io, clock_type::duration d) {
  asio::steady_timer t(io, d);
  boost::system::error_code ec;
  co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}
}  // namespace

agent_io::agent_io(run_state& st)
    : st_(st), client_(make_stream_client(st.io.get_executor(), st.cfg.server, st.cfg.api)),
      timer_(st.io) {
  st_.live_agents.insert(this);
}

agent_io::~agent_io() { st_.live_agents.erase(this); }

awaitable<void> agent_io::sleep_until(clock_type::time_point when) {
  timer_.expires_at(when);
  boost::system::error_code ec;
  co_await timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

void agent_io::cancel() {
  client_->close();
  timer_.cancel();
}

awaitable<void> pending_count::wait() {
  while (num_pending_ > 0) {
    wake_.expires_at(clock_type::time_point::max());
    boost::system::error_code ec;
    co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

run_state::run_state(const bench_config& c, asio::io_context& i, int concurrency)
    : cfg(c), io(i), rng(c.seed * 1000003 + uint64_t(concurrency)),
      measure_start(clock_type::time_point::max()), measure_end(clock_type::time_point::max()),
      lanes(i) {
  result.concurrency = concurrency;
  next_trace_idx = rng() % c.traces->size();
}

const session_trace& run_state::next_trace() {
  const auto& traces = *cfg.traces;
  return traces[next_trace_idx++ % traces.size()];
}

void run_state::on_chunk() {
  ++num_chunks_total;
  if (in_window(clock_type::now())) ++result.num_output_tokens;
}

void run_state::record(const trace_request& req, int64_t num_prompt_estimate,
                       const request_outcome& out) {
  if (!out.error_kind.empty()) {
    if (out.error_kind == "cancelled" || stopping) return;
    ++num_errors_total;
    if (!in_window(out.done_at)) return;
    ++result.errors[out.error_kind];
    if (result.first_error.empty()) result.first_error = out.error_kind + ": " + out.error_detail;
    return;
  }
  ++num_done_total;
  int64_t num_out = out.num_output_tokens.value_or(out.num_token_chunks);
  if (in_window(out.done_at)) {
    // Chunks were counted as they arrived; usage, when present, corrects the total.
    result.num_output_tokens += num_out - out.num_token_chunks;
    int64_t num_prompt = out.num_prompt_tokens.value_or(num_prompt_estimate);
    result.num_input_tokens += num_prompt;
    if (out.num_cached_tokens && out.num_prompt_tokens) {
      num_cached_tokens += *out.num_cached_tokens;
      num_prompt_tokens_with_cache_info += *out.num_prompt_tokens;
    }
  }
  if (!(in_window(out.sent_at) && out.done_at < measure_end)) return;
  ++result.num_requests;
  if (num_out < req.num_output_tokens) ++result.num_short_outputs;
  e2e_ms.push_back(ms_between(out.sent_at, out.done_at));
  if (!out.has_first_token) return;
  ttft_ms.push_back(ms_between(out.sent_at, out.first_token_at));
  if (num_out > 1)
    itl_ms.push_back(ms_between(out.first_token_at, out.done_at) / double(num_out - 1));
}

namespace {

awaitable<void> run_lane(run_state& st) {
  bool first = true;
  while (!st.stopping) {
    co_await run_session(st, st.next_trace(), first && st.cfg.random_start);
    first = false;
  }
  st.lanes.done();
}

awaitable<void> report_progress(run_state& st) {
  int64_t last_chunks = 0;
  asio::steady_timer tick(st.io);
  st.progress_timer = &tick;
  while (!st.stopping) {
    tick.expires_after(std::chrono::seconds(1));
    boost::system::error_code ec;
    co_await tick.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (st.stopping) break;
    auto now = clock_type::now();
    const char* phase = now < st.measure_start ? "warmup" : now < st.measure_end ? "measure" : "end";
    std::fprintf(stderr, "[%s c=%d] %-7s %5.1fs  done %lld  %.0f tok/s  errors %lld\n",
                 st.cfg.label.c_str(), st.result.concurrency, phase,
                 seconds_since(st.start_at), (long long)st.num_done_total,
                 double(st.num_chunks_total - last_chunks), (long long)st.num_errors_total);
    last_chunks = st.num_chunks_total;
  }
  st.progress_timer = nullptr;
}

awaitable<prefix_cache_sample> scrape(run_state& st) {
  auto text = co_await http_get(st.io.get_executor(), st.cfg.server, st.cfg.metrics_target,
                                std::chrono::seconds(5));
  co_return text ? parse_prefix_cache_metrics(*text) : prefix_cache_sample{};
}

awaitable<void> orchestrate(run_state& st) {
  const auto& cfg = st.cfg;
  st.start_at = clock_type::now();
  for (int i = 0; i < st.result.concurrency; ++i) {
    st.lanes.add();
    asio::co_spawn(st.io, run_lane(st), asio::detached);
  }
  if (cfg.progress) asio::co_spawn(st.io, report_progress(st), asio::detached);
  auto as_duration = [](double s) {
    return std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(s));
  };
  co_await sleep_for(st.io, as_duration(cfg.warmup_s));
  prefix_cache_sample before = co_await scrape(st);
  st.measure_start = clock_type::now();
  st.measure_end = st.measure_start + as_duration(cfg.duration_s);
  co_await sleep_for(st.io, st.measure_end - clock_type::now());
  prefix_cache_sample after = co_await scrape(st);
  st.result.prefix_hit_rate = prefix_hit_rate(before, after);
  st.result.measured_s = std::chrono::duration<double>(st.measure_end - st.measure_start).count();
  st.stopping = true;
  for (agent_io* agent : st.live_agents) agent->cancel();
  if (st.progress_timer) st.progress_timer->cancel();
  co_await st.lanes.wait();
}

}  // namespace

point_result run_point(const bench_config& config, int concurrency) {
  asio::io_context io;
  run_state st(config, io, concurrency);
  asio::co_spawn(io, orchestrate(st), asio::detached);
  io.run();
  point_result r = std::move(st.result);
  r.ttft_ms = summarize(st.ttft_ms);
  r.itl_ms = summarize(st.itl_ms);
  r.e2e_ms = summarize(st.e2e_ms);
  if (r.measured_s > 0) {
    r.output_tokens_per_s = double(r.num_output_tokens) / r.measured_s;
    r.total_tokens_per_s = double(r.num_output_tokens + r.num_input_tokens) / r.measured_s;
  }
  if (r.itl_ms.p90 && *r.itl_ms.p90 > 0) r.interactivity = 1000.0 / *r.itl_ms.p90;
  if (st.num_prompt_tokens_with_cache_info > 0)
    r.usage_cached_fraction =
        double(st.num_cached_tokens) / double(st.num_prompt_tokens_with_cache_info);
  return r;
}

}  // namespace cedar::bench
