// The JSON grammar matcher and the token mask of structured output (see output_grammar.hpp).
#include "actors/output_grammar.hpp"

#include <algorithm>
#include <numeric>

namespace cedar {
namespace {

enum frame_kind : uint8_t { k_value, k_object, k_array, k_string, k_number, k_literal };
enum object_phase : uint8_t { open, key_open, colon, after_value };
enum array_phase : uint8_t { first, after_item };
enum string_flags : uint8_t { f_key = 1, f_free_key = 2 };
/// Number states: after '-', after a leading 0, integer digits, after '.', fraction digits,
/// after 'e', after the exponent's sign, exponent digits.
enum number_state : int32_t { n_minus = 1, n_zero, n_int, n_dot, n_frac, n_e, n_esign, n_exp };

bool is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool number_final(int32_t s) { return s == n_zero || s == n_int || s == n_frac || s == n_exp; }
uint64_t all_bits(std::size_t n) { return n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1; }

}  // namespace

bool value_may_start(const output_grammar& g, int32_t node, uint8_t c) {
  const grammar_node& n = g.nodes[std::size_t(node)];
  switch (n.kind) {
    case grammar_node::any:
      return c == '{' || c == '[' || c == '"' || c == '-' || is_digit(c) || c == 't' || c == 'f' || c == 'n';
    case grammar_node::object: return c == '{';
    case grammar_node::array: return c == '[';
    case grammar_node::string: return c == '"';
    case grammar_node::number:
    case grammar_node::integer: return c == '-' || is_digit(c);
    case grammar_node::literal:
      return std::any_of(n.names.begin(), n.names.end(), [&](const std::string& s) { return !s.empty() && uint8_t(s[0]) == c; });
    case grammar_node::any_of:
      return std::any_of(n.children.begin(), n.children.end(), [&](int32_t b) { return value_may_start(g, b, c); });
  }
  return false;
}

namespace {

/// The literal texts of `names` in `mask` that byte c extends at position pos.
uint64_t extend(const std::vector<std::string>& names, uint64_t mask, int32_t pos, uint8_t c) {
  uint64_t out = 0;
  for (std::size_t i = 0; i < names.size() && i < 64; ++i)
    if ((mask >> i & 1) && int32_t(names[i].size()) > pos && uint8_t(names[i][std::size_t(pos)]) == c)
      out |= uint64_t{1} << i;
  return out;
}

/// The index of the text in `mask` that is exactly pos bytes long, or -1.
int complete_name(const std::vector<std::string>& names, uint64_t mask, int32_t pos) {
  for (std::size_t i = 0; i < names.size() && i < 64; ++i)
    if ((mask >> i & 1) && int32_t(names[i].size()) == pos) return int(i);
  return -1;
}

/// Whether s is string content as it is: no quote, backslash or control byte, and whole UTF-8
/// characters only (the bytes json_matcher takes inside a string from a character boundary).
bool whole_string_text(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = uint8_t(s[i]);
    if (c == '"' || c == '\\' || c < 0x20) return false;
    if (c < 0x80) { ++i; continue; }
    const std::size_t more = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 0;
    if (more == 0 || i + more >= s.size()) return false;
    const uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    const auto b1 = uint8_t(s[i + 1]);
    if (b1 < lo || b1 > hi) return false;
    for (std::size_t j = 2; j <= more; ++j)
      if ((uint8_t(s[i + j]) & 0xC0) != 0x80) return false;
    i += more + 1;
  }
  return true;
}

}  // namespace

int32_t output_grammar::add(grammar_node n) {
  nodes.push_back(std::move(n));
  return int32_t(nodes.size()) - 1;
}

int32_t output_grammar::any_value() {
  if (any_node >= 0) return any_node;
  any_node = int32_t(nodes.size());
  add({});                                                              // any_node: the value
  grammar_node obj;                                                     // + 1: an object of any values
  obj.kind = grammar_node::object, obj.extra = any_node;
  add(std::move(obj));
  grammar_node arr;                                                     // + 2: an array of any values
  arr.kind = grammar_node::array, arr.children = {any_node};
  add(std::move(arr));
  grammar_node words;                                                   // + 3: true, false, null
  words.kind = grammar_node::literal, words.names = {"true", "false", "null"};
  add(std::move(words));
  return any_node;
}

// ---- json_matcher ------------------------------------------------------------------------------

bool json_matcher::feed(const output_grammar& g, uint8_t c) {
  const bool in_string = depth_ > 0 && stack_[std::size_t(depth_ - 1)].kind == k_string;
  const bool ok = dispatch(g, c);
  if (ok && (in_string || !is_ws(c))) whitespace_run_ = 0;
  return ok;
}

