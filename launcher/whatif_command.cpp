// `oomflight whatif INPUT --fidelity [--rank R] [--device D]`: PyTorch's caching allocator, modelled
// (oomflight/analysis/allocator_model.hpp), replayed over a recorded trace. Flags and printing only.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.hpp"
#include "isolate.hpp"
#include "output_guard.hpp"
#include "oomflight/analysis/allocator_model.hpp"
#include "oomflight/export/memory_viz.hpp"
#include "oomflight/format/archive_reader.hpp"
#include "oomflight/format/torch_snapshot.hpp"

namespace oomflight::cli {
namespace {

struct WhatifFlags {
  std::string input;
  bool fidelity = false;
  std::vector<int> ranks;
  int device = -1;
};

// One line per device with a trace: "<what> device D: fidelity: A of B allocations at the recorded address, C of D
// segment events as recorded", then the first difference, if any.
void print_fidelity(const std::string& what, const TorchSnapshot& s, int only_device,
                    const MemoryVizNotes* notes = nullptr) {
  const AllocatorSettings settings = allocator_settings_of(s);
  bool any = false;
  for (std::size_t d = 0; d < s.device_traces.size(); ++d) {
    if (s.device_traces[d].empty() || (only_device >= 0 && static_cast<int>(d) != only_device)) continue;
    any = true;
    std::set<std::uint64_t> made_up;
    if (notes != nullptr) {
      for (const auto& [device, address] : notes->made_up_segments) {
        if (device == static_cast<int>(d)) made_up.insert(address);
      }
    }
    const AllocatorFidelity f = replay_fidelity(s, static_cast<int>(d), settings, made_up);
    fmt::print("{} device {}: fidelity: {} of {} allocations at the recorded address, {} of {} segment events as "
               "recorded\n",
               what, d, f.allocations_matched, f.allocations, f.segment_events_matched, f.segment_events);
    if (f.allocations_outside_segments > 0) {
      fmt::print("  {} allocations in no segment the trace or its end state holds: not judged\n",
                 f.allocations_outside_segments);
    }
    if (f.expandable) fmt::print("  its segments are expandable (expandable_segments:True): not modelled yet\n");
    if (!f.first_difference.empty()) fmt::print("  first difference: {}\n", f.first_difference);
  }
  if (!any) {
    fmt::print("{}: no trace{} to replay\n", what,
               only_device >= 0 ? fmt::format(" of device {}", only_device) : std::string());
  }
}

int run(const WhatifFlags& f) {
  if (!f.fidelity) {
    print_error("whatif: only --fidelity is built so far (the table of a configuration against the recorded one, "
                "--alloc-conf and --device-memory, is not: issue 41)");
    return kExitUsage;
  }
  if (!is_hdf5(f.input)) {
    if (!f.ranks.empty()) {
      print_error(fmt::format("--rank: {} is a snapshot pickle, one process's: it has no ranks", f.input));
      return kExitUsage;
    }
    StackTable stacks;
    print_fidelity(f.input, read_torch_snapshot(f.input, stacks), f.device);
    return kExitOk;
  }
  const Archive archive = read_archive(f.input);
  bool any = false;
  for (const RankRow& row : archive.ranks) {
    if (!f.ranks.empty() && std::find(f.ranks.begin(), f.ranks.end(), row.rank) == f.ranks.end()) continue;
    any = true;
    MemoryVizNotes notes;
    const TorchSnapshot s = memory_viz_snapshot(archive, row, &notes);
    print_fidelity(fmt::format("rank {}", row.rank), s, f.device, &notes);
  }
  if (!any) {
    print_error(fmt::format("{} holds none of the ranks asked for", f.input));
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

Command add_whatif(CLI::App& app) {
  auto* sub = app.add_subcommand("whatif", "Replay a trace through a model of PyTorch's caching allocator");
  auto f = std::make_shared<WhatifFlags>();
  sub->add_option("input", f->input, "A torch.cuda.memory._dump_snapshot() pickle, or an archive (.h5)")->required();
  sub->add_flag("--fidelity", f->fidelity,
                "With the settings the snapshot records, count the allocations the model places at the recorded "
                "address and the segment events it makes as recorded, and show the first entry where they part");
  sub->add_option("--rank", f->ranks, "Only these ranks of an archive")->delimiter(',')->check(CLI::NonNegativeNumber);
  sub->add_option("--device", f->device, "Only this device's trace")->check(CLI::NonNegativeNumber);
  return {sub, [f] {
    // Whatever the file holds, whatif ends with its lines or a message, never on a signal (isolate.hpp).
    return run_isolated(f->input, [&] {
      try {
        return run(*f);
      } catch (const std::exception& e) {
        print_error(e.what());
        return kExitFailure;
      }
    });
  }};
}

}  // namespace oomflight::cli
