// config.json parsing, presets, the derived layer map (spec §1, §6.1) and validate().
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "config/model_config.hpp"

using namespace cedar;

namespace {

model_args load(const std::string& name) {
  std::string error;
  auto args = load_model_args(name, &error);
  REQUIRE_MESSAGE(args.has_value(), error);
  return *args;
}

/// One row of a layer-map table: ratio, mode, KV source, top-k source.
struct map_row {
  int first, last, ratio;
  layer_mode mode;
  int kv_source;   ///< -2: the layer itself
  int topk_source; ///< -2: the layer itself
};

void check_rows(const model_args& a, const std::vector<map_row>& rows) {
  int covered = 0;
  for (const map_row& r : rows)
    for (int l = r.first; l <= r.last; ++l) {
      CAPTURE(l);
      const layer_info& li = a.layers.at(l);
      CHECK(li.compress_ratio == r.ratio);
      CHECK(li.mode == r.mode);
      CHECK(li.kv_source == (r.kv_source == -2 ? l : r.kv_source));
      CHECK(li.topk_source == (r.topk_source == -2 ? l : r.topk_source));
      ++covered;
    }
  CHECK(covered == a.num_hidden_layers);
}

/// The real preset's text with one text_config field replaced.
std::string real_with(const std::string& field, const std::string& value) {
  std::string text = *preset_json("deepseek-v4.1-flash");
  const std::string key = "\"" + field + "\": ";
  const std::size_t at = text.find(key);
  REQUIRE(at != std::string::npos);
  const std::size_t begin = at + key.size();
  const std::size_t end = text.find_first_of(",\n", text[begin] == '[' ? text.find(']', begin) : begin);
  return text.substr(0, begin) + value + text.substr(end);
}

std::vector<std::string> problems_of(const std::string& json) {
  model_args a;
  std::string error;
  REQUIRE_MESSAGE(parse_model_config(json, a, &error), error);
  return a.validate();
}

bool mentions(const std::vector<std::string>& problems, const std::string& text) {
  for (const std::string& p : problems)
    if (p.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("every preset parses, validates, and its embedded copy equals the file") {
  const std::vector<std::string> names = preset_names();
  for (const char* want : {"deepseek-v4.1-flash", "tiny", "micro", "bench-40L-E64"})
    CHECK(std::find(names.begin(), names.end(), want) != names.end());
  for (const std::string& name : names) {
    CAPTURE(name);
    model_args a = load(name);
    CHECK(a.validate().empty());
    std::ifstream in(std::filesystem::path(CEDAR_SOURCE_DIR) / "config/presets" / (name + ".json"));
    std::ostringstream file;
    file << in.rdbuf();
    CHECK_MESSAGE(file.str() == std::string(*embedded_preset_json(name)),
                  "run config/presets/embed.sh after editing a preset");
  }
}

TEST_CASE("the real preset has spec §1's values and layer map") {
  model_args a = load("deepseek-v4.1-flash");
  CHECK(a.hidden_size == 5120);
  CHECK(a.vocab_size == 129280);
  CHECK(a.rms_norm_eps == 1e-20);
  CHECK(a.rope_scaling.factor == 16.0);
  CHECK(a.rope_scaling.original_max_position_embeddings == 65536);
  CHECK(a.compress_ratios.size() == 43);
  CHECK(a.engram_num_embeddings == std::vector<int64_t>{384006168, 384016682});
  // The listed table sizes are what successive primes >= engram_vocab_size give (spec §2.8).
  CHECK(engram_table_rows_from_primes(a) == a.engram_num_embeddings);
  CHECK(a.quant.expert_dtype == "fp4");
  CHECK(a.truncate_from_layer == 21);
  const int own = -2;
  check_rows(a, {{0, 1, 0, layer_mode::swa, -1, -1},
                 {2, 2, 2, layer_mode::full, own, own},
                 {3, 7, 2, layer_mode::reuse, 2, 2},
                 {8, 8, 2, layer_mode::full, own, own},
                 {9, 13, 2, layer_mode::reuse, 8, 8},
                 {14, 14, 2, layer_mode::full, own, own},
                 {15, 19, 2, layer_mode::reuse, 14, 14},
                 {20, 20, 1, layer_mode::full, own, own},
                 {21, 23, 1, layer_mode::reuse, 20, 20},
                 {24, 24, 1, layer_mode::reindex, 20, own},
                 {25, 27, 1, layer_mode::reuse, 20, 24},
                 {28, 28, 1, layer_mode::reindex, 20, own},
                 {29, 31, 1, layer_mode::reuse, 20, 28},
                 {32, 32, 1, layer_mode::reindex, 20, own},
                 {33, 35, 1, layer_mode::reuse, 20, 32},
                 {36, 36, 1, layer_mode::reindex, 20, own},
                 {37, 39, 1, layer_mode::reuse, 20, 36}});
  for (const layer_info& li : a.layers) {
    CAPTURE(li.layer_idx);
    CHECK(li.has_engram == (li.layer_idx == 1 || li.layer_idx == 14));
    CHECK(li.is_decoder == (li.layer_idx >= 20));
    CHECK(li.is_candidate_source == (li.layer_idx == 20));
    CHECK(li.uses_candidates == (li.layer_idx >= 24 && li.layer_idx % 4 == 0));
    const int slot = li.kv_source < 0 ? -1 : li.kv_source == 2 ? 0 : li.kv_source == 8 ? 1 : li.kv_source == 14 ? 2 : 3;
    CHECK(li.kv_source_slot == slot);
  }
}

TEST_CASE("tiny keeps the real layer map and vocabulary with the small dims of §6.1") {
  model_args real = load("deepseek-v4.1-flash"), tiny = load("tiny");
  CHECK(tiny.vocab_size == 129280);
  CHECK(tiny.hidden_size == 256);
  CHECK(tiny.engram_num_embeddings == std::vector<int64_t>{3198, 3460});
  CHECK(engram_table_rows_from_primes(tiny) == tiny.engram_num_embeddings);
  CHECK(tiny.compress_ratios == real.compress_ratios);
  REQUIRE(tiny.layers.size() == real.layers.size());
  for (std::size_t l = 0; l < real.layers.size(); ++l) {
    CAPTURE(l);
    CHECK(tiny.layers[l].mode == real.layers[l].mode);
    CHECK(tiny.layers[l].kv_source == real.layers[l].kv_source);
    CHECK(tiny.layers[l].topk_source == real.layers[l].topk_source);
    CHECK(tiny.layers[l].uses_candidates == real.layers[l].uses_candidates);
    CHECK(tiny.layers[l].has_engram == real.layers[l].has_engram);
  }
  CHECK(tiny.truncate_from_layer == 21);
}

TEST_CASE("micro has the micro-10 map of §6.1") {
  model_args a = load("micro");
  const int own = -2;
  check_rows(a, {{0, 1, 0, layer_mode::swa, -1, -1},
                 {2, 2, 2, layer_mode::full, own, own},
                 {3, 3, 2, layer_mode::reuse, 2, 2},
                 {4, 4, 2, layer_mode::full, own, own},
                 {5, 5, 2, layer_mode::reuse, 4, 4},
                 {6, 6, 1, layer_mode::full, own, own},
                 {7, 7, 1, layer_mode::reuse, 6, 6},
                 {8, 8, 1, layer_mode::reindex, 6, own},
                 {9, 9, 1, layer_mode::reuse, 6, 8}});
  CHECK(a.layers[8].uses_candidates);
  CHECK(a.layers[1].has_engram);
  CHECK(a.layers[4].has_engram);
  CHECK(a.truncate_from_layer == 7);
}

TEST_CASE("bench-40L-E64 keeps real shapes with 64 experts and smaller Engram tables") {
  model_args a = load("bench-40L-E64");
  CHECK(a.n_routed_experts == 64);
  CHECK(a.hidden_size == 5120);
  CHECK(a.engram_num_embeddings == engram_table_rows_from_primes(a));
  for (int64_t rows : a.engram_num_embeddings) CHECK(rows / 1000000 == 48);  // §6.2: ~48.0M
}

TEST_CASE("written config.json reads back to the same args") {
  for (const std::string& name : preset_names()) {
    CAPTURE(name);
    model_args a = load(name);
    const std::string text = model_config_json(a);
    model_args b;
    std::string error;
    REQUIRE_MESSAGE(parse_model_config(text, b, &error), error);
    CHECK(model_config_json(b) == text);
    CHECK(b.compress_ratios == a.compress_ratios);
    CHECK(b.rms_norm_eps == a.rms_norm_eps);
    CHECK(b.hc_eps == a.hc_eps);
    CHECK(b.engram_num_embeddings == a.engram_num_embeddings);
    CHECK(b.quant.weight_block_size[1] == 32);
  }
}

TEST_CASE("text_config wins over the top level; top-level-only fields are read") {
  model_args a;
  std::string error;
  const char* json = R"({"hidden_size": 1024, "vocab_size": 1000, "bos_token_id": 5,
                        "text_config": {"hidden_size": 2048, "candidate_source_layer_id": 7}})";
  REQUIRE(parse_model_config(json, a, &error));
  CHECK(a.hidden_size == 2048);
  CHECK(a.vocab_size == 1000);
  CHECK(a.bos_token_id == 5);
  CHECK(a.truncate_from_layer == 8);  // default: candidate source + 1
}

TEST_CASE("malformed or wrongly-typed fields are refused naming the field") {
  model_args a;
  std::string error;
  CHECK_FALSE(parse_model_config("{\"text_config\": {\"hidden_size\": \"big\"}}", a, &error));
  CHECK(error.find("text_config.hidden_size") != std::string::npos);
  CHECK_FALSE(parse_model_config("{\"kv_source_layer_ids\": 3}", a, &error));
  CHECK(error.find("kv_source_layer_ids") != std::string::npos);
  CHECK_FALSE(parse_model_config("{\"hidden_size\": ", a, &error));
  CHECK(error.find("config.json") != std::string::npos);
  CHECK_FALSE(load_model_args("no-such-preset", &error));
  CHECK(error.find("tiny") != std::string::npos);
}

TEST_CASE("validate names the broken field") {
  CHECK(mentions(problems_of(real_with("num_attention_heads", "60")),
                 "text_config.num_attention_heads: 60 is not divisible by o_groups 8"));
  CHECK(mentions(problems_of(real_with("head_dim", "500")), "text_config.head_dim: 500 is not a multiple of 32"));
  CHECK(mentions(problems_of(real_with("compress_ratios", "[0, 0, 2]")), "text_config.compress_ratios: has 3 entries"));
  CHECK(mentions(problems_of(real_with("kv_source_layer_ids", "[2, 8, 14, 20, 40]")),
                 "text_config.kv_source_layer_ids: layer 40 is out of range"));
  CHECK(mentions(problems_of(real_with("index_source_layer_ids", "[0, 2, 8, 14, 20]")),
                 "text_config.index_source_layer_ids: layer 0 has compress ratio 0"));
  CHECK(mentions(problems_of(real_with("candidate_source_layer_id", "24")),
                 "text_config.candidate_source_layer_id: layer 24 is not a KV source"));
  CHECK(mentions(problems_of(real_with("engram_num_embeddings", "[5]")),
                 "text_config.engram_num_embeddings: has 1 entries"));
  CHECK(mentions(problems_of(real_with("num_experts_per_tok", "400")), "text_config.num_experts_per_tok"));
  CHECK(mentions(problems_of(real_with("truncate_from_layer", "20")), "text_config.truncate_from_layer"));
  CHECK(mentions(problems_of(real_with("kv_source_layer_ids", "[2, 8, 14]")),
                 "layer 20 (ratio 1) has no KV source of its ratio"));
  CHECK(mentions(problems_of(real_with("weight_block_size", "[128, 128]")), "quantization_config.weight_block_size"));
  CHECK(problems_of(real_with("hidden_size", "5120")).empty());
  // values the forward pass does not implement: refused rather than served as something else
  CHECK(mentions(problems_of(real_with("type", "\"linear\"")), "text_config.rope_scaling.type: 'linear'"));
  CHECK(mentions(problems_of(real_with("quant_method", "\"awq\"")), "quantization_config.quant_method: 'awq'"));
  CHECK(mentions(problems_of(real_with("architectures", "[\"LlamaForCausalLM\"]")), "architectures: 'LlamaForCausalLM'"));
  CHECK(mentions(problems_of(real_with("model_type", "\"llama\"")), "model_type: 'llama'"));
}

TEST_CASE("a checkpoint's config.json that leaves out a field shaping the model is refused, naming it") {
  for (const std::string& name : preset_names()) CHECK(missing_model_fields(*preset_json(name)).empty());
  const std::string full = *preset_json("micro");
  std::string partial = full;
  for (const char* key : {"\"sliding_window\"", "\"rms_norm_eps\""}) {
    const std::size_t at = partial.find(key);
    REQUIRE(at != std::string::npos);
    partial.replace(at + 1, 1, "x");  // "xliding_window": the field is gone, the JSON still parses
  }
  CHECK(missing_model_fields(partial) == std::vector<std::string>{"rms_norm_eps", "sliding_window"});
  const auto dir = std::filesystem::temp_directory_path() / ("cedar-config-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << partial;
  std::string error;
  CHECK_FALSE(load_model_args(dir.string(), &error));
  CHECK(error.find("lacks rms_norm_eps, sliding_window") != std::string::npos);
  std::ofstream(dir / "config.json") << full;
  CHECK(load_model_args(dir.string(), &error));  // the whole config loads
  std::ofstream(dir / "partial.json") << partial;  // a bare config (random weights) keeps defaults
  CHECK(load_model_args((dir / "partial.json").string(), &error));
  std::filesystem::remove_all(dir);
}