bool json_matcher::take_whitespace() {
  // inside the value only (none before it, none after: the end token follows at once), and no
  // longer than pretty-printing at this depth needs
  return depth_ > 0 && ++whitespace_run_ <= output_grammar::max_whitespace_run + 2 * depth_;
}

bool json_matcher::push(frame f) {
  if (depth_ == output_grammar::max_depth) return false;
  stack_[std::size_t(depth_++)] = f;
  return true;
}

void json_matcher::pop() {
  if (--depth_ == 0) done_ = true;
}

bool json_matcher::dispatch(const output_grammar& g, uint8_t c) {
  if (depth_ == 0) {
    if (is_ws(c)) return take_whitespace();
    return !done_ && start_value(g, g.root, c);
  }
  frame& f = stack_[std::size_t(depth_ - 1)];
  switch (f.kind) {
    case k_value: {
      if (is_ws(c)) return take_whitespace();
      const int32_t node = f.node;
      --depth_;  // the value frame becomes the value's own
      return start_value(g, node, c);
    }
    case k_object: return feed_object(g, f, c);
    case k_array: return feed_array(g, f, c);
    case k_string: return feed_string(g, f, c);
    case k_number: return feed_number(g, f, c);
    case k_literal: return feed_literal(g, f, c);
  }
  return false;
}

bool json_matcher::start_value(const output_grammar& g, int32_t node, uint8_t c) {
  const grammar_node& n = g.nodes[std::size_t(node)];
  const auto number = [&](int32_t num_node) {
    return push({k_number, 0, 0, 0, num_node, c == '-' ? n_minus : c == '0' ? n_zero : n_int});
  };
  switch (n.kind) {
    case grammar_node::any: {  // its helpers follow g.any_node (output_grammar::any_value)
      const int32_t a = g.any_node;
      if (c == '{') return push({k_object, open, 0, 0, a + 1});
      if (c == '[') return push({k_array, first, 0, 0, a + 2});
      if (c == '"') return push({k_string, 0, 0, 0, -1});
      if (c == '-' || is_digit(c)) return number(-1);
      if (!value_may_start(g, a + 3, c)) return false;
      return push({k_literal, 0, 0, 0, a + 3, 0, -1, all_bits(3)}) && dispatch(g, c);
    }
    case grammar_node::object: return c == '{' && push({k_object, open, 0, 0, node});
    case grammar_node::array: return c == '[' && push({k_array, first, 0, 0, node});
    case grammar_node::string: return c == '"' && push({k_string, 0, 0, 0, node});
    case grammar_node::number:
    case grammar_node::integer: return (c == '-' || is_digit(c)) && number(node);
    case grammar_node::literal:
      if (!value_may_start(g, node, c)) return false;
      return push({k_literal, 0, 0, 0, node, 0, -1, all_bits(n.names.size())}) && dispatch(g, c);
    case grammar_node::any_of:
      for (int32_t b : n.children)
        if (value_may_start(g, b, c)) return start_value(g, b, c);
      return false;
  }
  return false;
}

bool json_matcher::feed_object(const output_grammar& g, frame& f, uint8_t c) {
  if (is_ws(c)) return take_whitespace();
  const grammar_node& n = g.nodes[std::size_t(f.node)];
  const uint64_t names = all_bits(n.names.size());
  const bool closable = (n.required & ~f.mask) == 0;
  const auto open_key = [&] {
    const uint64_t unseen = names & ~f.mask;
    if (unseen == 0 && n.extra < 0) return false;
    return push({k_string, 0, 0, uint8_t(f_key | (n.extra >= 0 ? f_free_key : 0)), f.node, 0, -1, unseen});
  };
  switch (f.phase) {
    case open:
      if (c == '}') return closable && (pop(), true);
      return c == '"' && open_key();
    case key_open: return c == '"' && open_key();
    case colon:
      if (c != ':') return false;
      f.phase = after_value;
      return push({k_value, 0, 0, 0, f.next});
    case after_value:
      if (c == '}') return closable && (pop(), true);
      if (c != ',' || ((names & ~f.mask) == 0 && n.extra < 0)) return false;
      f.phase = key_open;
      return true;
  }
  return false;
}

bool json_matcher::feed_array(const output_grammar& g, frame& f, uint8_t c) {
  if (is_ws(c)) return take_whitespace();
  const grammar_node& n = g.nodes[std::size_t(f.node)];
  if (f.phase == first) {
    if (c == ']') return n.min_count == 0 && (pop(), true);
    if (n.max_count == 0) return false;
    f.phase = after_item, f.count = 1;
    return start_value(g, n.children[0], c);
  }
  if (c == ']') return f.count >= n.min_count && (pop(), true);
  if (c != ',' || (n.max_count >= 0 && f.count >= n.max_count)) return false;
  ++f.count;
  return push({k_value, 0, 0, 0, n.children[0]});
}

