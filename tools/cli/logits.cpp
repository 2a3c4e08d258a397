// `cedar logits`: fp32 logits of every prompt position on the CPU backend, the golden data
// other backends are compared against. Output file: one JSON header line
// {"rows":N,"vocab":V,"dtype":"f32"}, then N x V little-endian floats.
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "tools/cli/flags.hpp"
#include "tools/cli/model_source.hpp"
#include "tools/cli/registry.hpp"

namespace {

struct logits_args {
  std::string model = cedar::cli::default_model;
  uint64_t seed = cedar::cli::default_seed;
  std::string prompt_ids, out;
  int chunk = 0;
  cedar::kv_dtype kv = cedar::kv_dtype::fp4;
};

void usage(FILE* out) {
  std::fprintf(out,
               "usage: cedar logits [--model DIR|PRESET] [--seed S] --prompt-ids 1,2,3 --out FILE\n"
               "                    [--chunk N] [--kv-dtype fp4|fp8]\n"
               "  writes {\"rows\":N,\"vocab\":V,\"dtype\":\"f32\"}\\n then N x V little-endian fp32 logits,\n"
               "  one row per prompt position (default model: preset '%s', random weights, seed %llu)\n",
               cedar::cli::default_model, static_cast<unsigned long long>(cedar::cli::default_seed));
}

/// Empty when the arguments are taken; otherwise why not, naming the flag.
std::string parse(cedar::cli::arg_reader& r, logits_args& a) {
  while (r.next()) {
    const std::string& k = r.flag();
    if (k == "--model") r.value(a.model);
    else if (k == "--seed") r.integer(a.seed);
    else if (k == "--prompt-ids") r.value(a.prompt_ids);
    else if (k == "--out") r.value(a.out);
    else if (k == "--chunk") r.integer(a.chunk, 0);
    else if (k == "--kv-dtype") r.parsed(a.kv, cedar::cli::parse_kv_dtype, "fp4 or fp8");
    else r.unknown();
  }
  if (r.help() || !r.error().empty()) return r.error();
  if (a.prompt_ids.empty()) return "--prompt-ids is required";
  if (a.out.empty()) return "--out is required";
  return "";
}

int logits_main(int argc, char** argv) {
  logits_args a;
  cedar::cli::arg_reader reader(argc, argv);
  const std::string refused = parse(reader, a);
  if (reader.help()) return usage(stdout), 0;
  if (!refused.empty()) return cedar::cli::refuse("logits", refused, usage);
  const auto prompt = cedar::cli::parse_ids(a.prompt_ids);
  if (!prompt) {
    std::fprintf(stderr, "cedar: --prompt-ids must be comma-separated non-negative integers\n");
    return 2;
  }
  std::string error;
  auto m = cedar::cli::open_model(a.model, a.seed, a.kv, &error);
  if (!m) {
    std::fprintf(stderr, "cedar: %s\n", error.c_str());
    return 1;
  }
  const int n = int(prompt->size()), vocab = m->args().vocab_size;
  for (int32_t id : *prompt)
    if (id >= vocab) {
      std::fprintf(stderr, "cedar: token id %d is outside the vocabulary (%d)\n", id, vocab);
      return 2;
    }
  cedar::cli::owned_request req(m->layout(), n);
  std::vector<float> logits;
  const int chunk = a.chunk > 0 ? a.chunk : n;
  for (int p = 0; p < n; p += chunk) {
    cedar::forward_item it;
    it.kv = &req.kv;
    it.history = std::span(*prompt).first(p);
    it.tokens = std::span(*prompt).subspan(p, std::min(chunk, n - p));
    it.logits = cedar::logits_mode::all;
    m->forward(std::span(&it, 1), logits);
  }
  std::FILE* f = std::fopen(a.out.c_str(), "wb");
  if (!f) {
    std::fprintf(stderr, "cedar: cannot write '%s'\n", a.out.c_str());
    return 1;
  }
  const std::string header = "{\"rows\":" + std::to_string(n) + ",\"vocab\":" + std::to_string(vocab) +
                             ",\"dtype\":\"f32\"}\n";
  bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
  // Floats are written in host order: cedar's hosts are little-endian (x86-64, aarch64).
  ok = ok && std::fwrite(logits.data(), sizeof(float), logits.size(), f) == logits.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::fprintf(stderr, "cedar: write to '%s' failed\n", a.out.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

CEDAR_COMMAND("logits", "fp32 logits of every prompt position (CPU backend) to a file", logits_main);
