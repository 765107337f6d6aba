// `oomflight whatif INPUT [--fidelity | --alloc-conf CONF] [--device-memory SIZE] [--rank R] [--device D]`:
// PyTorch's caching allocator, modelled (oomflight/analysis/allocator_model.hpp, what_if.hpp), replayed over a
// recorded trace. Flags and printing only.
#include <atomic>
#include <cmath>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "commands.hpp"
#include "isolate.hpp"
#include "output_guard.hpp"
#include "oomflight/analysis/allocator_model.hpp"
#include "oomflight/analysis/what_if.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/export/memory_viz.hpp"
#include "oomflight/export/user_frames.hpp"
#include "oomflight/format/archive_reader.hpp"
#include "oomflight/format/torch_snapshot.hpp"
#include "oomflight/record/context_log.hpp"

namespace oomflight::cli {
namespace {

struct WhatifFlags {
  std::string input;
  bool fidelity = false;
  std::optional<std::string> alloc_conf;
  std::optional<std::string> device_memory;
  std::vector<int> ranks;
  int device = -1;
};

// One line per device with a trace: "<what> device D: fidelity: A of B allocations at the recorded address, C of D
// segment events as recorded", then the first difference, if any.
void print_fidelity(std::string& out, const std::string& what, const TorchSnapshot& s, int only_device,
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
    fmt::format_to(std::back_inserter(out), "{} device {}: fidelity: {} of {} allocations at the recorded address, {} of {} segment events as "
               "recorded\n",
               what, d, f.allocations_matched, f.allocations, f.segment_events_matched, f.segment_events);
    if (f.allocations_outside_segments > 0) {
      fmt::format_to(std::back_inserter(out), "  {} allocations in no segment the trace or its end state holds: not judged\n",
                 f.allocations_outside_segments);
    }
    if (f.expandable) fmt::format_to(std::back_inserter(out), "  its segments are expandable (expandable_segments:True): not modelled yet\n");
    if (!f.first_difference.empty()) fmt::format_to(std::back_inserter(out), "  first difference: {}\n", f.first_difference);
  }
  if (!any) {
    fmt::format_to(std::back_inserter(out), "{}: no trace{} to replay\n", what,
               only_device >= 0 ? fmt::format(" of device {}", only_device) : std::string());
  }
}

// The settings a rank of an archive ran under, for the "as recorded" column, into `s` (whose own are empty: an
// archive's memory_viz_snapshot() carries none): a replayed or imported snapshot's, which its context holds as the
// snapshot gave them (allocator_settings.*), else the job's PYTORCH_CUDA_ALLOC_CONF, which a live job's environment
// records, else none (torch's defaults). Without this a job run with max_split_size_mb would be replayed "as
// recorded" without it. Throws std::invalid_argument naming the variable when the job's setting is not one the model
// replays (garbage_collection_threshold, say): its recorded column would not be what it ran under.
void take_recorded_settings(const Archive& a, int rank, TorchSnapshot& s) {
  if (!s.allocator_settings.empty()) return;
  // torch 2.9 on reads PYTORCH_ALLOC_CONF first, PYTORCH_CUDA_ALLOC_CONF "with lower priority"
  // (c10/core/AllocatorConfig.h).
  std::optional<std::string> generic, cuda;
  for (const ContextRow& c : a.context_of(rank)) {
    const auto kind = static_cast<ContextEntry::Kind>(c.kind);
    const std::string_view key = a.string(c.key);
    if (key.starts_with("allocator_settings.") &&
        (kind == ContextEntry::Kind::environment || kind == ContextEntry::Kind::metadata)) {
      // An imported snapshot's (environment) or a replay's (its metadata).
      s.allocator_settings.emplace_back(key.substr(19), a.string(c.value));
    } else if (kind != ContextEntry::Kind::environment) {
      continue;
    } else if (key == "PYTORCH_ALLOC_CONF") {
      generic = std::string(a.string(c.value));
    } else if (key == "PYTORCH_CUDA_ALLOC_CONF") {
      cuda = std::string(a.string(c.value));
    }
  }
  const std::optional<std::string>& alloc_conf = generic ? generic : cuda;
  if (!s.allocator_settings.empty() || !alloc_conf || alloc_conf->empty()) return;
  try {
    s.allocator_settings = allocator_settings_entries(parse_alloc_conf(*alloc_conf));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format(
        "rank {} ran with {}={}, which the model cannot replay as recorded: {}", rank,
        generic ? "PYTORCH_ALLOC_CONF" : "PYTORCH_CUDA_ALLOC_CONF", *alloc_conf, e.what()));
  }
}

