// Writes an archive (schema v1) from one process, with POSIX I/O: a rank-local file, the archive of a job of one
// rank, or an archive assembled later from several ranks' rows. The collective writer that all ranks of a job
// call together lives inside liboomflight (it needs MPI); both share one implementation.
#pragma once

#include <span>
#include <string>

#include "oomflight/api.h"
#include "oomflight/format/archive_schema.hpp"
#include "oomflight/record/stack_table.hpp"

namespace oomflight {

/// One rank's share of an archive. Stack ids inside `events` are the rank's own (ids into `stacks`, as its
/// recorder gave them); the writer turns them into global ids.
struct RankDump {
  RankRow row;                          ///< offsets and counts are filled in by the writer
  std::span<const Event> events;        ///< oldest first
  const StackTableCopy* stacks = nullptr;  ///< required
};

/// Writes `path` (created, or truncated if it exists) holding one rank: `header` as the root attributes,
/// `dump` as the rows. Throws std::invalid_argument when dump.stacks is null, ArchiveError naming the file and
/// the step that failed (folder missing or not writable, disk full). Not thread-safe with other HDF5 use in the
/// process (Debian's parallel HDF5 is not built thread-safe): call it from one thread.
OOMFLIGHT_API void write_archive(const std::string& path, const ArchiveHeader& header, const RankDump& dump);

}  // namespace oomflight
