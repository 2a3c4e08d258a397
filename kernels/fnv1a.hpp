// FNV-1a, 64-bit: a cheap fingerprint of bytes (sampled weights, the Engram token map, a
// conversation's text), not a cryptographic hash. Header-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace cedar {

class fnv1a {
 public:
  fnv1a& add(const void* bytes, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) h_ = (h_ ^ static_cast<const uint8_t*>(bytes)[i]) * 0x100000001b3ull;
    return *this;
  }
  uint64_t value() const { return h_; }
  /// 16 lower-case hex digits.
  std::string hex() const {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h_));
    return buf;
  }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace cedar
