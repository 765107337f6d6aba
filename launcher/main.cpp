// `oomflight`: replay, report, run, config.
#include <vector>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"oomflight: a distributed GPU-memory flight recorder for mpirun jobs"};
  app.require_subcommand(1);
  const std::vector<oomflight::cli::Command> commands = {
      oomflight::cli::add_replay(app), oomflight::cli::add_report(app), oomflight::cli::add_run(app),
      oomflight::cli::add_config(app)};
  CLI11_PARSE(app, argc, argv);
  for (const auto& command : commands) {
    if (command.app->parsed()) return command.run();
  }
  return 2;
}
