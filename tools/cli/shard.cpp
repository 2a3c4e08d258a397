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
#include "tools/cli/device_model.hpp"
#include "tools/cli/model_source.hpp"
#include "tools/cli/registry.hpp"

namespace {

void print_help() {
  std::fprintf(stderr,
               "usage: cedar shard --connect HOST:PORT [--model NAME] [--seed N] [--tokenizer PATH]\n"
               "                   [engine options]\n\n"
               "Runs one shard of the model for an engine started with --shard-port; the engine's\n"
               "one-shard layout (tp1) then runs its steps here. --model and --seed must match the\n"
               "engine's (default tiny, 1234), and --tokenizer the server's when it names one (its\n"
               "Engram token map goes into the model; a shard whose map differs is refused at join);\n"
               "engine options size the KV (--page-tokens, --kv-budget-bytes, --max-num-seqs,\n"
               "--kv-dtype) and must match too.\n");
}

int shard_main(int argc, char** argv) {
  std::string connect, model_name = "tiny", tokenizer_path;
  uint64_t seed = 1234;
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return print_help(), 0;
    if ((a == "--connect" || a == "--model" || a == "--seed" || a == "--tokenizer") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (a == "--connect") connect = v;
      else if (a == "--model") model_name = v;
      else if (a == "--tokenizer") tokenizer_path = v;
      else if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 19)
        return std::fprintf(stderr, "cedar shard: --seed %s is not a non-negative integer\n", v.c_str()), 2;
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
  const std::string port_text = connect.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port_text) == 0 || std::stoi(port_text) > 65535)
    return std::fprintf(stderr, "cedar shard: --connect %s: the port is not 1-65535\n", connect.c_str()), 2;
  const auto port = uint16_t(std::stoi(port_text));
  std::string error;
  auto args = cedar::cli::load_serving_args(model_name, &error, tokenizer_path);
  if (!args) return std::fprintf(stderr, "cedar shard: %s\n", error.c_str()), 1;
  const auto weights = cedar::cli::load_weights(model_name, *args, seed, true, &error);
  if (!weights) return std::fprintf(stderr, "cedar shard: %s\n", error.c_str()), 1;
  args->weights_digest = weights->digest();  // the engine refuses a shard whose weights differ
  const cedar::engine_options& o = parsed.options;
  std::shared_ptr<const cedar::model> m;
  try {
    m = std::make_shared<const cedar::model>(*args, weights, o.kv_fp8 ? cedar::kv_dtype::fp8 : cedar::kv_dtype::fp4,
                                             o.page_tokens);
  } catch (const std::exception& e) {
    return std::fprintf(stderr, "cedar shard: model: %s\n", e.what()), 1;
  }
  return cedar::serve_remote_shard(m, o, connect.substr(0, colon), port);
}

}  // namespace

CEDAR_COMMAND("shard", "serve one shard of the model to an engine (cedar shard --connect HOST:PORT)", shard_main);
