// Layout names (see layout.hpp).
#include "actors/layout.hpp"

#include <algorithm>
#include <cctype>

#include "kernels/fnv1a.hpp"

namespace cedar {

std::string layout_spec::name() const {
  return (mode == parallel_mode::tp ? "tp" : "dep") + std::to_string(num_shards);
}

namespace {

/// FNV-1a over the Engram token map's little-endian bytes ("ids" when token ids hash as they are).
std::string engram_map_digest(const model_args& a) {
  if (!a.engram_token_map) return "ids";
  fnv1a h;
  for (int32_t v : *a.engram_token_map) {
    const uint8_t bytes[4] = {uint8_t(v), uint8_t(uint32_t(v) >> 8), uint8_t(uint32_t(v) >> 16),
                              uint8_t(uint32_t(v) >> 24)};
    h.add(bytes, 4);
  }
  return h.hex();
}

}  // namespace

std::string model_fingerprint(const model_args& a, const kv_layout& kv) {
  return "layers=" + std::to_string(a.num_hidden_layers) + " hidden=" + std::to_string(a.hidden_size) +
         " heads=" + std::to_string(a.num_attention_heads) + " experts=" + std::to_string(a.n_routed_experts) +
         " vocab=" + std::to_string(a.vocab_size) + " page_tokens=" + std::to_string(kv.page_tokens) +
         " kv=" + (kv.dtype == kv_dtype::fp8 ? "fp8" : "fp4") + " engram_map=" + engram_map_digest(a) +
         (a.weights_digest.empty() ? "" : " weights=" + a.weights_digest);
}

outcome<layout_spec> parse_layout_name(const std::string& text) {
  layout_spec s;
  std::string digits;
  if (text.rfind("tp", 0) == 0) {
    digits = text.substr(2);
  } else if (text.rfind("dep", 0) == 0) {
    s.mode = parallel_mode::dep;
    digits = text.substr(3);
  } else {
    return engine_error{engine_errc::bad_params, "layout '" + text + "' is not tpN or depN"};
  }
  if (digits.empty() || digits.size() > 3 || !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(c); }))
    return engine_error{engine_errc::bad_params, "layout '" + text + "' needs a shard count (tp4, dep2)"};
  s.num_shards = std::stoi(digits);
  return s;
}

outcome<layout_spec> parse_layout(const std::string& text, const model_args& args) {
  auto named = parse_layout_name(text);
  if (!named) return named;
  const layout_spec s = named.value();
  if (const std::string why = check_layout(args, s.mode, s.num_shards); !why.empty())
    return engine_error{engine_errc::bad_params, "layout '" + text + "': " + why};
  return s;
}

}  // namespace cedar
