// Coalescing streamed delta events for the WebSocket mode. A WebSocket write carries one
// message, so a socket that falls behind would pay one write (and the client one message) per
// token. While a write is in flight, a queued delta event followed by another delta of the same
// item becomes one event with both texts; every message stays one complete event of the
// usual schema (it carries the later event's sequence_number, so numbers keep increasing but
// may skip).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace cedar::net {

/// A delta event as the Responses writer makes it:
/// {"type":"<...>.delta","sequence_number":N,<fields>,"delta":"<escaped text>"}.
struct delta_event_parts {
  std::string_view type;     ///< e.g. response.output_text.delta
  std::string_view fields;   ///< what lies between the sequence number and the delta (item ids)
  size_t text_offset = 0;    ///< where the escaped delta text begins
  std::string_view text;     ///< the escaped delta text
};

/// Splits a delta event, or nullopt when `json` is not one.
std::optional<delta_event_parts> split_delta_event(std::string_view json);

/// When `earlier` and `later` are deltas of the same type and item, sets `earlier` to one event
/// holding both texts under `later`'s sequence number and returns true; else leaves it.
bool merge_delta_events(std::string& earlier, std::string_view later);

}  // namespace cedar::net
