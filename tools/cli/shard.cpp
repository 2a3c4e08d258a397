// `cedar shard --connect HOST:PORT`: a shard in its own process. Loads the same model as the
// engine it joins (a preset with random weights from --seed, or a checkpoint directory) and
// serves the runtime published by `cedar serve ... --shard-port PORT` (actors/remote_shard_actor.hpp).
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "actors/remote_shard_actor.hpp"
#include "config/engine_options.hpp"
#include "config/model_config.hpp"
#include "kernels/checkpoint/safetensors.hpp"
#include "kernels/model/random_weights.hpp"
#include "tools/cli/model_source.hpp"
#include "tools/cli/registry.hpp"

namespace {

void print_help() {
  std::fprintf(stderr,
               "usage: cedar shard --connect HOST:PORT [--model NAME] [--seed N] [engine options]\n\n"
               "Runs one shard of the model for an engine started with --shard-port; the engine's\n"
               "one-shard layout (tp1) then runs its steps here. --model and --seed must match the\n"
               "engine's (default tiny, 1234); engine options size the KV (--page-tokens, --kv-budget-bytes,\n"
               "--max-num-seqs, --kv-dtype) and must match too.\n");
}

std::shared_ptr<const cedar::tensor_map> load_weights(const std::string& model, uint64_t seed,
                                                      const cedar::model_args& args, std::string* error) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(model, ec))
    return std::make_shared<const cedar::tensor_map>(cedar::make_random_weights(args, seed));
  auto weights = std::make_shared<cedar::tensor_map>();
  for (auto& entry : fs::directory_iterator(model))
    if (entry.path().extension() == ".safetensors" && !cedar::read_safetensors(entry.path(), *weights, error))
      return nullptr;
  return weights;
}

int shard_main(int argc, char** argv) {
  std::string connect, model_name = "tiny";
  uint64_t seed = 1234;
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return print_help(), 0;
    if ((a == "--connect" || a == "--model" || a == "--seed") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (a == "--connect") connect = v;
      else if (a == "--model") model_name = v;
      else seed = std::stoull(v);
    } else {
      rest.push_back(a);
    }
  }
  const auto parsed = cedar::parse_engine_options(rest);
  const auto colon = connect.rfind(':');
  if (colon == std::string::npos || !parsed.errors.empty() || !parsed.rest.empty()) {
    for (const auto& e : parsed.errors) std::fprintf(stderr, "cedar shard: %s\n", e.c_str());
    for (const auto& r : parsed.rest) std::fprintf(stderr, "cedar shard: unknown argument %s\n", r.c_str());
    print_help();
    return 2;
  }
  std::string error;
  const auto args = cedar::cli::load_serving_args(model_name, &error);
  if (!args) return std::fprintf(stderr, "cedar shard: %s\n", error.c_str()), 1;
  const auto weights = load_weights(model_name, seed, *args, &error);
  if (!weights) return std::fprintf(stderr, "cedar shard: %s\n", error.c_str()), 1;
  const cedar::engine_options& o = parsed.options;
  std::shared_ptr<const cedar::model> m;
  try {
    m = std::make_shared<const cedar::model>(*args, weights, o.kv_fp8 ? cedar::kv_dtype::fp8 : cedar::kv_dtype::fp4,
                                             o.page_tokens);
  } catch (const std::exception& e) {
    return std::fprintf(stderr, "cedar shard: model: %s\n", e.what()), 1;
  }
  return cedar::serve_remote_shard(m, o, connect.substr(0, colon), uint16_t(std::stoi(connect.substr(colon + 1))));
}

}  // namespace

CEDAR_COMMAND("shard", "serve one shard of the model to an engine (cedar shard --connect HOST:PORT)", shard_main);
