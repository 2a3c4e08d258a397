// Flag reading for the subcommands. Numbers are strict: "--seed abc" or "--max-tokens 5x" is an
// error, never a silent 0 (as atoi and strtoull would make it). A refused command line says which
// flag and why in one line before the usage, so that a typo is found without reading the usage.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
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

/// What read_integer(text, out, lo, hi) accepts, in words: "an integer in [1, 2147483647]"; a
/// 64-bit type's own maximum is left out ("an integer >= 0"), being past any count a flag means.
template <class T>
std::string integer_range(long double lo = std::numeric_limits<T>::lowest(),
                          long double hi = std::numeric_limits<T>::max()) {
  lo = std::max(lo, (long double)std::numeric_limits<T>::lowest());
  hi = std::min(hi, (long double)std::numeric_limits<T>::max());
  const auto text = [](long double v) {
    return v < 0 ? std::to_string((long long)v) : std::to_string((unsigned long long)v);
  };
  if (sizeof(T) == 8 && hi == (long double)std::numeric_limits<T>::max()) return "an integer >= " + text(lo);
  return "an integer in [" + text(lo) + ", " + text(hi) + "]";
}

/// A subcommand's argv, read flag by flag. The parse loop asks for a value only once it knows
/// the flag, so an unknown flag at the end is reported as unknown, not as missing its value.
/// The first refusal is kept, as one line naming the flag and the reason; reading stops there.
class arg_reader {
 public:
  arg_reader(int argc, char** argv, int first = 1) : argc_(argc), argv_(argv), idx_(first - 1) {}

  /// Steps to the next flag; false at the end, after a refusal, or at --help / -h (then help()).
  bool next() {
    if (!error_.empty() || help_ || ++idx_ >= argc_) return false;
    flag_ = argv_[idx_];
    help_ = flag_ == "--help" || flag_ == "-h";
    return !help_;
  }
  const std::string& flag() const { return flag_; }
  bool help() const { return help_; }
  /// Empty while nothing was refused.
  const std::string& error() const { return error_; }

  /// The flag's value (the next argument); nullopt, refused as missing, when none follows.
  std::optional<std::string> value() {
    if (idx_ + 1 >= argc_) {
      fail(flag_ + " needs a value");
      return std::nullopt;
    }
    return std::string(argv_[++idx_]);
  }
  bool value(std::string& out) {
    auto v = value();
    if (v) out = std::move(*v);
    return bool(v);
  }
  /// The value as an integer in [lo, hi] (read_integer).
  template <class T>
  void integer(T& out, long double lo = std::numeric_limits<T>::lowest(),
               long double hi = std::numeric_limits<T>::max()) {
    if (auto v = value(); v && !read_integer(*v, out, lo, hi)) bad_value(*v, integer_range<T>(lo, hi));
  }
  /// The value as a number in [lo, hi] (read_number); `accepted` says which, e.g. "a number > 0".
  void number(double& out, double lo, double hi, const std::string& accepted) {
    if (auto v = value(); v && !read_number(*v, out, lo, hi)) bad_value(*v, accepted);
  }
  /// The value through `parse` (nullopt: refused; `accepted` says what it takes, e.g. "cpu or cuda").
  template <class T, class Parse>
  void parsed(T& out, Parse parse, const std::string& accepted) {
    auto v = value();
    if (!v) return;
    if (auto r = parse(*v)) out = *r;
    else bad_value(*v, accepted);
  }

  /// Refuses the flag itself: not one this command takes.
  void unknown() { fail("unknown option '" + flag_ + "'"); }
  /// Refuses the flag's value, saying what the flag takes instead.
  void bad_value(const std::string& value, const std::string& accepted) {
    fail(flag_ + ": '" + value + "' is not " + accepted);
  }
  /// Keeps `why` unless an earlier refusal is kept already.
  void fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
  }

 private:
  int argc_;
  char** argv_;
  int idx_;
  std::string flag_, error_;
  bool help_ = false;
};

/// "on" | "off" -> the bool; nullopt on anything else.
inline std::optional<bool> read_on_off(const std::string& text) {
  if (text == "on" || text == "off") return text == "on";
  return std::nullopt;
}

/// A refused command line: "cedar COMMAND: WHY", then the usage, on stderr. Returns 2, the exit status.
inline int refuse(const char* command, const std::string& why, void (*usage)(std::FILE*)) {
  std::fprintf(stderr, "cedar %s: %s\n", command, why.c_str());
  usage(stderr);
  return 2;
}

}  // namespace cedar::cli
