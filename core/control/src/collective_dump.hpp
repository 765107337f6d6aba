// The MPI transport's collective write of a dump (internal to the control wing): a frozen history written into one
// archive together with every rank of a communicator. Kept apart from dump_executor.hpp so that the executor, and
// the store transport built on it, compile without <mpi.h> (issue 40).
#pragma once

#include <mpi.h>

#include <string>

#include "dump_executor.hpp"
#include "oomflight/format/collective_writer.hpp"

namespace oomflight {

/// Writes one archive together with every rank of `comm` (see write_archive_collective: `path` counts on how.root
/// only) and returns its path. Names as `executor` does (OOMFLIGHT_OVERWRITE) unless `how` replaces (a joint dump).
/// Throws ArchiveError on every rank together, CollectiveTimeout when how.wait gave up. `state`: this rank's
/// allocator state as its source gave it with its request (nullptr or empty: none).
std::string write_dump_collective(const DumpExecutor& executor, const std::string& path, const ArchiveHeader& header,
                                  const RankRow& row, const FrozenHistory& h, MPI_Comm comm,
                                  const CollectiveArchive& how, const AllocatorStateRows* state = nullptr);

/// The rows this rank's history adds to an archive (what write_dump_collective() writes), for the votes.
ArchiveRowCounts dump_row_counts(const FrozenHistory& h, const AllocatorStateRows* state);

}  // namespace oomflight