bool json_matcher::feed_string(const output_grammar& g, frame& f, uint8_t c) {
  const bool key = f.flags & f_key;
  const int32_t max = key || f.node < 0 ? -1 : g.nodes[std::size_t(f.node)].max_count;
  const auto one_more = [&] { return max < 0 || f.count < max ? (++f.count, true) : false; };
  if (f.esc == 1) {  // after a backslash
    if (c == 'u') return f.esc = 2, true;
    if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't') return false;
    f.esc = 0;
    return key || one_more();
  }
  if (f.esc >= 2) {  // the 4 hex digits of \u
    if (!is_hex(c)) return false;
    if (++f.esc < 6) return true;
    f.esc = 0;
    return key || one_more();
  }
  if (f.next > 0) {  // inside a UTF-8 character: its next byte within the range the lead allows
    if (c < uint8_t(f.next >> 8) || c > uint8_t(f.next >> 16)) return false;
    f.next = (f.next & 0xFF) > 1 ? ((f.next & 0xFF) - 1) | 0x80 << 8 | 0xBF << 16 : 0;
    if (key) {
      f.mask = extend(g.nodes[std::size_t(f.node)].names, f.mask, f.count, c);
      ++f.count;
      return f.mask != 0 || (f.flags & f_free_key);
    }
    return true;
  }
  if (c < 0x20) return false;
  if (c >= 0x80) {  // a lead byte: how many continuation bytes follow, the first's range
    const int32_t more = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 0;
    if (more == 0) return false;
    const int32_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    if (!key && !one_more()) return false;
    f.next = more | lo << 8 | hi << 16;
    if (!key) return true;
  }
  if (c == '"') {
    if (key) return end_key(g);
    if (f.node >= 0 && f.count < g.nodes[std::size_t(f.node)].min_count) return false;
    pop();
    return true;
  }
  if (key) {  // the key's bytes against the names not yet seen
    if (c == '\\') {
      if (!(f.flags & f_free_key)) return false;
      f.mask = 0, f.esc = 1;
      return true;
    }
    f.mask = extend(g.nodes[std::size_t(f.node)].names, f.mask, f.count, c);
    ++f.count;
    return f.mask != 0 || (f.flags & f_free_key);
  }
  if (c == '\\') {
    if (max >= 0 && f.count >= max) return false;
    f.esc = 1;
    return true;
  }
  return c >= 0x80 || one_more();  // a lead byte was counted above
}

bool json_matcher::end_key(const output_grammar& g) {
  const frame key = stack_[std::size_t(depth_ - 1)];
  frame& obj = stack_[std::size_t(depth_ - 2)];
  const grammar_node& n = g.nodes[std::size_t(obj.node)];
  const int i = complete_name(n.names, key.mask, key.count);
  if (i >= 0) obj.next = n.children[std::size_t(i)], obj.mask |= uint64_t{1} << i;
  else if (key.flags & f_free_key) obj.next = n.extra;
  else return false;
  --depth_;
  obj.phase = colon;
  return true;
}

bool json_matcher::feed_number(const output_grammar& g, frame& f, uint8_t c) {
  const bool integer = f.node >= 0 && g.nodes[std::size_t(f.node)].kind == grammar_node::integer;
  int32_t next = 0;
  switch (f.count) {
    case n_minus: next = c == '0' ? n_zero : (c >= '1' && c <= '9') ? n_int : 0; break;
    case n_zero:
    case n_int:
    case n_frac:
      if (is_digit(c) && f.count != n_zero) next = f.count;
      else if (c == '.' && f.count != n_frac && !integer) next = n_dot;
      else if ((c == 'e' || c == 'E') && !integer) next = n_e;
      break;
    case n_dot: next = is_digit(c) ? n_frac : 0; break;
    case n_e: next = (c == '+' || c == '-') ? n_esign : is_digit(c) ? n_exp : 0; break;
    case n_esign:
    case n_exp: next = is_digit(c) ? n_exp : 0; break;
  }
  if (next) return f.count = next, true;
  if (!number_final(f.count)) return false;
  pop();  // the number ends: c belongs to what holds it
  return dispatch(g, c);
}

bool json_matcher::feed_literal(const output_grammar& g, frame& f, uint8_t c) {
  const auto& names = g.nodes[std::size_t(f.node)].names;
  if (const uint64_t m = extend(names, f.mask, f.count, c)) return f.mask = m, ++f.count, true;
  if (complete_name(names, f.mask, f.count) < 0) return false;
  pop();
  return dispatch(g, c);
}

