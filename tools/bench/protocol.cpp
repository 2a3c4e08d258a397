// Request bodies (written by hand, escaped) and event parsing (simdjson DOM).
#include "tools/bench/protocol.hpp"

#include <simdjson.h>


namespace cedar::bench {

const char* api_name(api_kind api) {
  switch (api) {
    case api_kind::chat: return "chat";
    case api_kind::responses: return "responses";
    case api_kind::ws: return "ws";
  }
  return "?";
}

std::optional<api_kind> parse_api(std::string_view name) {
  if (name == "chat") return api_kind::chat;
  if (name == "responses") return api_kind::responses;
  if (name == "ws") return api_kind::ws;
  return std::nullopt;
}

namespace {
void append_messages(std::string& out, const std::vector<message>& messages, size_t first_idx) {
  out += '[';
  for (size_t i = first_idx; i < messages.size(); ++i) {
    if (i > first_idx) out += ',';
    out += "{\"role\":";
    append_json_string(out, messages[i].role);
    out += ",\"content\":";
    append_json_string(out, messages[i].content);
    out += '}';
  }
  out += ']';
}
}  // namespace

std::string chat_body(const std::string& model, const std::vector<message>& messages,
                      int64_t max_tokens) {
  std::string out = "{\"model\":";
  append_json_string(out, model);
  out += ",\"messages\":";
  append_messages(out, messages, 0);
  out += ",\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_tokens\":";
  out += std::to_string(max_tokens);
  out += '}';
  return out;
}

std::string responses_body(const std::string& model, const std::vector<message>& messages,
                           size_t first_idx, const std::string& previous_response_id,
                           int64_t max_tokens, bool websocket) {
  std::string out = websocket ? "{\"type\":\"response.create\",\"model\":" : "{\"model\":";
  append_json_string(out, model);
  out += ",\"input\":";
  append_messages(out, messages, first_idx);
  if (!previous_response_id.empty()) {
    out += ",\"previous_response_id\":";
    append_json_string(out, previous_response_id);
  }
  if (!websocket) out += ",\"stream\":true";
  out += ",\"max_output_tokens\":";
  out += std::to_string(max_tokens);
  out += '}';
  return out;
}

std::vector<std::string> sse_parser::feed(std::string_view bytes) {
  std::vector<std::string> events;
  pending_.append(bytes);
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view line(pending_.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {  // blank line: dispatch
      if (has_data_) events.push_back(std::move(data_));
      data_.clear();
      has_data_ = false;
    } else if (line.substr(0, 5) == "data:") {
      std::string_view value = line.substr(5);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      if (has_data_) data_ += '\n';
      data_.append(value);
      has_data_ = true;
    }
  }
  pending_.erase(0, start);
  return events;
}

namespace {

simdjson::dom::parser& json_parser() {
  static thread_local simdjson::dom::parser parser;
  return parser;
}

std::optional<int64_t> int_field(simdjson::dom::element e, const char* key) {
  int64_t v;
  if (e[key].get_int64().get(v)) return std::nullopt;
  return v;
}

std::string_view string_field(simdjson::dom::element e, const char* key) {
  std::string_view s;
  if (e[key].get_string().get(s)) return {};
  return s;
}

void read_usage(simdjson::dom::element usage, const char* in_key, const char* out_key,
                const char* details_key, stream_event& out) {
  simdjson::dom::object obj;
  if (usage.get_object().get(obj)) return;  // absent or null
  out.num_prompt_tokens = int_field(usage, in_key);
  out.num_output_tokens = int_field(usage, out_key);
  simdjson::dom::element details;
  if (!usage[details_key].get(details)) out.num_cached_tokens = int_field(details, "cached_tokens");
}

std::string error_text(simdjson::dom::element e) {
  std::string_view msg = string_field(e, "message");
  if (msg.empty()) msg = string_field(e, "code");
  return msg.empty() ? std::string("error") : std::string(msg);
}

}  // namespace

bool parse_chat_event(std::string_view data, stream_event& out) {
  out = stream_event{};
  if (data == "[DONE]") {
    out.done = true;
    return true;
  }
  simdjson::dom::element root;
  if (json_parser().parse(data.data(), data.size()).get(root)) return false;
  simdjson::dom::element err;
  if (!root["error"].get(err) && !err.is_null()) {
    out.error = error_text(err);
    return true;
  }
  simdjson::dom::array choices;
  if (!root["choices"].get_array().get(choices)) {
    for (simdjson::dom::element choice : choices) {
      simdjson::dom::element delta;
      if (choice["delta"].get(delta)) continue;
      std::string_view content = string_field(delta, "content");
      out.text.append(content);
      bool reasoning = !string_field(delta, "reasoning_content").empty() ||
                       !string_field(delta, "reasoning").empty();
      simdjson::dom::array tool_calls;
      bool tools = !delta["tool_calls"].get_array().get(tool_calls) && tool_calls.size() > 0;
      out.has_tokens = out.has_tokens || !content.empty() || reasoning || tools;
    }
  }
  simdjson::dom::element usage;
  if (!root["usage"].get(usage))
    read_usage(usage, "prompt_tokens", "completion_tokens", "prompt_tokens_details", out);
  return true;
}

std::string first_model_id(std::string_view models_json) {
  simdjson::dom::element root;
  if (json_parser().parse(models_json.data(), models_json.size()).get(root)) return {};
  simdjson::dom::array models;
  if (root["data"].get_array().get(models)) return {};
  for (simdjson::dom::element m : models) return std::string(string_field(m, "id"));
  return {};
}

bool parse_responses_event(std::string_view data, stream_event& out) {
  out = stream_event{};
  simdjson::dom::element root;
  if (json_parser().parse(data.data(), data.size()).get(root)) return false;
  std::string_view type = string_field(root, "type");
  simdjson::dom::element response;
  bool has_response = !root["response"].get(response);
  if (type == "response.created" || type == "response.in_progress") {
    if (has_response) out.response_id = string_field(response, "id");
  } else if (type == "response.output_text.delta") {
    out.text = string_field(root, "delta");
    out.has_tokens = !out.text.empty();
  } else if (type.find("reasoning") != std::string_view::npos && type.ends_with(".delta")) {
    out.has_tokens = !string_field(root, "delta").empty();
  } else if (type == "response.function_call_arguments.delta") {
    out.has_tokens = true;
  } else if (type == "response.completed" || type == "response.incomplete") {
    out.done = true;
    if (has_response) {
      out.response_id = string_field(response, "id");
      simdjson::dom::element usage;
      if (!response["usage"].get(usage))
        read_usage(usage, "input_tokens", "output_tokens", "input_tokens_details", out);
    }
  } else if (type == "response.failed" || type == "error") {
    simdjson::dom::element err;
    if (has_response && !response["error"].get(err) && !err.is_null())
      out.error = error_text(err);
    else if (!root["error"].get(err) && !err.is_null())
      out.error = error_text(err);
    else
      out.error = std::string(string_field(root, "message"));
    if (out.error.empty()) out.error = std::string(type);
  }
  return true;
}

}  // namespace cedar::bench
