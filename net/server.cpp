// run_server: start-up, the thread pool, and the drain sequence.
#include "net/server.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstdio>
#include <thread>
#include <vector>

#include "net/listener.hpp"
#include "net/tokenizer.hpp"

namespace cedar::net {

namespace asio = boost::asio;

namespace {

/// Polls until no generation is active or the deadline passes, then stops the engine (which
/// cancels what is left) and, shortly after, the io_context.
void drain_step(std::shared_ptr<server_state> state, std::shared_ptr<asio::steady_timer> timer,
                asio::io_context& ioc, std::chrono::steady_clock::time_point deadline) {
  bool idle = state->metrics.num_active_generations.load() == 0;
  if (!idle && std::chrono::steady_clock::now() < deadline) {
    timer->expires_after(std::chrono::milliseconds(50));
    timer->async_wait([state, timer, &ioc, deadline](boost::system::error_code) {
      drain_step(state, timer, ioc, deadline);
    });
    return;
  }
  state->log({{"event", "drain_done"},
              {"cancelled", state->metrics.num_active_generations.load()}});
  std::thread([state] { state->engine->shutdown(); }).join();
  timer->expires_after(std::chrono::milliseconds(idle ? 0 : 300));  // let final frames go out
  timer->async_wait([&ioc](boost::system::error_code) { ioc.stop(); });
}

}  // namespace

int run_server(const serve_options& options, const engine_factory& make_engine) {
  auto state = std::make_shared<server_state>();
  state->options = options;
  std::string error;
  state->codec = prompt_codec::create(options.tokenizer_path, &error);
  if (!state->codec) {
    std::fprintf(stderr, "cedar serve: cannot load the tokenizer: %s\n", error.c_str());
    return 1;
  }
  // The address is bound and served before the engine loads: a bad --host or a port in use is
  // reported at once, not after the weights, and while they load /health says "loading" and
  // every other request gets a 503 (server_state::loaded).
  asio::io_context ioc(options.num_threads);
  auto lst = std::make_shared<listener>(ioc, state);
  boost::system::error_code ec;
  auto address = asio::ip::make_address(options.host, ec);
  if (ec) {
    std::fprintf(stderr, "cedar serve: bad --host '%s': %s\n", options.host.c_str(), ec.message().c_str());
    return 2;
  }
  if (auto err = lst->open({address, uint16_t(options.port)}); !err.empty()) {
    std::fprintf(stderr, "cedar serve: cannot listen on %s:%d: %s\n", options.host.c_str(), options.port,
                 err.c_str());
    return 1;
  }
  lst->run();
  std::string url = "http://" + options.host + ":" + std::to_string(lst->port());
  std::fprintf(stderr, "cedar serve: tokenizer %s\n",
               (options.tokenizer_path.empty() ? tokenizer::default_path() : options.tokenizer_path).c_str());
  std::fprintf(stderr, "cedar serve: bound to %s; loading the model (/health answers 503 until it is up)\n",
               url.c_str());
  std::fflush(stderr);
  auto work = asio::make_work_guard(ioc);
  std::vector<std::thread> threads;
  for (int i = 0; i < options.num_threads; ++i) threads.emplace_back([&ioc] { ioc.run(); });
  const auto stop_io = [&] {
    work.reset();
    ioc.stop();
    for (auto& t : threads) t.join();
  };
  try {
    // Weak: the engine (held by the state) must not keep the state alive.
    std::weak_ptr<server_state> weak = state;
    state->engine = make_engine(*state->codec, [weak](const std::string& event,
                                                      const std::vector<runtime_event_field>& fields) {
      if (auto s = weak.lock()) s->log_event(event, fields);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cedar serve: cannot start the engine: %s\n", e.what());
    stop_io();
    return 1;
  }
  auto summary = state->engine->summary();
  state->model_name = options.served_model_name.empty() ? summary.model_name : options.served_model_name;
  state->responses = std::make_unique<response_store>(
      size_t(options.max_stored_responses), size_t(options.max_stored_mib) << 20, state->engine.get());
  state->loaded.store(true, std::memory_order_release);
  std::fprintf(stderr,
               "cedar serve: model %s (served as \"%s\")\n"
               "cedar serve: layout %s\n"
               "cedar serve: KV capacity %lld tokens, max context %d tokens\n"
               "cedar serve: listening on %s  (chat page %s/ , API %s/v1)\n",
               summary.model_name.c_str(), state->model_name.c_str(), summary.layout.c_str(),
               (long long)summary.kv_capacity_tokens, summary.max_context_tokens, url.c_str(),
               url.c_str(), url.c_str());
  std::fflush(stderr);

  asio::signal_set signals(ioc, SIGINT, SIGTERM);
  auto drain_timer = std::make_shared<asio::steady_timer>(ioc);
  signals.async_wait([&, state, lst, drain_timer](boost::system::error_code ec, int sig) {
    if (ec) return;
    state->draining = true;
    state->log({{"event", "drain_start"}, {"signal", sig},
                {"active", state->metrics.num_active_generations.load()},
                {"timeout_s", options.drain_timeout_s}});
    lst->close();
    signals.async_wait([&ioc](boost::system::error_code e, int) { if (!e) ioc.stop(); });
    drain_step(state, drain_timer, ioc,
               std::chrono::steady_clock::now() + std::chrono::seconds(options.drain_timeout_s));
  });

  work.reset();  // the listener and the signals keep the threads running until the drain stops them
  for (auto& t : threads) t.join();
  state->engine->shutdown();
  state->log({{"event", "exit"}});
  return 0;
}

}  // namespace cedar::net
