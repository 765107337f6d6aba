// `oomflight import PICKLE... -o ARCHIVE [--ranks ...]`: PyTorch snapshots written by other tools become one
// archive with the same report and exports.
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "archive_summary.hpp"
#include "commands.hpp"
#include "isolate.hpp"
#include "output_guard.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/format/snapshot_import.hpp"

namespace oomflight::cli {

Command add_import(CLI::App& app) {
  auto* sub = app.add_subcommand("import", "Turn per-rank PyTorch memory snapshots (pickles) into one archive");
  struct Options {
    std::vector<std::string> inputs;
    std::string output;
    std::vector<int> ranks;
    ImportOptions import;
    std::string device_memory;
    bool force = false;
  };
  auto o = std::make_shared<Options>();
  sub->add_option("snapshots", o->inputs, "torch.cuda.memory._dump_snapshot() pickles, one per rank")->required();
  sub->add_option("-o,--output", o->output, "The archive to write")->required();
  sub->add_option("--ranks", o->ranks, "The rank of each snapshot, in order (default: 0, 1, 2, ...)")
      ->delimiter(',')
      ->check(CLI::Range(0, kMaxRank));
  sub->add_option("--run-name", o->import.run_name, "The run's name (default: the first snapshot's file name)");
  sub->add_option("--world-size", o->import.world_size, "The job's world size (default: the largest rank + 1)")
      ->check(CLI::Range(1, kMaxRank + 1));
  sub->add_flag("--force", o->force, "Replace the output archive if it exists");
  sub->add_option("--device-memory", o->device_memory, "Every rank's device capacity, e.g. 80GiB (default: unknown)");
  return {sub, [o] {
    if (const std::string why = refuse_output(o->output, o->inputs, o->force, "archive"); !why.empty()) {
      print_error(why);
      return kExitUsage;
    }
    for (const std::string& input : o->inputs) {
      if (const std::string what = not_a_pickle(input); !what.empty()) {
        print_error(what);
        return kExitUsage;
      }
    }
    if (!o->ranks.empty() && o->ranks.size() != o->inputs.size()) {
      print_error(fmt::format("--ranks names {} ranks for {} snapshots", o->ranks.size(), o->inputs.size()));
      return kExitUsage;
    }
    if (!o->device_memory.empty()) {
      try {
        o->import.device_capacity_bytes = parse_bytes(o->device_memory);
      } catch (const std::exception& e) {
        print_error(fmt::format("--device-memory: {}", e.what()));
        return kExitUsage;
      }
    }
    std::vector<SnapshotInput> inputs;
    for (std::size_t i = 0; i < o->inputs.size(); ++i) {
      inputs.push_back({o->inputs[i], o->ranks.empty() ? static_cast<int>(i) : o->ranks[i]});
    }
    // The pickles are untrusted: the strict reader never runs their code, and the child process turns a crash
    // anywhere into a message (isolate.hpp).
    return run_isolated(fmt::format("import into {}", o->output), [&] {
      try {
        std::vector<std::string> notes;
        const ArchiveHeader h = import_torch_snapshots(inputs, o->output, o->import, &notes);
        for (const auto& note : notes) fmt::print(stderr, "oomflight import: note: {}\n", note);
        print_archive_summary(o->output, h);
        return kExitOk;
      } catch (const std::exception& e) {
        print_error(e.what());
        return kExitFailure;
      }
    });
  }};
}

}  // namespace oomflight::cli