bool json_matcher::can_end(const output_grammar& g) const {
  if (done_) return true;
  int d = depth_;
  while (d > 0) {  // what the end of the text would finish
    const frame& f = stack_[std::size_t(d - 1)];
    if (f.kind == k_number && number_final(f.count)) --d;
    else if (f.kind == k_literal && complete_name(g.nodes[std::size_t(f.node)].names, f.mask, f.count) >= 0) --d;
    else break;
  }
  return depth_ > 0 && d == 0;
}

void json_matcher::assign(const json_matcher& other) {
  std::copy(other.stack_.begin(), other.stack_.begin() + other.depth_, stack_.begin());
  depth_ = other.depth_, whitespace_run_ = other.whitespace_run_, done_ = other.done_;
}

bool json_matcher::in_free_string(const output_grammar& g, int32_t& chars_left) const {
  if (depth_ == 0) return false;
  const frame& f = stack_[std::size_t(depth_ - 1)];
  if (f.kind != k_string || (f.flags & f_key) || f.esc != 0 || f.next > 0) return false;
  const int32_t max = f.node < 0 ? -1 : g.nodes[std::size_t(f.node)].max_count;
  chars_left = max < 0 ? -1 : max - f.count;
  return true;
}

// ---- token_vocab -------------------------------------------------------------------------------

token_vocab::token_vocab(std::vector<std::string> bytes, const std::vector<bool>& added, int32_t eos_id)
    : bytes_(std::move(bytes)), eos_id_(eos_id) {
  std::vector<int32_t> all, not_plain;
  for (int32_t id = 0; id < size(); ++id) {
    const std::string& s = bytes_[std::size_t(id)];
    if (s.empty() || (std::size_t(id) < added.size() && added[std::size_t(id)])) continue;
    all.push_back(id);
    max_len_ = std::max(max_len_, s.size());
    const bool plain = whole_string_text(s);
    if (!plain) {
      not_plain.push_back(id);
      continue;
    }
    plain_.push_back(id);
    plain_chars_.push_back(int32_t(std::count_if(s.begin(), s.end(), [](char ch) { return (uint8_t(ch) & 0xC0) != 0x80; })));
  }
  all_ = sort(std::move(all));
  not_plain_ = sort(std::move(not_plain));
}

token_vocab::sorted_list token_vocab::sort(std::vector<int32_t> ids) const {
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return bytes(a) < bytes(b); });
  sorted_list out;
  out.lcp.assign(ids.size(), 0);
  for (std::size_t k = 1; k < ids.size(); ++k) {
    const std::string &a = bytes(ids[k - 1]), &b = bytes(ids[k]);
    const auto diff = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
    out.lcp[k] = int32_t(diff.first - a.begin());
  }
  out.ids = std::move(ids);
  return out;
}

std::vector<uint64_t> token_vocab::allowed(const output_grammar& g, const json_matcher& m) const {
  std::vector<uint64_t> mask((std::size_t(size()) + 63) / 64, 0);
  const auto set = [&](int32_t id) { mask[std::size_t(id) / 64] |= uint64_t{1} << (id % 64); };
  if (m.can_end(g) && eos_id_ >= 0 && eos_id_ < size()) set(eos_id_);
  int32_t chars_left = -1;
  if (m.in_free_string(g, chars_left)) {  // string characters as they are: no walk needed
    for (std::size_t k = 0; k < plain_.size(); ++k)
      if (chars_left < 0 || plain_chars_[k] <= chars_left) set(plain_[k]);
    walk(not_plain_, g, m, mask);
  } else {
    walk(all_, g, m, mask);
  }
  return mask;
}

void token_vocab::walk(const sorted_list& list, const output_grammar& g, const json_matcher& m,
                       std::vector<uint64_t>& mask) const {
  // states[d]: the matcher after the first d bytes of the last token walked; a token reuses the
  // states of the prefix it shares with that one, and a failed byte skips every later token
  // with the same bytes up to it (the list is sorted)
  std::vector<json_matcher> states(max_len_ + 1, m);
  std::size_t valid = 0;
  long fail_at = -1;
  for (std::size_t k = 0; k < list.ids.size(); ++k) {
    const std::size_t shared = std::size_t(list.lcp[k]);
    if (fail_at >= 0 && shared > std::size_t(fail_at)) continue;
    const std::string& s = bytes(list.ids[k]);
    std::size_t j = std::min(shared, valid);
    for (; j < s.size(); ++j) {
      states[j + 1].assign(states[j]);
      if (!states[j + 1].feed(g, uint8_t(s[j]))) break;
    }
    if (j < s.size()) {
      fail_at = long(j), valid = j;
      continue;
    }
    mask[std::size_t(list.ids[k]) / 64] |= uint64_t{1} << (list.ids[k] % 64);
    valid = s.size(), fail_at = -1;
  }
}

}  // namespace cedar
