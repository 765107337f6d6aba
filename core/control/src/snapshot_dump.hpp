// One rank's part of a snapshot window, ready to write: the header of a snapshot archive of that window, the rank's
// row, and its events and collective records in the window (snapshot_events.hpp). What a snapshot of one process,
// of a rank alone, and of a rank joined through the job's store write alike (the MPI transport's snapshot writer
// writes the same parts collectively).
#pragma once

#include <string>
#include <vector>

#include "dump_executor.hpp"
#include "oomflight/control/snapshot_schedule.hpp"
#include "oomflight/format/archive_writer.hpp"

namespace oomflight {

struct WindowDump {
  ArchiveHeader header;  ///< kind snapshot, batch window.first, the window's first and last batch, this rank
  RankRow row;           ///< this rank, not an origin
  std::vector<Event> events;
  std::vector<Collective> collectives;

  /// The writer's view of it and of `h` (the frozen history it was made from): both must outlive the view.
  RankDump view(const FrozenHistory& h) const;
};

/// The window's part of `h` (frozen at the window's end) for `rank`, with the executor's header (run name, job id,
/// world size). Throws std::bad_alloc only.
WindowDump window_dump(const DumpExecutor& executor, const FrozenHistory& h, const SnapshotWindow& window, int rank);

}  // namespace oomflight
