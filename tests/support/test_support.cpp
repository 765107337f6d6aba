// Test helpers (see test_support.hpp).
#include "test_support.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fmt/format.h>
#include <random>

#include "oomflight/format/torch_snapshot.hpp"
#include "oomflight/record/stack_table.hpp"

namespace oomflight::test {

namespace {
std::filesystem::path shared_snapshot_dir() {
  // TORCH_SNAPSHOTS, not an OOMFLIGHT_* name: every OOMFLIGHT_* variable is a setting, and oomflight refuses
  // unknown ones (a test's own variable must not make the jobs it starts refuse to run).
  const char* env = std::getenv("TORCH_SNAPSHOTS");
  return env ? env : OOMFLIGHT_SNAPSHOTS;
}
}  // namespace

std::string cli(const std::string& args) { return fmt::format("{} {}", OOMFLIGHT_CLI, args); }

std::string own_snapshot() {
  const auto path =
      std::filesystem::path(OOMFLIGHT_SOURCE_DIR) / "examples/pytorch/snapshots/h200-transformer-lm-step1.pickle";
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "missing " << path << ": it is committed, is this a whole checkout?";
    throw std::runtime_error("missing fixture");
  }
  return path.string();
}

std::string shared_snapshot(const std::string& name) {
  const auto path = shared_snapshot_dir() / name;
  return std::filesystem::exists(path) ? path.string() : std::string();
}

std::string missing_shared_snapshot(const std::string& name) {
  return fmt::format("needs the third-party PyTorch snapshot {}, which is not at {} (put the shared snapshots in "
                     "../shared/data/torch-snapshots beside the checkout, or name their folder in TORCH_SNAPSHOTS)",
                     name, (shared_snapshot_dir() / name).string());
}

TempDir::TempDir() {
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() / fmt::format("oomflight-test-{}-{:08x}", getpid(), rd());
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

CommandResult run_command(const std::string& command, const std::filesystem::path& cwd) {
  const std::string full = fmt::format("cd '{}' && timeout 300 {} 2>&1", cwd.string(), command);
  CommandResult r;
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe)) r.output += buf.data();
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::vector<std::filesystem::path> files_with_suffix(const std::filesystem::path& dir, const std::string& suffix) {
  std::vector<std::filesystem::path> out;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    if (e.is_regular_file() && name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {
// The events `emit` makes a fresh simulated device emit for `snapshot` at `capacity` bytes.
template <class Emit>
std::vector<SimEvent> emitted(const std::string& snapshot, std::uint64_t capacity, Emit emit) {
  StackTable stacks;
  const auto snap = read_torch_snapshot(snapshot, stacks);
  sim::SimulatedDevice device(snap, capacity);
  CollectingSink sink;
  emit(device, sink);
  return sink.events;
}
}  // namespace

std::vector<SimEvent> expected_replay(const std::string& snapshot, std::uint64_t capacity) {
  return emitted(snapshot, capacity, [](sim::SimulatedDevice& d, CollectingSink& s) { d.replay(s); });
}

std::vector<SimEvent> expected_start_state(const std::string& snapshot, std::uint64_t capacity) {
  return emitted(snapshot, capacity, [](sim::SimulatedDevice& d, CollectingSink& s) { d.emit_start_state(s); });
}

std::string mpirun(int ranks) {
  return fmt::format(
      "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
      "mpirun --oversubscribe -np {}",
      ranks);
}

}  // namespace oomflight::test
