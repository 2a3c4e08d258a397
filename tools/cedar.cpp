// `cedar`: one binary for every job (serve, generate, info, ckpt, tokenize, bench, ...).
// Subcommands live in tools/cli/ and register themselves; this file only dispatches.
#include <cstdio>
#include <cstring>

#include "tools/cli/registry.hpp"

namespace cedar::cli {
std::map<std::string, command>& commands() {
  static std::map<std::string, command> table;
  return table;
}
}  // namespace cedar::cli

static void usage(FILE* out) {
  std::fprintf(out,
               "cedar: a serving runtime for DeepSeek-V4.1-Flash\n\n"
               "usage: cedar <command> [options]   (cedar <command> --help for its options)\n\n"
               "commands:\n");
  for (auto& [name, cmd] : cedar::cli::commands())
    std::fprintf(out, "  %-12s %s\n", name.c_str(), cmd.summary.c_str());
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  auto& table = cedar::cli::commands();
  auto it = table.find(argv[1]);
  if (it == table.end()) {
    std::fprintf(stderr, "cedar: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
  }
  return it->second.fn(argc - 1, argv + 1);
}
