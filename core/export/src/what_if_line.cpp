// The post-mortem's what-if line (what_if_line.hpp).
#include "oomflight/export/what_if_line.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "oomflight/analysis/what_if.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/export/memory_viz.hpp"

namespace oomflight {

std::string expandable_what_if_text(const Archive& archive, const RankSummary& origin) {
  if (origin.limit_bytes == 0) return "";
  try {
    MemoryVizNotes notes;
    const TorchSnapshot s = memory_viz_snapshot(archive, origin.row, &notes);
    // Only a history the model can replay truthfully: the allocator's own segments (none made up for blocks whose
    // segment the history lacks) and the failed request itself (its oom entry: without it, "fits" would be said of
    // the history before the failure).
    if (!notes.made_up_segments.empty() || s.device_traces.empty()) return "";
    const int device = origin.row.device >= 0 && static_cast<std::size_t>(origin.row.device) < s.device_traces.size()
                           ? origin.row.device
                           : 0;
    const auto& trace = s.device_traces[static_cast<std::size_t>(device)];
    if (std::none_of(trace.begin(), trace.end(), [](const TraceEntry& e) { return e.action == Action::oom; })) {
      return "";
    }
    AllocatorSettings settings = allocator_settings_of(s);
    if (settings.expandable_segments) {
      return "the job ran with expandable_segments:True already (the allocator settings it recorded say so): setting "
             "it is no remedy here";
    }
    settings.expandable_segments = true;
    const WhatIfOutcome o = replay_what_if(s, device, settings, origin.limit_bytes);
    const std::string head = fmt::format(
        "with expandable_segments:True (the allocator model's replay of this history within the {}; not yet "
        "measured against a trace recorded with them):",
        origin.limit_is_cap ? "per-process cap" : "device's capacity");
    if (o.fits) {
      return fmt::format("{} it fits, {} to spare at its peak", head,
                         format_bytes(origin.limit_bytes - std::min(origin.limit_bytes, o.peak_reserved)));
    }
    const std::uint64_t wanted = o.reserved_at_failure + o.failing_segment;
    return fmt::format("{} still short by {} when {} is asked for (entry {} of the trace)", head,
                       format_bytes(wanted > origin.limit_bytes ? wanted - origin.limit_bytes : 0),
                       format_bytes(o.failing_size), o.failing_entry);
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace oomflight
