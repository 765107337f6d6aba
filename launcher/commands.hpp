// The `oomflight` subcommands. Each registers its options on the CLI11 app and returns its action. Exit codes
// (README "Exit codes"): 0 success, 1 a runtime failure (the replayed job ran out of memory, an archive cannot be
// read), 2 a usage or configuration error, 126/127 `run` cannot execute / find its command.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string_view>

namespace oomflight::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

/// The largest rank the commands accept (--ranks, --world-size - 1): 2^24 - 1, a thousand times the largest jobs
/// oomflight is built for (docs/scale.md), far from int32's end, whose overflow in world_size is then impossible.
inline constexpr int kMaxRank = (1 << 24) - 1;

/// A subcommand's action, run after parsing; returns the process's exit code.
using RunFn = std::function<int()>;

/// A registered subcommand and what it does.
struct Command {
  CLI::App* app;
  RunFn run;
};

Command add_replay(CLI::App& app);
Command add_report(CLI::App& app);
Command add_merge(CLI::App& app);
Command add_export(CLI::App& app);
Command add_import(CLI::App& app);
Command add_run(CLI::App& app);
Command add_config(CLI::App& app);
Command add_whatif(CLI::App& app);
Command add_diff(CLI::App& app);

/// Prints an error in oomflight's log format ("oomflight error: ...") through the C API.
void print_error(std::string_view message);

}  // namespace oomflight::cli
