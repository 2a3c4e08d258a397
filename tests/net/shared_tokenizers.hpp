// The tokenizers the net tests share, loaded once per test binary: the bundled tokenizer.json
// as it is (DeepSeek-V3's added tokens) and with V4.1's table (what cedar serves with).
#pragma once

#include <doctest/doctest.h>

#include <memory>
#include <string>

#include "net/tokenizer.hpp"

namespace cedar::net::testing {

inline std::unique_ptr<tokenizer> load_bundled(bool v41_table) {
  std::string error;
  const std::string path = tokenizer::default_path();
  auto t = v41_table ? tokenizer::load_dsv41(path, &error) : tokenizer::load(path, &error);
  REQUIRE_MESSAGE(t, error);
  return t;
}

inline const tokenizer& v3() {
  static const auto tok = load_bundled(false);
  return *tok;
}

inline const tokenizer& v41() {
  static const auto tok = load_bundled(true);
  return *tok;
}

}  // namespace cedar::net::testing
