// Weka trace reader (simdjson DOM), scaling and the theoretical prefix-reuse figure.
#include "tools/bench/trace.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <unordered_set>

namespace cedar::bench {
namespace {

using simdjson::dom::element;
using simdjson::dom::object;

double number_or(const object& o, const char* key, double fallback) {
  element v;
  if (o[key].get(v)) return fallback;
  double d;
  if (!v.get_double().get(d)) return d;
  int64_t i;
  if (!v.get_int64().get(i)) return double(i);
  uint64_t u;
  if (!v.get_uint64().get(u)) return double(u);
  return fallback;
}

std::string string_or(const object& o, const char* key, std::string fallback) {
  std::string_view s;
  if (o[key].get_string().get(s)) return fallback;
  return std::string(s);
}

bool parse_request(const object& o, trace_request& r, std::string& error) {
  r.start_s = number_or(o, "t", 0);
  r.num_input_tokens = int64_t(number_or(o, "in", -1));
  r.num_output_tokens = int64_t(number_or(o, "out", -1));
  r.think_time_s = std::max(0.0, number_or(o, "think_time", 0));
  if (r.num_input_tokens < 0 || r.num_output_tokens < 0) {
    error = "request without 'in'/'out'";
    return false;
  }
  simdjson::dom::array ids;
  if (!o["hash_ids"].get_array().get(ids)) {
    for (element id : ids) {
      int64_t v;
      if (id.get_int64().get(v)) {
        error = "non-integer hash id";
        return false;
      }
      r.hash_ids.push_back(v);
    }
  }
  return true;
}

bool parse_requests(const object& parent, std::vector<trace_request>& out, std::string& error) {
  simdjson::dom::array reqs;
  if (parent["requests"].get_array().get(reqs)) {
    error = "missing 'requests' array";
    return false;
  }
  for (element e : reqs) {
    object o;
    if (e.get_object().get(o)) continue;
    if (string_or(o, "type", "") == "subagent") continue;  // subagents never nest
    trace_request r;
    if (!parse_request(o, r, error)) return false;
    out.push_back(std::move(r));
  }
  return true;
}

}  // namespace

bool parse_trace(const std::string& json, session_trace& out, std::string& error) {
  simdjson::dom::parser parser;
  object root;
  if (auto err = parser.parse(json).get_object().get(root); err) {
    error = std::string("not a JSON object: ") + simdjson::error_message(err);
    return false;
  }
  out = session_trace{};
  out.id = string_or(root, "id", "");
  out.block_size = int(number_or(root, "block_size", 64));
  out.system_tokens =
      int64_t(number_or(root, "system_tokens", 0) + number_or(root, "tool_tokens", 0));
  simdjson::dom::array reqs;
  if (root["requests"].get_array().get(reqs)) {
    error = "missing 'requests' array";
    return false;
  }
  for (element e : reqs) {
    object o;
    if (e.get_object().get(o)) continue;
    if (string_or(o, "type", "") != "subagent") {
      trace_request r;
      if (!parse_request(o, r, error)) return false;
      out.requests.push_back(std::move(r));
      continue;
    }
    subagent_trace s;
    s.agent_id = string_or(o, "agent_id", "");
    s.type = string_or(o, "subagent_type", "");
    s.background = string_or(o, "status", "completed") == "async_launched";
    s.after_request_idx = int(out.requests.size()) - 1;
    if (!parse_requests(o, s.requests, error)) return false;
    if (!s.requests.empty()) out.subagents.push_back(std::move(s));
  }
  if (out.requests.empty()) {
    error = "trace has no main-agent requests";
    return false;
  }
  return true;
}

bool read_trace_file(const std::string& path, session_trace& out, std::string& error) {
  simdjson::padded_string text;
  if (auto err = simdjson::padded_string::load(path).get(text); err) {
    error = path + ": " + simdjson::error_message(err);
    return false;
  }
  if (!parse_trace(std::string(text.data(), text.size()), out, error)) {
    error = path + ": " + error;
    return false;
  }
  if (out.id.empty()) out.id = std::filesystem::path(path).stem().string();
  return true;
}

bool read_traces(const std::string& file_or_dir, std::vector<session_trace>& out,
                 std::string& error) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(file_or_dir, ec)) {
    for (auto& entry : fs::directory_iterator(file_or_dir, ec))
      if (entry.path().extension() == ".json") files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(file_or_dir);
  }
  for (auto& f : files) {
    session_trace t;
    if (!read_trace_file(f, t, error)) return false;
    out.push_back(std::move(t));
  }
  if (out.empty()) {
    error = file_or_dir + ": no trace files";
    return false;
  }
  return true;
}

namespace {
void scale_requests(std::vector<trace_request>& reqs, double factor, int block_size) {
  for (auto& r : reqs) {
    r.num_input_tokens = std::llround(double(r.num_input_tokens) * factor);
    r.num_output_tokens = std::max<int64_t>(1, std::llround(double(r.num_output_tokens) * factor));
    size_t keep = size_t(r.num_input_tokens / block_size);
    if (r.hash_ids.size() > keep) r.hash_ids.resize(keep);
  }
}
}  // namespace

void scale_trace(session_trace& trace, double factor) {
  if (factor >= 1.0 || factor <= 0) return;
  trace.system_tokens = std::llround(double(trace.system_tokens) * factor);
  scale_requests(trace.requests, factor, trace.block_size);
  for (auto& s : trace.subagents) scale_requests(s.requests, factor, trace.block_size);
}

void cap_context(session_trace& trace, int64_t max_context_tokens) {
  if (max_context_tokens <= 0) return;
  auto over = [&](const trace_request& r) {
    return r.num_input_tokens + r.num_output_tokens > max_context_tokens;
  };
  auto cut = std::find_if(trace.requests.begin(), trace.requests.end(), over);
  int num_kept = int(cut - trace.requests.begin());
  trace.requests.erase(cut, trace.requests.end());
  auto& subs = trace.subagents;
  subs.erase(std::remove_if(subs.begin(), subs.end(),
                            [&](const subagent_trace& s) {
                              return s.after_request_idx >= num_kept ||
                                     std::any_of(s.requests.begin(), s.requests.end(), over);
                            }),
             subs.end());
}

double theoretical_prefix_reuse(const session_trace& trace) {
  std::unordered_set<int64_t> seen;
  int64_t num_blocks = 0, num_reused = 0;
  auto visit = [&](const trace_request& r) {
    for (int64_t id : r.hash_ids) num_reused += seen.count(id);
    num_blocks += int64_t(r.hash_ids.size());
    seen.insert(r.hash_ids.begin(), r.hash_ids.end());
  };
  auto visit_subagents_after = [&](int idx) {
    for (auto& s : trace.subagents)
      if (s.after_request_idx == idx)
        for (auto& r : s.requests) visit(r);
  };
  visit_subagents_after(-1);
  for (size_t i = 0; i < trace.requests.size(); ++i) {
    visit(trace.requests[i]);
    visit_subagents_after(int(i));
  }
  return num_blocks ? double(num_reused) / double(num_blocks) : 0.0;
}

}  // namespace cedar::bench
