// Where each rank's rows go in a collective archive, found with O(log P) messages per rank (internal to
// liboomflight: it takes an MPI communicator).
#pragma once

#include <mpi.h>

#include "oomflight/format/collective_writer.hpp"

namespace oomflight {

/// The MPI tag of place_rows()'s messages on the communicator it is given: nothing else may use it there.
inline constexpr int kTagRowPlacement = 0x00F4;

/// Where one rank's rows go: per dataset, the rows of the ranks before it (its offset, in rows; bytes for
/// /string_data) and the rows of every rank (the dataset's size).
struct RowPlacement {
  ArchiveRowCounts before{};
  ArchiveRowCounts total{};
};

/// Collective over `comm`: every rank's `before` is the sum of `mine` over the ranks below it, and `total` the sum
/// over every rank.
///
/// How: an inclusive prefix sum by recursive doubling (Hillis and Steele, 1986): in round k = 0, 1, ... while
/// 2^k < P, rank r sends its running sum (104 bytes) to rank r + 2^k and adds the one it receives from rank r - 2^k;
/// after ceil(log2 P) rounds rank r holds the sum over ranks 0..r. Then, unless `known_total` is given, one
/// MPI_Iallreduce (MPI_SUM) of `mine` for the total. Each rank sends and receives at most ceil(log2 P) + its share of the reduction's messages: 14 rounds
/// at 16,384 ranks. MPI's own collectives for this are not used because of how Open MPI's nonblocking ones are
/// built (libnbc, Open MPI 4.1): MPI_Iexscan is a chain of P steps, each waiting for the previous rank's progress,
/// and MPI_Iallgather of every rank's counts posts P - 1 sends and P - 1 receives on every rank (docs/scale.md).
///
/// Every step is waited for with `wait` (MPI_Wait when empty). Throws CollectiveTimeout naming the step when
/// `wait` gives up or an MPI call fails: the buffers of the messages still pending are then left allocated for MPI
/// to finish into, and `comm` must not be used for this again. Not thread-safe on one communicator.
/// `known_total`: the sum over every rank, when the caller already has it (the dump's votes add it up); the
/// reduction is then skipped.
RowPlacement place_rows(const ArchiveRowCounts& mine, MPI_Comm comm, const CollectiveWait& wait,
                        const std::string& what, const ArchiveRowCounts* known_total = nullptr);

}  // namespace oomflight
