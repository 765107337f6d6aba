// The collective archive writer (internal to liboomflight: it takes an MPI communicator, and no installed header
// may include <mpi.h>).
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "oomflight/format/archive_writer.hpp"

namespace oomflight {

/// Thrown by write_archive_collective() when a step between the ranks did not complete: `wait` gave up on it.
/// The communicator then has a collective pending on it for good: use it no more, and do not free it.
class CollectiveTimeout : public ArchiveError {
 public:
  using ArchiveError::ArchiveError;
};

/// How the writer waits for one of its non-blocking collectives: returns true once `request` completed, false to
/// give up on it (a deadline passed). An empty function waits with MPI_Wait.
using CollectiveWait = std::function<bool(MPI_Request& request)>;

/// How many rows of each dataset one rank adds to an archive (/ranks, /events, ... in the order of
/// docs/archive-format.md; bytes for /string_data). Exchanged by the ranks so that each knows where its rows go.
inline constexpr std::size_t kArchiveTables = 13;
using ArchiveRowCounts = std::array<std::uint64_t, kArchiveTables>;

/// `dump`'s row counts. Throws std::invalid_argument when dump.stacks is null.
ArchiveRowCounts archive_row_counts(const RankDump& dump);

/// How the ranks write one archive together.
struct CollectiveArchive {
  /// The rank (of the communicator) that names the file, lays it out and renames it.
  int root = 0;
  CollectiveWait wait;
  /// Called at the end of each step with its name ("counts", "layout", "rows and sync", "agreement", "verify and
  /// rename", "rename heard"), on every rank; empty: not called. For the dump's timeline (docs/scale.md).
  std::function<void(const char* step)> step_done;
  /// Stripes the root asks the file system for (archive_stripes(): > 0 that many, 0 the folder's own layout,
  /// < 0 one per GiB of archive when that is 2 or more). Lustre only heeds it, through the MPI library's driver.
  int stripes = 0;
  /// Every rank's archive_row_counts() added up, when the caller already has it (the dump's votes); empty: added
  /// up here with one more reduction.
  std::optional<ArchiveRowCounts> row_totals;
  /// What the root's rename does when `path` is taken (write_archive's Naming): the final path is broadcast with
  /// the rename's outcome, and returned on every rank.
  Naming naming = Naming::keep_others;
};

/// Writes one HDF5 archive holding the rows of every rank of `comm`, all ranks together, and returns its path.
///
/// `path` counts on the root only (the others learn it from the root): an empty one means that the root could not
/// name the file, and every rank throws. Steps, each waited for with `how.wait`: where this rank's rows go
/// (place_rows(): O(log P) messages per rank), then the root creates `path`.partial with HDF5 alone (attributes,
/// every dataset at its total size, contiguous, space allocated: about a millisecond) and broadcasts the path and
/// each dataset's address (MPI_Ibcast), then every rank pwrite()s its own rows at their addresses and fsync()s,
/// an MPI_Iallreduce agrees on success, and the root marks the file complete (the last write), fsyncs it,
/// checks it and renames it to `path` (or the next free name, `how.naming`), and broadcasts the name it got. Every rank takes part in every step even
/// after a local failure of its rows (any exception there is its "no" in the agreement), so all ranks return or
/// throw ArchiveError together (Darshan's discipline); what can leave one rank alone is CollectiveTimeout (a
/// failed MPI call counts as one) and std::invalid_argument for a caller's mistake. ranks_present in `header`
/// must be the communicator's ranks in order (row i of /ranks is comm rank i). No MPI-IO: docs/protocol.md,
/// "One write, laid out once", says why. With `comm` == MPI_COMM_NULL it is write_archive(): no MPI call.
///
/// Throws ArchiveError naming the file and the step that failed (on every rank alike), CollectiveTimeout when
/// `how.wait` gave up (the root then removes the partial file unless it already renamed it). The buffers of a
/// collective given up on stay allocated for MPI to finish into. Call it from one thread; not thread-safe with
/// other HDF5 use in the process.
std::string write_archive_collective(const std::string& path, const ArchiveHeader& header, const RankDump& dump,
                                     MPI_Comm comm, const CollectiveArchive& how = {});

/// Keeps HDF5 from closing (and flushing) open files in an atexit handler: at the exit of a rank whose dump was
/// left behind, that handler would touch files the dump still holds. oomflight closes every file it opens, so
/// nothing is lost. Call it before the process's first HDF5 call (the session's start); later calls do nothing.
/// Thread-safe: call it once.
void keep_hdf5_out_of_process_exit();

}  // namespace oomflight
