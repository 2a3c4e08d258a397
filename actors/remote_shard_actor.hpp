// A shard in its own process (`cedar shard --connect HOST:PORT`): it connects through CAF's
// middleman to a runtime published by an engine started with --shard-port, offers a shard
// actor running its model, and serves steps until the runtime goes away. The runtime then runs
// its one-shard layout (tp1) on it; if the process dies the runtime rebuilds on a local shard.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "config/engine_options.hpp"
#include "kernels/model/model.hpp"

namespace cedar {

/// Serves `m` (built with options.page_tokens) to the runtime at host:port; blocks until the
/// runtime's process ends or refuses the shard. Returns 1 when no runtime answers there; once it
/// has offered its shard it ends the process itself (without the actor system's teardown, which
/// can wait forever on the shard actor the runtime referenced): status 0 after a served
/// session, 1 when refused or the join failed. Reasons are printed on stderr.
int serve_remote_shard(std::shared_ptr<const model> m, const engine_options& options, const std::string& host,
                       uint16_t port);

}  // namespace cedar
