// Model opening and request memory for the model commands (see model_source.hpp).
#include "tools/cli/model_source.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "config/model_config.hpp"
#include "kernels/checkpoint/safetensors.hpp"
#include "kernels/model/inventory.hpp"
#include "kernels/model/random_weights.hpp"
#include "net/engram_map.hpp"
#include "net/tokenizer.hpp"
#include "tools/cli/device_model.hpp"

namespace cedar::cli {

std::optional<model_args> load_serving_args(const std::string& dir_or_preset, std::string* error,
                                            const std::string& tokenizer_path) {
  auto args = load_model_args(dir_or_preset, error);
  if (!args || args->engram_layer_ids.empty()) return args;
  // A checkpoint must hash as it was trained; random weights (a preset or a bare config.json)
  // may hash token ids as they are when no tokenizer fits them.
  const bool checkpoint = std::filesystem::is_directory(dir_or_preset);
  std::string why;
  const std::string path = tokenizer_path.empty() ? net::tokenizer::path_for_model(dir_or_preset) : tokenizer_path;
  auto tok = net::tokenizer::load_dsv41(path, &why);
  if (!tok) why = "Engram token map: " + why;
  else if (net::attach_engram_token_map(*args, *tok, &why)) return args;
  if (!checkpoint && tokenizer_path.empty()) return args;
  *error = why;
  return std::nullopt;
}

std::unique_ptr<model> open_model(const std::string& dir_or_preset, uint64_t seed, kv_dtype dtype, std::string* error,
                                  int page_tokens, bool verbose) {
  auto args = load_serving_args(dir_or_preset, error);
  if (!args) return nullptr;
  auto weights = load_weights(dir_or_preset, *args, seed, verbose, error);
  if (!weights) return nullptr;
  try {
    return std::make_unique<model>(*args, std::move(weights), dtype, page_tokens);
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
}

std::optional<std::vector<int32_t>> parse_ids(const std::string& text) {
  constexpr int64_t max_range = int64_t(1) << 24;  // ids one range may expand to
  std::vector<int32_t> ids;
  const char* p = text.c_str();
  const auto number = [&p](long& v) {
    char* end = nullptr;
    v = std::strtol(p, &end, 10);
    if (end == p || *p == '-' || *p == '+' || v > INT32_MAX) return false;
    p = end;
    return true;
  };
  while (*p) {
    long first = 0, last = 0;
    if (!number(first)) return std::nullopt;
    last = first;
    if (p[0] == '.' && p[1] == '.') {
      p += 2;
      if (!number(last) || last < first || last - first >= max_range) return std::nullopt;
    }
    for (long v = first; v <= last; ++v) ids.push_back(int32_t(v));
    if (*p == ',') ++p;
    else if (*p) return std::nullopt;
  }
  if (ids.empty()) return std::nullopt;
  return ids;
}

std::optional<kv_dtype> parse_kv_dtype(const std::string& text) {
  if (text == "fp4") return kv_dtype::fp4;
  if (text == "fp8") return kv_dtype::fp8;
  return std::nullopt;
}

owned_request::owned_request(const kv_layout& layout, int64_t max_tokens) {
  pages.assign(max_tokens / layout.page_tokens + 1, std::vector<uint8_t>(layout.page_bytes, 0));
  for (auto& p : pages) kv.pages.push_back(p.data());
  ring.assign(layout.ring_bytes(), 0);
  tails.assign(layout.tail_floats(), 0.0f);
  kv.swa_ring = ring.data();
  kv.tails = tails.data();
}

}  // namespace cedar::cli
