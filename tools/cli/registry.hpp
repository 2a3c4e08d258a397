// The `cedar` binary's subcommands. Each tools/cli/<name>.cpp registers one with
// CEDAR_COMMAND(name, summary, fn); tools/cedar.cpp dispatches on argv[1].
#pragma once

#include <map>
#include <string>

namespace cedar::cli {

using command_fn = int (*)(int argc, char** argv);  ///< argv[0] is the subcommand name

struct command {
  std::string summary;
  command_fn fn = nullptr;
};

std::map<std::string, command>& commands();

struct registrar {
  registrar(const char* name, const char* summary, command_fn fn) {
    commands()[name] = command{summary, fn};
  }
};

}  // namespace cedar::cli

#define CEDAR_COMMAND(name, summary, fn) \
  static ::cedar::cli::registrar cedar_cmd_registrar_##fn{name, summary, fn}
