// Writes an archive (schema v1): collectively with parallel HDF5 over MPI-IO, or by one rank alone.
#pragma once

#include <mpi.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "oomflight/archive_format.hpp"
#include "oomflight/export.hpp"

namespace oomflight {

/// Thrown when an archive cannot be written or read; the message names the file and what failed.
struct ArchiveError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One rank's share of an archive. Ids inside `events` and `stacks` are the rank's own (as the recorder
/// gave them); the writer turns them into global ids.
struct RankDump {
  RankRow row;                       ///< offsets and counts are filled in by the writer
  const std::vector<Event>* events = nullptr;
  const StackTableCopy* stacks = nullptr;
};

/// Writes `path` (created, or truncated if it exists).
///
/// With `comm` a communicator, every rank of it must call this with the same `path` and `header`; ranks_present
/// in the header must be the communicator's ranks in order (row i of /ranks is written by comm rank i). The
/// file is written with collective MPI-IO transfers, one collective write per dataset; every rank takes part in
/// every collective call even after a local failure, and all ranks agree on success before returning (as
/// Darshan's shutdown does), so every rank returns or throws together.
/// With `comm` == MPI_COMM_NULL the rank writes the file alone (POSIX I/O, no MPI call).
///
/// Throws ArchiveError naming the file and the step that failed. Not thread-safe with other HDF5 use in the
/// process unless HDF5 was built thread-safe (Debian's parallel build is not): call it from one thread.
OOMFLIGHT_API void write_archive(const std::string& path, const ArchiveHeader& header, const RankDump& dump,
                                 MPI_Comm comm);

}  // namespace oomflight
