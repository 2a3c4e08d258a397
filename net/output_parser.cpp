// The streaming output parser (net/output_parser.hpp): a small state machine over a buffer of
// unresolved text. Every decision waits until the buffer holds enough to be certain, which is
// what makes the result independent of how the stream was cut.
#include "net/output_parser.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>

#include "net/py_json.hpp"
#include "net/utf8.hpp"

namespace cedar::net {

namespace {

constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kThinkBegin = "<think>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kDsml = "<｜DSML｜";
constexpr std::string_view kDsmlClose = "</｜DSML｜";
// What may follow "<｜DSML｜" (after an optional space) to open a block, by dialect.
constexpr std::array<std::string_view, 3> kBlockNames = {"calls>", "tool_calls>", "function_calls>"};
constexpr std::array<std::string_view, 4> kTextMarkers = {kThinkEnd, kThinkBegin, kEos, kDsml};

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// Result of matching `s` against `pattern` at its start.
enum class match { no, partial, yes };
match match_at(std::string_view s, std::string_view pattern) {
  size_t n = std::min(s.size(), pattern.size());
  if (s.substr(0, n) != pattern.substr(0, n)) return match::no;
  return n == pattern.size() ? match::yes : match::partial;
}

// Matches "<｜DSML｜" [" "] NAME or "</｜DSML｜" [" "] NAME at the start of s; *len gets its length.
match match_tag(std::string_view s, std::string_view open, std::string_view name, size_t* len) {
  match m = match_at(s, open);
  if (m != match::yes) return m;
  size_t pos = open.size();
  if (pos == s.size()) return match::partial;
  if (s[pos] == ' ') ++pos;
  m = match_at(s.substr(pos), name);
  if (m == match::yes) *len = pos + name.size();
  return m;
}

// Length of the longest suffix of s that is a proper prefix of a marker.
size_t partial_marker_suffix(std::string_view s) {
  size_t best = 0;
  for (auto marker : kTextMarkers)
    for (size_t k = std::min(s.size(), marker.size() - 1); k > best; --k)
      if (s.substr(s.size() - k) == marker.substr(0, k)) {
        best = k;
        break;
      }
  return best;
}

// Where an invoke opened at the start of s (its tag `open_len` long) ends without its closing
// tag: the first block close, EOS or next invoke tag, whole; npos when there is none yet.
size_t lenient_invoke_end(std::string_view s, size_t open_len) {
  size_t best = std::string_view::npos, len = 0;
  for (size_t at = s.find(kDsmlClose, open_len); at < best && at != std::string_view::npos;
       at = s.find(kDsmlClose, at + 1))
    for (auto name : kBlockNames)
      if (match_tag(s.substr(at), kDsmlClose, name, &len) == match::yes) best = std::min(best, at);
  for (size_t at = s.find(kDsml, open_len); at < best && at != std::string_view::npos; at = s.find(kDsml, at + 1))
    if (match_tag(s.substr(at), kDsml, "invoke", &len) == match::yes) best = std::min(best, at);
  return std::min(best, s.find(kEos, open_len));
}

struct invoke_param {
  std::string key, value;
  bool is_string = true;
};

// Reads `"VALUE"` after `attr=` at s[*pos] (whitespace allowed before attr).
bool read_attr(std::string_view s, size_t* pos, std::string_view attr, std::string* value) {
  size_t p = *pos;
  while (p < s.size() && is_space(s[p])) ++p;
  if (s.substr(p, attr.size()) != attr) return false;
  p += attr.size();
  if (s.substr(p, 2) != "=\"") return false;
  p += 2;
  size_t end = s.find('"', p);
  if (end == std::string_view::npos) return false;
  *value = std::string(s.substr(p, end - p));
  *pos = end + 1;
  return true;
}

bool expect_gt(std::string_view s, size_t* pos) {
  size_t p = *pos;
  while (p < s.size() && is_space(s[p])) ++p;
  if (p >= s.size() || s[p] != '>') return false;
  *pos = p + 1;
  return true;
}

// Parses one whole invoke element; false if it is malformed.
bool parse_invoke(std::string_view s, std::string* name, std::vector<invoke_param>* params, std::string* why) {
  size_t len = 0, pos = 0;
  if (match_tag(s, kDsml, "invoke", &len) != match::yes) return *why = "no invoke tag", false;
  pos = len;
  if (!read_attr(s, &pos, "name", name) || name->empty() || !expect_gt(s, &pos))
    return *why = "invoke without a name=\"...\" attribute", false;
  for (;;) {
    while (pos < s.size() && is_space(s[pos])) ++pos;
    std::string_view rest = s.substr(pos);
    if (match_tag(rest, kDsmlClose, "invoke>", &len) == match::yes) return pos + len == s.size() || (*why = "text after invoke", false);
    if (match_tag(rest, kDsml, "parameter", &len) != match::yes) return *why = "expected a parameter or the end of the invoke", false;
    pos += len;
    invoke_param p;
    if (!read_attr(s, &pos, "name", &p.key)) return *why = "parameter without a name", false;
    size_t save = pos;
    std::string flag;
    if (read_attr(s, &pos, "string", &flag)) {
      if (flag != "true" && flag != "false") return *why = "string=\"" + flag + "\" is neither true nor false", false;
      p.is_string = flag == "true";
    } else {
      pos = save;
      p.is_string = false;  // no flag (older dialects): JSON if it parses, text otherwise
    }
    if (!expect_gt(s, &pos)) return *why = "unterminated parameter tag", false;
    size_t end = std::string_view::npos, close_len = 0;
    for (size_t at = s.find(kDsmlClose, pos); at != std::string_view::npos; at = s.find(kDsmlClose, at + 1))
      if (match_tag(s.substr(at), kDsmlClose, "parameter>", &close_len) == match::yes) {
        end = at;
        break;
      }
    if (end == std::string_view::npos) return *why = "parameter without its closing tag", false;
    p.value = std::string(s.substr(pos, end - pos));
    pos = end + close_len;
    for (const auto& q : *params)
      if (q.key == p.key) return *why = "duplicate parameter '" + p.key + "'", false;
    params->push_back(std::move(p));
  }
}

std::string arguments_json(const std::vector<invoke_param>& params) {
  std::string out = "{";
  for (size_t i = 0; i < params.size(); ++i) {
    if (i) out += ", ";
    append_python_json_string(&out, params[i].key);
    out += ": ";
    const auto& v = params[i].value;
    if (!params[i].is_string && parse_json(v, nullptr)) out += v;
    else append_python_json_string(&out, v);  // a string, or a non-JSON "false" value kept as text
  }
  return out + "}";
}

void log_to_stderr(std::string_view w) {
  std::fprintf(stderr, "cedar: warning: %.*s\n", static_cast<int>(w.size()), w.data());
}

std::atomic<warning_log_fn> g_warning_log{&log_to_stderr};

}  // namespace

void set_output_warning_log(warning_log_fn fn) { g_warning_log.store(fn); }

void output_parser::warn(std::string warning, output_delta* out) {
  if (warning_log_fn fn = g_warning_log.load()) fn(warning);
  out->warnings.push_back(std::move(warning));
}

void output_delta::append(output_delta&& d) {
  reasoning += d.reasoning;
  content += d.content;
  for (auto& c : d.tool_calls) tool_calls.push_back(std::move(c));
  for (auto& w : d.warnings) warnings.push_back(std::move(w));
}

void output_parser::emit_text(std::string_view text, output_delta* out) {
  (state_ == state::reasoning ? out->reasoning : out->content) += text;
}

void output_parser::emit_call_or_content(std::string_view raw, output_delta* out) {
  std::string name, why;
  std::vector<invoke_param> params;
  if (parse_invoke(raw, &name, &params, &why)) {
    out->tool_calls.push_back(parsed_tool_call{num_calls_++, std::move(name), arguments_json(params)});
    return;
  }
  warn("malformed tool call (" + why + "), returned as content: " + std::string(raw.substr(0, 200)), out);
  out->content += raw;
}

// Reasoning or content: pass text through up to the next marker.
bool output_parser::step_text(bool final, output_delta* out) {
  size_t at = std::string::npos;
  std::string_view which;
  for (auto marker : kTextMarkers) {
    size_t p = buf_.find(marker);
    if (p < at) at = p, which = marker;
  }
  if (at == std::string::npos) {
    // Hold a possible marker start, an incomplete character, and newlines that may turn out
    // to be the separator before a tool block.
    size_t keep = final ? 0 : std::max(partial_marker_suffix(buf_), utf8_incomplete_tail(buf_));
    size_t cut = buf_.size() - keep;
    while (!final && cut > 0 && buf_[cut - 1] == '\n') --cut;
    emit_text(std::string_view(buf_).substr(0, cut), out);
    buf_.erase(0, cut);
    return false;
  }
  std::string_view before = std::string_view(buf_).substr(0, at);
  if (which == kDsml) {
    std::string_view rest = std::string_view(buf_).substr(at);
    size_t len = 0;
    bool incomplete = false;
    for (auto name : kBlockNames) {
      match m = match_tag(rest, kDsml, name, &len);
      if (m == match::yes) {
        while (!before.empty() && before.back() == '\n') before.remove_suffix(1);
        emit_text(before, out);
        buf_.erase(0, at + len);
        state_ = state::tool_block;
        return true;
      }
      incomplete = incomplete || m == match::partial;
    }
    match m = match_tag(rest, kDsml, "invoke", &len);
    if (m == match::yes) {  // an invoke without its block
      while (!before.empty() && before.back() == '\n') before.remove_suffix(1);
      emit_text(before, out);
      buf_.erase(0, at);
      state_ = state::bare_invokes;
      return true;
    }
    incomplete = incomplete || m == match::partial;
    if (incomplete && !final) {  // wait for the rest of the tag (and keep the newlines before it)
      size_t cut = at;
      while (cut > 0 && buf_[cut - 1] == '\n') --cut;
      emit_text(std::string_view(buf_).substr(0, cut), out);
      buf_.erase(0, cut);
      return false;
    }
    emit_text(std::string_view(buf_).substr(0, at + kDsml.size()), out);  // just text
    buf_.erase(0, at + kDsml.size());
    return true;
  }
  emit_text(before, out);
  buf_.erase(0, at + which.size());
  if (which == kThinkEnd && state_ == state::reasoning) state_ = state::content;
  if (which == kEos) state_ = state::done;
  return true;  // <think>, and </think> in content, are absorbed
}

// Inside a tool block (or a run of bare invokes): one invoke at a time.
bool output_parser::step_tool(bool final, output_delta* out) {
  size_t ws = 0;
  while (ws < buf_.size() && is_space(buf_[ws])) ++ws;
  std::string_view rest = std::string_view(buf_).substr(ws);
  if (rest.empty()) {
    if (final) buf_.clear();
    return false;
  }
  size_t len = 0;
  bool partial = false;
  if (state_ == state::tool_block) {
    for (auto name : kBlockNames) {
      match m = match_tag(rest, kDsmlClose, name, &len);
      if (m == match::yes) {
        buf_.erase(0, ws + len);
        state_ = state::content;
        return true;
      }
      partial = partial || m == match::partial;
    }
  }
  match m = match_tag(rest, kDsml, "invoke", &len);
  if (m == match::yes) {
    size_t close = std::string_view::npos, close_len = 0;
    for (size_t at = rest.find(kDsmlClose); at != std::string_view::npos; at = rest.find(kDsmlClose, at + 1)) {
      match c = match_tag(rest.substr(at), kDsmlClose, "invoke>", &close_len);
      if (c == match::yes) {
        close = at;
        break;
      }
      if (c == match::partial && !final) return false;
    }
    // Leniently, an invoke also ends where its block closes, the output ends (EOS) or the next
    // invoke opens without its closing tag; that marker is left for the next step.
    size_t cut = lenient_invoke_end(rest, len);
    if (cut < close) {
      warn("tool call without its closing tag, closed where the next marker begins", out);
      emit_call_or_content(std::string(rest.substr(0, cut)) + std::string(kDsmlClose) + " invoke>", out);
      buf_.erase(0, ws + cut);
      return true;
    }
    if (close == std::string_view::npos) {
      if (!final) return false;
      warn("unterminated tool call at the end of the output, returned as content", out);
      out->content += rest;
      buf_.clear();
      return false;
    }
    emit_call_or_content(rest.substr(0, close + close_len), out);
    buf_.erase(0, ws + close + close_len);
    return true;
  }
  partial = partial || m == match::partial || match_at(rest, kEos) == match::partial;
  if (partial && !final) return false;
  if (match_at(rest, kEos) == match::yes) {
    buf_.erase(0, ws + kEos.size());
    state_ = state::done;
    return true;
  }
  // Anything else ends the calls: text after bare invokes is content, its line break kept as
  // after a block ("ok\n<invoke>...</invoke>\nmore" reads "ok\nmore"); inside a block it is
  // malformed, so the block's remaining text becomes content too.
  if (state_ == state::tool_block) {
    warn("unexpected text inside a tool-call block, returned as content", out);
    buf_.erase(0, ws);  // the line break that separated it from the calls
  }
  state_ = state::content;
  return true;
}

void output_parser::run(bool final, output_delta* out) {
  for (bool progress = true; progress;) {
    switch (state_) {
      case state::reasoning:
      case state::content: progress = step_text(final, out); break;
      case state::tool_block:
      case state::bare_invokes: progress = step_tool(final, out); break;
      case state::done: buf_.clear(); progress = false; break;
    }
  }
}

output_delta output_parser::feed(std::string_view text) {
  output_delta out;
  buf_.append(text);
  run(false, &out);
  return out;
}

output_delta output_parser::finish() {
  output_delta out;
  run(true, &out);
  if (!buf_.empty()) {  // only invalid UTF-8 can be left; keep it visible as content
    out.content += sanitize_utf8(buf_);
    buf_.clear();
  }
  return out;
}

output_delta parse_output(std::string_view text, bool thinking) {
  output_parser p(thinking);
  output_delta all = p.feed(text);
  all.append(p.finish());
  return all;
}

}  // namespace cedar::net
