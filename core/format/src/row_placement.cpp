// place_rows(): each rank's offset in every dataset of a collective archive by recursive doubling, and the
// datasets' sizes by one reduction when the caller does not know them (row_placement.hpp says why not MPI's own scan
// or allgather).
#include "oomflight/format/row_placement.hpp"

#include <fmt/format.h>

#include <memory>

namespace oomflight {
namespace {

// What MPI reads and writes. A round given up on may still complete later (a stalled rank resumes): its buffers
// must then still be there, so they live on the heap and are leaked on a timeout.
struct Buffers {
  ArchiveRowCounts mine{};
  ArchiveRowCounts running{};  // the sum over ranks [r - 2^k + 1, r] after round k - 1
  ArchiveRowCounts outgoing{};
  ArchiveRowCounts incoming{};
  ArchiveRowCounts total{};
};

}  // namespace

RowPlacement place_rows(const ArchiveRowCounts& mine, MPI_Comm comm, const CollectiveWait& wait,
                        const std::string& what, const ArchiveRowCounts* known_total) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  auto b = std::make_unique<Buffers>();
  b->mine = mine;
  b->running = mine;
  auto complete = [&](int started, MPI_Request& request, const std::string& step) {
    if (started != MPI_SUCCESS) {
      b.release();  // NOLINT: MPI may still write into the buffers of the other pending messages
      throw CollectiveTimeout(fmt::format("writing {}: MPI error {} at the {}", what, started, step));
    }
    const bool done = wait ? wait(request) : MPI_Wait(&request, MPI_STATUS_IGNORE) == MPI_SUCCESS;
    if (done) return;
    b.release();  // NOLINT: deliberately leaked, MPI may still write into it
    throw CollectiveTimeout(fmt::format("writing {}: not every rank reached the {} in time", what, step));
  };
  constexpr int kCount = static_cast<int>(kArchiveTables);
  for (int k = 0, step = 1; step < size; ++k, step *= 2) {
    const std::string name = fmt::format("row offsets (round {})", k + 1);
    MPI_Request receive = MPI_REQUEST_NULL, send = MPI_REQUEST_NULL;
    const bool from_below = rank - step >= 0, to_above = rank + step < size;
    if (from_below) {
      const int started = MPI_Irecv(b->incoming.data(), kCount, MPI_UINT64_T, rank - step, kTagRowPlacement, comm,
                                    &receive);
      if (started != MPI_SUCCESS) complete(started, receive, name);
    }
    if (to_above) {
      b->outgoing = b->running;  // what it held before this round's addition
      const int started = MPI_Isend(b->outgoing.data(), kCount, MPI_UINT64_T, rank + step, kTagRowPlacement, comm,
                                    &send);
      if (started != MPI_SUCCESS) complete(started, send, name);
    }
    if (from_below) {
      complete(MPI_SUCCESS, receive, name);
      for (std::size_t t = 0; t < kArchiveTables; ++t) b->running[t] += b->incoming[t];
    }
    if (to_above) complete(MPI_SUCCESS, send, name);
  }
  if (known_total != nullptr) {
    b->total = *known_total;
  } else {
    MPI_Request request = MPI_REQUEST_NULL;
    complete(MPI_Iallreduce(b->mine.data(), b->total.data(), kCount, MPI_UINT64_T, MPI_SUM, comm, &request),
             request, "row counts' sum");
  }
  RowPlacement placement;
  for (std::size_t t = 0; t < kArchiveTables; ++t) placement.before[t] = b->running[t] - b->mine[t];
  placement.total = b->total;
  return placement;
}

}  // namespace oomflight
