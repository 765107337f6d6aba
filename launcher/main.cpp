// `oomflight`: replay, report, export, import, merge, run, config. Flag parsing only: each command calls into liboomflight or a plugin.
#include <string>
#include <vector>

#include "commands.hpp"
#include "oomflight/oomflight.h"
#include "oomflight/version.h"

namespace oomflight::cli {

void print_error(std::string_view message) { oomflight_log(OOMFLIGHT_LOG_ERROR, std::string(message).c_str()); }

}  // namespace oomflight::cli

int main(int argc, char** argv) {
  using namespace oomflight::cli;
  CLI::App app{"oomflight: a distributed GPU-memory flight recorder for mpirun jobs"};
  // The library that is loaded, not only the headers this command was built with.
  app.set_version_flag("--version", std::string("oomflight ") + oomflight_version());
  app.require_subcommand(1);
  const std::vector<Command> commands = {add_replay(app), add_report(app), add_export(app), add_import(app), add_merge(app), add_run(app),
                                          add_config(app), add_whatif(app), add_diff(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version print and succeed; every other parse error is a usage error: exit 2, as POSIX
    // utilities do (CLI11's own codes, 105 to 113, mean nothing to a shell script).
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }
  for (const auto& command : commands) {
    if (command.app->parsed()) return command.run();
  }
  return kExitUsage;
}
