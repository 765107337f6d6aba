// One rank's part of a snapshot window (snapshot_dump.hpp).
#include "snapshot_dump.hpp"

#include <fmt/format.h>

#include "snapshot_events.hpp"

namespace oomflight {

RankDump WindowDump::view(const FrozenHistory& h) const {
  return RankDump{.row = row, .events = events, .stacks = &h.stacks, .batches = h.batches.rows, .context = h.context,
                  .state_segments = {}, .state_blocks = {}, .collectives = collectives,
                  .communicators = h.communicators};
}

WindowDump window_dump(const DumpExecutor& executor, const FrozenHistory& h, const SnapshotWindow& window, int rank) {
  WindowDump d;
  d.header = executor.header(DumpKind::snapshot, window.first,
                             fmt::format("snapshot of batches {} to {}", window.first, window.last), {}, {rank});
  d.header.window_first_batch = window.first;
  d.header.window_last_batch = window.last;
  DumpRequest request;
  request.kind = DumpKind::snapshot;
  d.row = executor.rank_row(h, false, request);
  d.events = snapshot_events(h.ring.events, window.first, window.last);
  d.collectives = snapshot_collectives(h.collectives.records, window.first, window.last);
  return d;
}

}  // namespace oomflight
