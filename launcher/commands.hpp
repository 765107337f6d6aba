// The `oomflight` subcommands. Each registers its options on the CLI11 app and returns its exit code.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace oomflight::cli {

/// A subcommand's action, run after parsing; returns the process's exit code.
using RunFn = std::function<int()>;

/// A registered subcommand and what it does.
struct Command {
  CLI::App* app;
  RunFn run;
};

Command add_replay(CLI::App& app);
Command add_report(CLI::App& app);
Command add_run(CLI::App& app);
Command add_config(CLI::App& app);

}  // namespace oomflight::cli
