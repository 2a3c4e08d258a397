// The tokenizers the net tests share, loaded once per test binary: the bundled tokenizer.json
// as it is (DeepSeek-V3's added tokens) and with V4.1's table (what cedar serves with).
#pragma once

#include <doctest/doctest.h>

#include "net/tokenizer.hpp"

namespace cedar::net::testing {

inline const tokenizer& v3() {
  static auto tok = [] {
    std::string error;
    auto t = tokenizer::load(tokenizer::default_path(), &error);
    REQUIRE_MESSAGE(t, error);
    return t;
  }();
  return *tok;
}

inline const tokenizer& v41() {
  static auto tok = [] {
    std::string error;
    auto t = tokenizer::load_dsv41(tokenizer::default_path(), &error);
    REQUIRE_MESSAGE(t, error);
    return t;
  }();
  return *tok;
}

}  // namespace cedar::net::testing
