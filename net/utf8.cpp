// UTF-8 validation and repair shared by the tokenizer, the incremental decoder and the
// chat encoding. Pure functions; any thread.
#include "net/utf8.hpp"

namespace cedar::net {

size_t utf8_sequence_length(std::string_view s, size_t pos) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[pos + k]); };
  size_t left = s.size() - pos;
  unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no UTF-16 surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (left < 2 || b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < need; ++k)
    if (left <= k || (b(k) & 0xC0) != 0x80) return 0;
  return need;
}

size_t valid_utf8_prefix(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (pos + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + pos, 8);
      if (w & 0x8080808080808080ull) break;
      pos += 8;
    }
    if (pos >= s.size()) break;
    size_t n = utf8_sequence_length(s, pos);
    if (n == 0) return pos;
    pos += n;
  }
  return pos;
}

size_t utf8_incomplete_tail(std::string_view s) {
  // A tail of 1-3 bytes that starts a valid sequence but is cut short.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    size_t pos = s.size() - back;
    unsigned char c = static_cast<unsigned char>(s[pos]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need <= back || c < 0xC2 || c > 0xF4) return 0;
    // Check that the bytes present could still become a valid character.
    std::string probe(s.substr(pos));
    while (probe.size() < need) probe.push_back(static_cast<char>(0x80));
    if (c == 0xE0 && back == 1) probe[1] = static_cast<char>(0xA0);
    if (c == 0xF0 && back == 1) probe[1] = static_cast<char>(0x90);
    return utf8_sequence_length(probe, 0) == need ? back : 0;
  }
  return 0;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    size_t good = valid_utf8_prefix(s.substr(pos));
    out.append(s.substr(pos, good));
    pos += good;
    if (pos >= s.size()) break;
    // Maximal subpart: skip the lead byte and the continuation bytes it accepted.
    size_t skip = 1;
    unsigned char c = static_cast<unsigned char>(s[pos]);
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 1;
    while (skip < need && pos + skip < s.size()) {
      std::string probe(s.substr(pos, skip + 1));
      while (probe.size() < need) probe.push_back(static_cast<char>(0x80));
      if (utf8_sequence_length(probe, 0) != need) break;
      ++skip;
    }
    out.append("\xEF\xBF\xBD");
    pos += skip;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t decode_utf8_at(std::string_view s, size_t pos, size_t n) {
  auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[pos + k])); };
  switch (n) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

}  // namespace cedar::net
