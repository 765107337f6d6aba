// The collective archive writer (internal to liboomflight: it takes an MPI communicator, and no installed header
// may include <mpi.h>).
#pragma once

#include <mpi.h>

#include <span>
#include <string>

#include "oomflight/format/archive_writer.hpp"

namespace oomflight {

/// Writes `path` with parallel HDF5 over MPI-IO, every rank of `comm` together.
///
/// Every rank of `comm` must call this with the same `path` and `header`; ranks_present in the header must be the
/// communicator's ranks in order (row i of /ranks is written by comm rank i). One MPI_Allgather of row counts
/// gives each rank its offsets; each dataset is created once and written with one collective hyperslab write.
/// Every rank takes part in every collective call even after a local failure, and all ranks agree on success
/// before returning (as Darshan's shutdown does), so every rank returns or throws together.
/// With `comm` == MPI_COMM_NULL it is write_archive(): one rank, POSIX I/O, no MPI call.
///
/// `events_in_place`, when given, must be dump.events itself, writable: the writer then turns the stack ids into
/// global ones in place for the write and turns them back before it returns or throws, instead of writing from a
/// fresh 48-byte-per-event copy (at 64 ranks on two cores, that copy's first-touch page faults were a tenth of
/// the dump). Not thread-safe with other readers of those events while it runs.
///
/// Throws ArchiveError naming the file and the step that failed. Call it from one thread.
void write_archive_collective(const std::string& path, const ArchiveHeader& header, const RankDump& dump,
                              MPI_Comm comm, std::span<Event> events_in_place = {});

/// Keeps HDF5 from closing (and flushing) open files in an atexit handler. Parallel HDF5's flush is collective:
/// at the exit of a rank whose dump was left stuck on a stalled peer, that handler would wait for the peer
/// forever and keep the job alive. oomflight closes every file it opens, so nothing is lost. Call it before the
/// process's first HDF5 call (the session's start); later calls do nothing. Thread-safe: call it once.
void keep_hdf5_out_of_process_exit();

}  // namespace oomflight
