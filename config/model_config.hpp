// Reading and writing a checkpoint's config.json (spec §1) and loading named presets
// (config/presets/NAME.json, also embedded in the binary). Fields may sit at the top level or
// in text_config; text_config wins. Pure functions, no global state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/model_args.hpp"

namespace cedar {

/// Parses config.json text into `out` (fields it lacks keep out's current values), then fills
/// the derived defaults (truncate_from_layer, engram_num_embeddings) and the layer map.
/// Returns false and sets *error (naming the field) on malformed JSON or a wrongly-typed field.
/// Does not call validate().
bool parse_model_config(std::string_view json, model_args& out, std::string* error);

/// The fields that shape the weights or the forward pass (spec §1) that `json` has in neither
/// text_config nor the top level. A checkpoint's config.json must have them all: a default
/// would serve another model than the one trained.
std::vector<std::string> missing_model_fields(std::string_view json);

/// Loads model args from a checkpoint directory (DIR/config.json, which must have every field
/// of missing_model_fields), a .json file, or a preset name (see preset_names()), then
/// validates them. On failure returns nullopt and sets *error (problems joined by "; ").
std::optional<model_args> load_model_args(const std::string& dir_or_preset, std::string* error);

/// The config.json text of `args` in the real layout (top level + text_config), including
/// cedar's truncate_from_layer. parse_model_config(model_config_json(a)) gives back `a`.
std::string model_config_json(const model_args& args);

/// Names of the presets built into the binary.
std::vector<std::string> preset_names();

/// The preset's config.json text: config/presets/NAME.json under CEDAR_SOURCE_DIR when that
/// file exists, else the copy embedded at build time. nullopt for an unknown name.
std::optional<std::string> preset_json(const std::string& name);

/// The copy embedded at build time (nullopt for an unknown name).
std::optional<std::string_view> embedded_preset_json(const std::string& name);

/// Rows of each Engram table (one per engram_layer_ids entry): every (n-gram size, head) pair
/// owns a disjoint range whose length is a prime; the primes are the successive primes
/// >= engram_vocab_size, taken layer by layer (spec §2.8, §6.1: base 509 gives 3198, 3460).
std::vector<int64_t> engram_table_rows_from_primes(const model_args& args);

}  // namespace cedar
