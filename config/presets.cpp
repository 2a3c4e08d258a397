// Named presets (config/presets/NAME.json, embedded copies as fallback) and the Engram table
// sizes derived from engram_vocab_size when a config does not list them.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/model_config.hpp"
#include "config/preset_texts.hpp"

namespace cedar {

namespace {

bool is_prime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t f = 3; f * f <= n; f += 2)
    if (n % f == 0) return false;
  return true;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (int i = 0; i < num_preset_texts; ++i) names.emplace_back(preset_texts[i].name);
  return names;
}

std::optional<std::string_view> embedded_preset_json(const std::string& name) {
  for (int i = 0; i < num_preset_texts; ++i)
    if (name == preset_texts[i].name) return std::string_view(preset_texts[i].json);
  return std::nullopt;
}

std::optional<std::string> preset_json(const std::string& name) {
  auto embedded = embedded_preset_json(name);
  if (!embedded) return std::nullopt;
  const std::filesystem::path file =
      std::filesystem::path(CEDAR_SOURCE_DIR) / "config" / "presets" / (name + ".json");
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::string(*embedded);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int64_t> engram_table_rows_from_primes(const model_args& args) {
  std::vector<int64_t> rows;
  const int ranges_per_layer = (args.engram_max_ngram_size - 1) * args.engram_n_heads;
  int64_t candidate = args.engram_vocab_size;
  for (std::size_t l = 0; l < args.engram_layer_ids.size(); ++l) {
    int64_t total = 0;
    for (int r = 0; r < ranges_per_layer; ++r) {
      while (!is_prime(candidate)) ++candidate;
      total += candidate++;
    }
    rows.push_back(total);
  }
  return rows;
}

}  // namespace cedar
