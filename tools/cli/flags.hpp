// Strict numeric flag values for the subcommands: "--seed abc" or "--max-tokens 5x" is an
// error, never a silent 0 (as atoi and strtoull would make it).
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>

namespace cedar::cli {

/// `text` as a whole base-10 integer that T holds and that lies in [lo, hi]; false (and `out`
/// unchanged) otherwise.
template <class T>
bool read_integer(const std::string& text, T& out, long double lo = std::numeric_limits<T>::lowest(),
                  long double hi = std::numeric_limits<T>::max()) {
  static_assert(std::is_integral_v<T>);
  if (text.empty() || (std::is_unsigned_v<T> && text.find('-') != std::string::npos)) return false;
  errno = 0;
  char* end = nullptr;
  using wide = std::conditional_t<std::is_unsigned_v<T>, unsigned long long, long long>;
  const wide v = std::is_unsigned_v<T> ? wide(std::strtoull(text.c_str(), &end, 10))
                                       : wide(std::strtoll(text.c_str(), &end, 10));
  const long double x = (long double)v;
  if (*end != 0 || errno == ERANGE || x < lo || x > hi || x < (long double)std::numeric_limits<T>::lowest() ||
      x > (long double)std::numeric_limits<T>::max())
    return false;
  out = T(v);
  return true;
}

/// `text` as a finite number in [lo, hi]; false (and `out` unchanged) otherwise.
inline bool read_number(const std::string& text, double& out, double lo = -std::numeric_limits<double>::max(),
                        double hi = std::numeric_limits<double>::max()) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (*end != 0 || errno == ERANGE || !(v >= lo && v <= hi)) return false;
  out = v;
  return true;
}

}  // namespace cedar::cli
