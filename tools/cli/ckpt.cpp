// `cedar ckpt`: writes a random checkpoint (config.json + safetensors in the real formats) for
// a preset or config, streaming shard by shard so checkpoints larger than memory can be made.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "config/model_config.hpp"
#include "kernels/model/random_weights.hpp"
#include "tools/cli/flags.hpp"
#include "tools/cli/registry.hpp"

namespace {

void ckpt_usage(FILE* out) {
  std::fprintf(out,
               "usage: cedar ckpt --preset NAME|CONFIG.json|DIR --out DIR [--seed S] [--shard-gib G] [--threads N]\n"
               "  Writes DIR/config.json and random weights (model.safetensors, or shards of at most G GiB\n"
               "  plus model.safetensors.index.json). Same seed, same bytes.\n");
}

/// Prints "NN% x.x/y.y GiB r.r GiB/s" to stderr at most every half second, and at the end.
struct progress_printer {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now(), last = start;
  void operator()(uint64_t done, uint64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (done != total && now - last < std::chrono::milliseconds(500)) return;
    last = now;
    const double secs = std::chrono::duration<double>(now - start).count();
    const double gib = 1024.0 * 1024 * 1024;
    std::fprintf(stderr, "\r%5.1f%%  %.2f / %.2f GiB  %.2f GiB/s ", total ? 100.0 * done / total : 100.0, done / gib,
                 total / gib, secs > 0 ? done / gib / secs : 0.0);
    if (done == total) std::fprintf(stderr, "\n");
  }
};

int ckpt_main(int argc, char** argv) {
  std::string preset, out;
  uint64_t seed = 1;
  double shard_gib = 0;
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--help" || a == "-h") return ckpt_usage(stdout), 0;
    if (a == "--preset" && has_value) preset = argv[++i];
    else if (a == "--out" && has_value) out = argv[++i];
    else if (a == "--seed" && has_value && cedar::cli::read_integer(argv[i + 1], seed)) ++i;
    else if (a == "--shard-gib" && has_value && cedar::cli::read_number(argv[i + 1], shard_gib, 0)) ++i;
    else if (a == "--threads" && has_value && cedar::cli::read_integer(argv[i + 1], threads, 0)) ++i;
    else return std::fprintf(stderr, "cedar ckpt: unknown or incomplete option '%s'\n", a.c_str()), ckpt_usage(stderr), 2;
  }
  if (preset.empty() || out.empty()) return ckpt_usage(stderr), 2;
  std::string error;
  auto args = cedar::load_model_args(preset, &error);
  if (!args) return std::fprintf(stderr, "cedar ckpt: %s\n", error.c_str()), 1;
  const uint64_t shard_bytes = uint64_t(shard_gib * 1024 * 1024 * 1024);
  std::fprintf(stderr, "cedar ckpt: %s, seed %llu -> %s\n", preset.c_str(), (unsigned long long)seed, out.c_str());
  progress_printer progress;
  if (!cedar::write_random_checkpoint(*args, seed, out, shard_bytes, std::ref(progress), &error, threads))
    return std::fprintf(stderr, "\ncedar ckpt: %s\n", error.c_str()), 1;
  return 0;
}

}  // namespace

CEDAR_COMMAND("ckpt", "write a random checkpoint (real formats) for a preset", ckpt_main);
