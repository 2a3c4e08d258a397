// The layout admin routes (already authorised by the admin key): GET /admin/status (layout,
// shards, per-group load) and, in test builds, POST /admin/kill-shard {"rank": N}.
// POST /admin/layout lives in http_session (it answers asynchronously).
#pragma once

#include <optional>
#include <string_view>

#include "net/handlers.hpp"

namespace cedar::net {

/// The answer for `method path`, or nullopt when it is not a layout route.
std::optional<simple_response> handle_admin_layout(server_state& state, std::string_view method,
                                                   std::string_view path, std::string_view body);

}  // namespace cedar::net
