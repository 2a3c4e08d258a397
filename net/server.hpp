// `cedar serve` as a function: builds the codec, the engine and the shared state, listens,
// runs the io_context on a small thread pool, and drains on SIGTERM/SIGINT.
#pragma once

#include <functional>

#include "config/engine_options.hpp"
#include "net/bridge.hpp"
#include "net/server_state.hpp"

namespace cedar::net {

/// Builds the engine, given the server's codec (the null engine takes its tokens from it) and
/// where runtime events go (the request log; engine_options::on_event). Throws
/// std::runtime_error with a message for the user on failure.
using engine_factory =
    std::function<std::unique_ptr<engine_bridge>(const prompt_codec& codec, runtime_event_log events)>;

/// Serves until SIGTERM/SIGINT, then drains (stops accepting, lets running generations finish
/// for up to options.drain_timeout_s, cancels the rest). Returns the process exit code.
int run_server(const serve_options& options, const engine_factory& make_engine);

}  // namespace cedar::net
