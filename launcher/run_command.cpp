// `oomflight run [--run-name NAME] -- CMD...`: sets the environment, checks it, and execs CMD.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>

#include "commands.hpp"
#include "oomflight/control/config.hpp"

namespace oomflight::cli {

Command add_run(CLI::App& app) {
  auto* sub = app.add_subcommand("run", "Run a command (each rank, under mpirun) with oomflight's environment set");
  auto run_name = std::make_shared<std::string>();
  auto command = std::make_shared<std::vector<std::string>>();
  sub->add_option("--run-name", *run_name, "The job's name (OOMFLIGHT_RUN_NAME), shared by all ranks");
  sub->add_option("command", *command, "The command to run, after --")->required();
  return {sub, [run_name, command] {
    if (!run_name->empty()) setenv("OOMFLIGHT_RUN_NAME", run_name->c_str(), 1);
    try {
      Config::from_environment();  // a bad value stops here, before the job starts, naming the variable
    } catch (const ConfigError& e) {
      print_error(e.what());
      return kExitUsage;
    }
    std::vector<char*> argv;
    for (auto& arg : *command) argv.push_back(arg.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    // The shell's convention: 127 when the command is not found, 126 when it cannot be executed.
    const int error = errno;
    print_error(fmt::format("cannot run '{}': {}", (*command)[0], std::strerror(error)));
    return error == ENOENT ? 127 : 126;
  }};
}

}  // namespace oomflight::cli
