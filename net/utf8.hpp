// UTF-8 helpers (validation, repair, code-point encoding) used across net/. Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cedar::net {

/// Length (1-4) of the valid UTF-8 character starting at s[pos], or 0 if it is invalid there
/// (overlong, surrogate, above U+10FFFF, or cut short by the end of s).
size_t utf8_sequence_length(std::string_view s, size_t pos);
/// Length of the longest prefix of `s` that is valid UTF-8.
size_t valid_utf8_prefix(std::string_view s);
/// Number of bytes (0-3) at the end of `s` that begin a valid character not yet complete.
size_t utf8_incomplete_tail(std::string_view s);
/// Copy of `s` with each invalid sequence replaced by U+FFFD (one per maximal subpart).
std::string sanitize_utf8(std::string_view s);
/// Appends code point `cp` (must be a scalar value) as UTF-8.
void append_utf8(std::string& out, uint32_t cp);
/// The code point of the n-byte valid sequence at s[pos].
uint32_t decode_utf8_at(std::string_view s, size_t pos, size_t n);

}  // namespace cedar::net
