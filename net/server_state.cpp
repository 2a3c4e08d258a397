// server_state helpers: ids, the request log, and the Responses store.
#include "net/server_state.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>

#include "net/json_writer.hpp"

namespace cedar::net {

std::string server_state::new_id(const char* prefix) {
  static const uint64_t salt = std::random_device{}() * 0x9E3779B97F4A7C15ull;
  uint64_t n = next_id.fetch_add(1) * 0xBF58476D1CE4E5B9ull ^ salt;
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx", prefix, (unsigned long long)n);
  return buf;
}

log_value log_value::millis(double ms) {
  if (!std::isfinite(ms)) return log_value("nan");
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.3f", ms);
  log_value v{std::string(buf)};
  v.literal = true;
  return v;
}

std::string server_state::format_log_line(std::string_view ts, std::span<const log_field> fields) const {
  if (options.log_json) {
    json_writer w;
    w.obj().kv("ts", ts);
    for (auto& [k, v] : fields) {
      if (v.text.empty()) continue;
      if (v.literal) w.key(k).raw(v.text);
      else w.kv(k, v.text);
    }
    return w.end_obj().take();
  }
  std::string line = "ts=";
  line += ts;
  for (auto& [k, v] : fields) {
    if (v.text.empty()) continue;
    line += ' ';
    line += k;
    line += '=';
    // Quoted (JSON string escapes) unless plain printable ASCII: a newline or a control byte
    // in a path, a layout name or an engine error must not start a forged line.
    bool quote = std::any_of(v.text.begin(), v.text.end(), [](char c) {
      const auto u = static_cast<unsigned char>(c);
      return u <= ' ' || u >= 0x7F || c == '"' || c == '=' || c == '\\';
    });
    if (quote) append_json_string(line, v.text); else line += v.text;
  }
  return line;
}

void server_state::log_event(const std::string& event, const std::vector<runtime_event_field>& fields) {
  std::vector<log_field> line{{"event", log_value(event)}};
  for (const auto& f : fields) {
    log_value v(f.text);
    v.literal = f.number;
    line.emplace_back(f.key, std::move(v));
  }
  log(line);
}

void server_state::log(std::span<const log_field> fields) {
  char ts[40];
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  int ms = int(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  size_t n = std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(ts + n, sizeof ts - n, ".%03dZ", ms);
  std::string line = format_log_line(ts, fields);
  line += '\n';
  std::lock_guard lock(log_mutex_);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

void response_store::put(std::shared_ptr<const stored_response> r) {
  std::vector<uint64_t> to_close;
  {
    std::lock_guard lock(mutex_);
    if (auto it = index_.find(r->id); it != index_.end()) return;
    lru_.push_front(r);
    index_[r->id] = lru_.begin();
    bytes_ += r->bytes;
    if (r->session_id) ++session_refs_[r->session_id];
    while (lru_.size() > capacity_ || (bytes_ > capacity_bytes_ && lru_.size() > 1)) {
      auto victim = lru_.back();
      lru_.pop_back();
      if (uint64_t s = forget_locked(victim)) to_close.push_back(s);
    }
  }
  for (uint64_t s : to_close) engine_->close_session(s);
}

uint64_t response_store::forget_locked(const entry& victim) {
  index_.erase(victim->id);
  bytes_ -= victim->bytes;
  if (victim->session_id && --session_refs_[victim->session_id] == 0) {
    session_refs_.erase(victim->session_id);
    return victim->session_id;
  }
  return 0;
}

std::shared_ptr<const stored_response> response_store::get(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = index_.find(id);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return *it->second;
}

bool response_store::erase(const std::string& id) {
  uint64_t close = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = index_.find(id);
    if (it == index_.end()) return false;
    auto victim = *it->second;
    lru_.erase(it->second);
    close = forget_locked(victim);
  }
  if (close) engine_->close_session(close);
  return true;
}

void response_store::release(uint64_t session_id) {
  if (session_id == 0) return;
  {
    std::lock_guard lock(mutex_);
    if (session_refs_.count(session_id)) return;
  }
  engine_->close_session(session_id);
}

size_t response_store::size() const {
  std::lock_guard lock(mutex_);
  return lru_.size();
}

size_t response_store::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

}  // namespace cedar::net