// The innermost frames of a stack, one "function (file:line)" each, for the allocation that fails.
using SiteText = std::function<std::vector<std::string>(std::int32_t stack_id)>;

std::string frame_text(std::string_view function, std::string_view file, std::int32_t line) {
  return line > 0 ? fmt::format("{} ({}:{})", function, file, line) : fmt::format("{} ({})", function, file);
}

std::string verdict(const WhatIfOutcome& o, std::uint64_t capacity) {
  if (capacity == 0) return "no capacity to fit (give --device-memory)";
  if (o.fits) {
    return fmt::format("fits, {} to spare at its peak", format_bytes(capacity - std::min(capacity, o.peak_reserved)));
  }
  return fmt::format("does not fit: entry {}, a request of {} needs {} {} with {} reserved{}", o.failing_entry,
                     format_bytes(o.failing_size), o.failing_pages ? "pages of" : "a new segment of",
                     format_bytes(o.failing_segment),
                     format_bytes(o.reserved_at_failure),
                     o.released_by_retries > 0
                         ? fmt::format(" after the retry path released {} in the replay",
                                       format_bytes(o.released_by_retries))
                         : std::string());
}

// The table of one device: the recorded settings against the configured ones, within one capacity. Returns the
// headroom of the configured replay (capacity - its peak reserved; negative: it does not fit), when it has one.
// A capacity to fit and where it comes from ("--device-memory", "the rank's device capacity", ...).
struct Capacity {
  std::uint64_t bytes = 0;
  std::string source;
};

std::optional<double> print_what_if(std::string& out, const std::string& what, const TorchSnapshot& s, int d,
                                    const std::optional<std::string>& conf, const std::optional<Capacity>& memory,
                                    const SiteText& site) {
  const AllocatorSettings recorded = allocator_settings_of(s);
  const AllocatorSettings configured = conf ? parse_alloc_conf(*conf, recorded) : recorded;
  const std::optional<std::uint64_t> at_oom = capacity_at_oom(s, d);
  const std::uint64_t capacity = memory ? memory->bytes : at_oom.value_or(0);
  const WhatIfOutcome a = replay_what_if(s, d, recorded, capacity);
  // Without --alloc-conf the two columns are one replay.
  const WhatIfOutcome b = conf ? replay_what_if(s, d, configured, capacity) : a;
  fmt::format_to(std::back_inserter(out), "{} device {}: {} against {}, within {}\n", what, d, "the recorded settings",
             conf ? fmt::format("'{}'", *conf) : std::string("the same (no --alloc-conf)"),
             memory ? fmt::format("{} ({})", format_bytes(memory->bytes), memory->source)
             : at_oom ? format_bytes(*at_oom) + " (what the allocator could have had at the recorded OOM: its "
                                                "segments and the device's free bytes)"
                      : std::string("no capacity (no OOM recorded, no --device-memory)"));
  if (configured.expandable_segments) {
    fmt::format_to(std::back_inserter(out),
                   "  expandable segments: modelled from torch 2.11's allocator (one segment of address space per "
                   "stream and pool, mapped by pages of 2 MiB and 20 MiB, free pages unmapped on the retry path); "
                   "not yet measured against a trace recorded with them (docs/allocator-model.md)\n");
  }
  const auto row = [&out](const char* name, const std::string& x, const std::string& y) {
    fmt::format_to(std::back_inserter(out), "  {:<52} {:>14} {:>14}\n", name, x, y);
  };
  row("", "as recorded", "as configured");
  row("allocations replayed", std::to_string(a.allocations), std::to_string(b.allocations));
  row("peak allocated", format_bytes(a.peak_allocated), format_bytes(b.peak_allocated));
  row("peak reserved", format_bytes(a.peak_reserved), format_bytes(b.peak_reserved));
  row("reserved but unallocated at peak allocated", format_bytes(a.unallocated_at_peak),
      format_bytes(b.unallocated_at_peak));
  const char* when_a = a.fits ? "end" : "failure";
  const char* when_b = b.fits ? "end" : "failure";
  row(fmt::format("largest free block, large pool (at {} / {})", when_a, when_b).c_str(),
      format_bytes(a.large.largest_free), format_bytes(b.large.largest_free));
  row(fmt::format("largest free block, small pool (at {} / {})", when_a, when_b).c_str(),
      format_bytes(a.small.largest_free), format_bytes(b.small.largest_free));
  if (b.skipped_requests > 0) {
    fmt::format_to(std::back_inserter(out), "  {} entries asking for more than 16 TiB (a damaged file): not replayed\n",
                   b.skipped_requests);
  }
  fmt::format_to(std::back_inserter(out), "  as recorded: {}\n", verdict(a, capacity));
  fmt::format_to(std::back_inserter(out), "  as configured: {}\n", verdict(b, capacity));
  if (!b.fits) {
    const auto& trace = s.device_traces[static_cast<std::size_t>(d)];
    for (const std::string& frame : site(trace[b.failing_entry].stack_id)) fmt::format_to(std::back_inserter(out), "    {}\n", frame);
  }
  if (capacity == 0) return std::nullopt;
  return static_cast<double>(capacity) - static_cast<double>(b.fits ? b.peak_reserved : b.reserved_at_failure +
                                                                                          b.failing_segment);
}

