// Helpers shared by the tests: fixture paths, temporary folders, running commands, expected replays.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "oomflight/record/event.hpp"
#include "oomflight/sim/simulated_device.hpp"

namespace oomflight::test {

/// The snapshot this project's own example wrote on an H200 (examples/pytorch/snapshots, committed: every clone has
/// it): 3,600 trace entries, 6.93 GiB reserved at its peak. Fails the test (ADD_FAILURE + throw) when it is missing.
std::string own_snapshot();

/// Path of a third-party snapshot by file name, in $TORCH_SNAPSHOTS or ../shared/data/torch-snapshots (beside the
/// checkout; a plain clone has none); empty when it is not there. Tests take it through
/// OOMFLIGHT_SHARED_SNAPSHOT_OR_SKIP, which skips them saying what is missing.
std::string shared_snapshot(const std::string& name);

/// Why a test that needs the shared snapshot `name` is skipped: what is missing, and where to put it.
std::string missing_shared_snapshot(const std::string& name);

/// Declares `var` as the path of the shared snapshot `name`, or skips the test (GTEST_SKIP, which ctest reports as
/// skipped) naming what is missing.
#define OOMFLIGHT_SHARED_SNAPSHOT_OR_SKIP(var, name)                                   \
  const std::string var = ::oomflight::test::shared_snapshot(name);                    \
  if (var.empty()) GTEST_SKIP() << ::oomflight::test::missing_shared_snapshot(name)

/// The command line of the built `oomflight` with `args` (for run_command).
std::string cli(const std::string& args);

/// A fresh empty folder under the build's temp area, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// Output and exit status of a shell command.
struct CommandResult {
  int exit_code = -1;
  std::string output;  ///< stdout and stderr together
};

/// Runs `command` with /bin/sh in `cwd`, with a 300 s timeout.
CommandResult run_command(const std::string& command, const std::filesystem::path& cwd);

/// Files under `dir` (recursively) whose name ends with `suffix`, sorted.
std::vector<std::filesystem::path> files_with_suffix(const std::filesystem::path& dir, const std::string& suffix);

/// One event as the simulator emits it.
struct SimEvent {
  Action action;
  std::uint64_t addr, size;
  std::int32_t stack_id = kNoStack;
};

/// Collects the simulator's events.
class CollectingSink final : public sim::EventSink {
 public:
  void event(Action action, std::uint64_t addr, std::uint64_t size, std::uint64_t, std::int32_t stack_id) override {
    events.push_back({action, addr, size, stack_id});
  }
  void memory(const MemoryStats& s) override { last = s; }
  std::vector<SimEvent> events;
  MemoryStats last;
};

/// The events one loop of the snapshot at the path `snapshot` at `capacity` bytes emits (what a rank of `oomflight replay --steps 1`
/// records after its step marker).
std::vector<SimEvent> expected_replay(const std::string& snapshot, std::uint64_t capacity);

/// The events a rank of `oomflight replay` (of the snapshot at the path `snapshot`) records before its first step
/// marker: the trace's start state
/// (SimulatedDevice::emit_start_state).
std::vector<SimEvent> expected_start_state(const std::string& snapshot, std::uint64_t capacity);

/// "OMPI_ALLOW_RUN_AS_ROOT=1 ... mpirun --oversubscribe -np N" with the environment the tests need.
std::string mpirun(int ranks);

}  // namespace oomflight::test
