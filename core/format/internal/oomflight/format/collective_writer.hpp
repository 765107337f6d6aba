// The collective archive writer (internal to liboomflight: it takes an MPI communicator, and no installed header
// may include <mpi.h>).
#pragma once

#include <mpi.h>

#include <functional>
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
/// give up on it (a deadline passed). The default, an empty function, waits with MPI_Wait.
using CollectiveWait = std::function<bool(MPI_Request& request)>;

/// Writes `path` with every rank of `comm` together: one HDF5 file holding every rank's rows.
///
/// Four non-blocking collectives, each waited for with `wait`: an MPI_Iallgather of row counts (every rank's
/// offsets follow), an MPI_Ibcast of the file's layout from comm rank 0, which created `path`.partial with HDF5
/// alone (attributes, every dataset at its total size, space allocated, in about a millisecond), an
/// MPI_Iallreduce of success once every rank has pwrite()n its own rows at their addresses and fsync()ed, and an
/// MPI_Ibcast from rank 0 that it marked the file complete, checked it and renamed it to `path`.
/// Every rank takes part in every step even after a local failure, so all ranks return or throw together
/// (Darshan's discipline); ranks_present in `header` must be the communicator's ranks in order (row i of /ranks is
/// comm rank i). No MPI-IO: docs/protocol.md, "One write, laid out once", says why.
/// With `comm` == MPI_COMM_NULL it is write_archive(): one rank, no MPI call.
///
/// Throws ArchiveError naming the file and the step that failed (on every rank alike), CollectiveTimeout when
/// `wait` gave up (then rank 0 removes the partial file unless it already renamed it). The buffers of a collective
/// given up on are left allocated for MPI to finish into. Call it from one thread; not thread-safe with other HDF5
/// use in the process.
void write_archive_collective(const std::string& path, const ArchiveHeader& header, const RankDump& dump,
                              MPI_Comm comm, const CollectiveWait& wait = {});

/// Keeps HDF5 from closing (and flushing) open files in an atexit handler: at the exit of a rank whose dump was
/// left behind, that handler would touch files the dump still holds. oomflight closes every file it opens, so
/// nothing is lost. Call it before the process's first HDF5 call (the session's start); later calls do nothing.
/// Thread-safe: call it once.
void keep_hdf5_out_of_process_exit();

}  // namespace oomflight