// Every device with a trace, or `only_device`; the least headroom among them.
std::optional<double> print_what_ifs(std::string& out, const std::string& what, const TorchSnapshot& s, const WhatifFlags& f,
                                     const std::optional<Capacity>& memory, const SiteText& site) {
  std::optional<double> least;
  bool any = false;
  for (std::size_t d = 0; d < s.device_traces.size(); ++d) {
    if (s.device_traces[d].empty() || (f.device >= 0 && static_cast<int>(d) != f.device)) continue;
    any = true;
    const auto h = print_what_if(out, what, s, static_cast<int>(d), f.alloc_conf, memory, site);
    if (h && (!least || *h < *least)) least = h;
  }
  if (!any) fmt::format_to(std::back_inserter(out), "{}: no trace{} to replay\n", what, f.device >= 0 ? fmt::format(" of device {}", f.device) : "");
  return least;
}

int run(const WhatifFlags& f) {
  if (f.fidelity && (f.alloc_conf || f.device_memory)) {
    print_error("whatif: --fidelity replays with the recorded settings; give it without --alloc-conf and "
                "--device-memory");
    return kExitUsage;
  }
  std::optional<Capacity> memory;
  try {
    if (f.device_memory) memory = Capacity{parse_bytes(*f.device_memory), "--device-memory"};
  } catch (const std::exception& e) {
    print_error(fmt::format("--device-memory: {}", e.what()));
    return kExitUsage;
  }
  try {
    if (f.alloc_conf) (void)parse_alloc_conf(*f.alloc_conf);  // a bad option is said before anything is read
  } catch (const std::invalid_argument& e) {
    print_error(fmt::format("--alloc-conf: {}", e.what()));
    return kExitUsage;
  }
  if (!is_hdf5(f.input)) {
    if (!f.ranks.empty()) {
      print_error(fmt::format("--rank: {} is a snapshot pickle, one process's: it has no ranks", f.input));
      return kExitUsage;
    }
    StackTable stacks;
    const TorchSnapshot s = read_torch_snapshot(f.input, stacks);
    std::string out;
    if (f.fidelity) {
      print_fidelity(out, f.input, s, f.device);
      fmt::print("{}", out);
      return kExitOk;
    }
    const StackTableCopy table = stacks.copy();
    const SiteText site = [&](std::int32_t id) {
      std::vector<std::string> out;
      if (id < 0 || static_cast<std::size_t>(id) >= table.stacks.size()) return out;
      const InternedStack& st = table.stacks[static_cast<std::size_t>(id)];
      std::vector<FrameText> frames;
      for (std::uint32_t i = 0; i < st.frame_count; ++i) {
        const InternedFrame& fr = table.frames.at(table.stack_frames.at(st.frame_offset + i));
        frames.push_back(FrameText{table.strings.at(fr.function), table.strings.at(fr.file), fr.line});
      }
      for (std::size_t i : frames_to_show(frames, 3)) {
        out.push_back(frame_text(frames[i].function, frames[i].file, frames[i].line));
      }
      return out;
    };
    (void)print_what_ifs(out, f.input, s, f, memory, site);
    fmt::print("{}", out);
    return kExitOk;
  }
  const Archive archive = read_archive(f.input);
  const SiteText site = [&](std::int32_t id) {
    std::vector<std::string> out;
    for (const FrameRow* fr : frames_to_show(archive, id, 3)) {
      out.push_back(frame_text(archive.string(fr->function), archive.string(fr->file), fr->line));
    }
    return out;
  };
  std::vector<const RankRow*> rows;
  for (const RankRow& row : archive.ranks) {
    if (f.ranks.empty() || std::find(f.ranks.begin(), f.ranks.end(), row.rank) != f.ranks.end()) rows.push_back(&row);
  }
  const bool any = !rows.empty();
  // Each rank's replay is its own (the archive is only read): as many at once as the machine has cores, each into
  // its own text, printed in rank order.
  struct RankOutcome {
    std::string text;
    std::optional<double> headroom;
    std::string error;
  };
  std::vector<RankOutcome> outcomes(rows.size());
  const auto replay_rank = [&](std::size_t i) {
    const RankRow& row = *rows[i];
    RankOutcome& o = outcomes[i];
    try {
      MemoryVizNotes notes;
      TorchSnapshot s = memory_viz_snapshot(archive, row, &notes);
      take_recorded_settings(archive, row.rank, s);
      const std::string what = fmt::format("rank {}", row.rank);
      if (f.fidelity) {
        print_fidelity(o.text, what, s, f.device, &notes);
        return;
      }
      // A rank's own limit where the archive knows it (its cap, else its device's capacity) unless one is given.
      std::optional<Capacity> rank_memory = memory;
      if (!rank_memory) {
        const bool cap = row.memory_cap_bytes != 0 &&
                         (row.device_capacity_bytes == 0 || row.memory_cap_bytes < row.device_capacity_bytes);
        const std::uint64_t limit = cap ? row.memory_cap_bytes : row.device_capacity_bytes;
        if (limit != 0) {
          rank_memory = Capacity{limit, cap ? "the rank's per-process cap" : "the rank's device capacity"};
        }
      }
      o.headroom = print_what_ifs(o.text, what, s, f, rank_memory, site);
    } catch (const std::exception& e) {
      o.error = fmt::format("rank {}: {}", row.rank, e.what());
    }
  };
  std::atomic<std::size_t> next{0};
  const auto worker = [&] {
    for (std::size_t i = next++; i < rows.size(); i = next++) replay_rank(i);
  };
  const std::size_t workers = std::min<std::size_t>(rows.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (std::size_t t = 1; t < workers; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  std::optional<std::pair<double, int>> least;  // headroom, rank
  bool failed = false;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    fmt::print("{}", outcomes[i].text);
    if (!outcomes[i].error.empty()) {
      print_error(outcomes[i].error);
      failed = true;
    }
    const auto& h = outcomes[i].headroom;
    if (h && (!least || *h < least->first)) least = std::pair{*h, rows[i]->rank};
  }
  if (!any) {
    print_error(fmt::format("{} holds none of the ranks asked for", f.input));
    return kExitFailure;
  }
  if (least) {
    fmt::print("least headroom as configured: rank {}, {}{}\n", least->second,
               least->first < 0 ? "short by " : "", format_bytes(static_cast<std::uint64_t>(std::abs(least->first))));
  }
  return failed ? kExitFailure : kExitOk;
}

}  // namespace

Command add_whatif(CLI::App& app) {
  auto* sub = app.add_subcommand("whatif", "Replay a trace through a model of PyTorch's caching allocator");
  auto f = std::make_shared<WhatifFlags>();
  sub->add_option("input", f->input, "A torch.cuda.memory._dump_snapshot() pickle, or an archive (.h5)")->required();
  sub->add_flag("--fidelity", f->fidelity,
                "With the settings the snapshot records, count the allocations the model places at the recorded "
                "address and the segment events it makes as recorded, and show the first entry where they part");
  sub->add_option("--alloc-conf", f->alloc_conf,
                  "Replay also with these PYTORCH_CUDA_ALLOC_CONF options (max_split_size_mb:N, "
                  "roundup_power2_divisions:N) and print both, side by side");
  sub->add_option("--device-memory", f->device_memory,
                  "The capacity to fit (e.g. 80GiB); default: the rank's cap or device capacity in an archive, or "
                  "what the allocator could have had at a recorded OOM");
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
