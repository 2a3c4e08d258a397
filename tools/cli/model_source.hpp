// Shared by `cedar generate` and `cedar logits`: opening a model from a checkpoint directory or
// a preset with random weights, a request whose KV memory the command owns, and argument
// helpers. Single-threaded command-line use.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/model/model.hpp"

namespace cedar::cli {

/// Default model: preset `tiny` with random weights from this seed.
constexpr const char* default_model = "tiny";
constexpr uint64_t default_seed = 1;

/// load_model_args, plus the Engram token map built from the tokenizer that serves the model
/// (tokenizer_path, else tokenizer::path_for_model; a preset without one hashes token ids).
/// nullopt and *error on failure.
std::optional<model_args> load_serving_args(const std::string& dir_or_preset, std::string* error,
                                            const std::string& tokenizer_path = "");

/// Opens DIR (config.json + safetensors, checked against the inventory) or PRESET (random
/// weights from `seed`), its KV in pages of `page_tokens` positions; `verbose`: the load's
/// progress on stderr. On failure returns nullptr and sets *error.
std::unique_ptr<model> open_model(const std::string& dir_or_preset, uint64_t seed, kv_dtype dtype, std::string* error,
                                  int page_tokens = default_page_tokens, bool verbose = false);

/// "1,2,3" -> ids, and "a..b" (inclusive) for a run of ids, as in "5,1000..1999"; nullopt on
/// anything else (negative ids, a descending or over-long run, stray characters).
std::optional<std::vector<int32_t>> parse_ids(const std::string& text);

/// "fp4" | "fp8" -> the KV cache's dtype; nullopt on anything else.
std::optional<kv_dtype> parse_kv_dtype(const std::string& text);

/// One request's KV memory, sized for max_tokens positions.
struct owned_request {
  std::vector<std::vector<uint8_t>> pages;
  std::vector<uint8_t> ring;
  std::vector<float> tails;
  request_kv kv;

  owned_request(const kv_layout& layout, int64_t max_tokens);
  owned_request(const owned_request&) = delete;
};

}  // namespace cedar::cli
