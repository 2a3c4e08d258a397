// Layout admin routes (see admin_layout.hpp).
#include "net/admin_layout.hpp"

#include <simdjson.h>

#include <string>

namespace cedar::net {

std::optional<simple_response> handle_admin_layout(server_state& state, std::string_view method,
                                                   std::string_view path, std::string_view body) {
  if (method == "GET" && path == "/admin/status") {
    std::string json = state.engine->layout_status_json();
    if (json.empty())
      return error_response(not_found("This engine has no parallel layouts", {}, "no_layouts"));
    return simple_response{200, "application/json", std::move(json)};
  }
  if (method == "POST" && path == "/admin/kill-shard") {
    simdjson::dom::parser parser;
    simdjson::padded_string padded(body);
    int64_t rank = -1;
    if (parser.parse(padded)["rank"].get_int64().get(rank) != simdjson::SUCCESS || rank < 0)
      return error_response(bad_request("expected {\"rank\": N} with N >= 0", "rank", "invalid_value"));
    if (std::string error = state.engine->kill_shard(int(rank)); !error.empty())
      return error_response(bad_request(error, "rank", "kill_shard_failed"));
    return simple_response{200, "application/json", "{\"killed\":" + std::to_string(rank) + "}"};
  }
  return std::nullopt;
}

}  // namespace cedar::net
