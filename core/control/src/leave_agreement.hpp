// The leave agreement (internal to the control wing): how ranks end their sessions without losing a dump that
// another rank asks for at the same moment.
//
// A rank whose job ends normally does not stop its watcher at once: it posts an MPI_Ibarrier on a communicator of
// the agreement's own and keeps answering triggers until every rank has posted it (then no rank can ask for a dump
// any more), until a rank says it left without it, or until OOMFLIGHT_DUMP_TIMEOUT. A rank that leaves without
// the agreement (its wait ran out, it failed, it asked for an OOM dump and ends on that error) sends every other
// rank a LEFT message first: a dump asked for afterwards falls back to rank-local files at once instead of waiting
// the whole deadline for a rank that will never vote. Before this, ranks 0, 1 and 3 shutting down within 30 ms of
// rank 2's OOM request left rank 2's history alone in 11 of 20 runs, after 2 x the deadline (issue 19).
#pragma once

#include <mpi.h>

#include <set>

namespace oomflight {

class LeaveAgreement {
 public:
  /// `comm`: the protocol's communicator (LEFT messages travel on it, tag protocol::kTagLeft); `leave_comm`: a
  /// duplicate of it for the barrier alone, owned here (its collective never interleaves with a dump's).
  LeaveAgreement(MPI_Comm comm, MPI_Comm leave_comm, int rank, int world_size);

  /// Posts this rank's part of the barrier (once; later calls do nothing). Watcher thread only.
  void post();

  /// Whether every rank has posted (tests the barrier). Watcher thread only.
  bool everyone_left();

  /// Receives the LEFT messages that arrived; returns whether any rank is newly gone. Watcher thread only (or
  /// any thread once the watcher has stopped).
  bool receive_left_messages();

  /// The ranks that left without the agreement, as their messages said. Same thread rules as above.
  const std::set<int>& gone() const { return gone_; }

  /// Tells every other rank that this one leaves without the agreement (one 4-byte MPI_Isend each, freed). Call
  /// after the watcher stopped, before `comm` is freed. Does nothing when every rank has left together.
  void announce_leaving();

  /// Frees the barrier's communicator unless its barrier is still pending (then it must stay). Once.
  void close();

 private:
  MPI_Comm comm_;
  MPI_Comm leave_comm_;
  int rank_;
  int world_size_;
  bool posted_ = false;
  bool complete_ = false;
  MPI_Request barrier_ = MPI_REQUEST_NULL;
  std::set<int> gone_;
};

}  // namespace oomflight
