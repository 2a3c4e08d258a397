// Delta event coalescing (see ws_coalesce.hpp). Plain string work on the writer's exact shape;
// anything else is left alone.
#include "net/ws_coalesce.hpp"

namespace cedar::net {

std::optional<delta_event_parts> split_delta_event(std::string_view json) {
  constexpr std::string_view open = "{\"type\":\"", seq = "\",\"sequence_number\":", delta = ",\"delta\":\"";
  if (json.substr(0, open.size()) != open || json.size() < 2 || json.substr(json.size() - 2) != "\"}")
    return std::nullopt;
  const size_t type_end = json.find(seq, open.size());
  if (type_end == std::string_view::npos) return std::nullopt;
  delta_event_parts p;
  p.type = json.substr(open.size(), type_end - open.size());
  if (p.type.size() < 6 || p.type.substr(p.type.size() - 6) != ".delta") return std::nullopt;
  size_t fields_begin = type_end + seq.size();
  while (fields_begin < json.size() && json[fields_begin] >= '0' && json[fields_begin] <= '9') ++fields_begin;
  // The delta is the last field; inside its escaped text every quote follows a backslash, so
  // the last `,"delta":"` is the field itself.
  const size_t delta_at = json.rfind(delta);
  if (delta_at == std::string_view::npos || delta_at < fields_begin) return std::nullopt;
  p.fields = json.substr(fields_begin, delta_at - fields_begin);
  p.text_offset = delta_at + delta.size();
  p.text = json.substr(p.text_offset, json.size() - 2 - p.text_offset);
  return p;
}

bool merge_delta_events(std::string& earlier, std::string_view later) {
  auto a = split_delta_event(earlier);
  auto b = split_delta_event(later);
  if (!a || !b || a->type != b->type || a->fields != b->fields) return false;
  std::string merged;
  merged.reserve(earlier.size() + later.size());
  merged.append(later.substr(0, b->text_offset));
  merged.append(a->text);
  merged.append(b->text);
  merged.append("\"}");
  earlier = std::move(merged);
  return true;
}

}  // namespace cedar::net
