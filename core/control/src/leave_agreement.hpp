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
//
// A rank that cannot say it leaves (os._exit, SIGKILL, a segfault) is gone too once its process has ended: on its
// node, the agreement watches the other ranks' processes (peer_processes.hpp) and counts a rank whose process ended
// without a LEFT message as gone ("vanished"), so that nothing waits for it until the deadline (issue 29).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <set>

#include "peer_processes.hpp"

namespace oomflight {

class LeaveAgreement {
 public:
  /// How a rank leaves without the agreement, as its LEFT message says (the message's one int32).
  enum class Leaving : std::int32_t {
    on_error = 1,  ///< its process ends on an error (a non-zero status, an uncaught exception, a signal, its OOM):
                   ///< it never finalises MPI
    normally = 2,  ///< it ended normally, but its wait for the others ran out: it finalises MPI as usual
  };

  /// `comm`: the protocol's communicator (LEFT messages travel on it, tag protocol::kTagLeft); `leave_comm`: a
  /// duplicate of it for the barrier alone, owned here (its collective never interleaves with a dump's).
  /// `node_peers`: the processes of this node's other ranks (may be empty).
  LeaveAgreement(MPI_Comm comm, MPI_Comm leave_comm, int rank, int world_size,
                 std::unique_ptr<PeerProcesses> node_peers = nullptr);

  /// Posts this rank's part of the barrier (once; later calls do nothing). Watcher thread only.
  void post();

  /// Whether every rank has posted (tests the barrier). Watcher thread only.
  bool everyone_left();

  /// Receives the LEFT messages that arrived and looks at this node's peer processes; returns whether any rank is
  /// newly gone. Watcher thread only (or any thread once the watcher has stopped).
  bool receive_left_messages();

  /// The ranks that left without the agreement: by their LEFT message, or (on this node) because their process
  /// ended without one. Same thread rules as above.
  const std::set<int>& gone() const { return gone_; }

  /// The ranks of gone() whose process ended without a LEFT message (os._exit, a signal): on this node only.
  const std::set<int>& vanished() const { return vanished_; }

  /// Whether a rank of vanished() is known, after the node's processes are looked at again (no MPI call: it may
  /// run while another thread is inside MPI_Finalize). A rank whose LEFT message was never received (the watcher
  /// had stopped) counts as vanished too; once every rank has left together, a process that ends is one that
  /// finalised and exited, and counts for nothing. Same thread rules as above.
  bool peer_process_ended();

  /// Closes the watch of the node's processes (their pidfds); peer_process_ended() then says what it knew.
  void stop_watching_processes() { node_peers_.reset(); }

  /// Whether a rank said it leaves on an error. Same thread rules as above.
  bool any_left_on_error() const { return left_on_error_; }

  /// Tells every other rank (not gone) that this one leaves without the agreement, and how: one 4-byte MPI_Isend
  /// each, waited for up to 250 ms in all (a rank whose process is about to end must not leave its message behind
  /// in its own send queue, or nobody hears it). Call after the watcher stopped (or from it), before `comm` is
  /// freed. Does nothing when every rank has left together, and only once.
  void announce_leaving(Leaving how);

  /// Frees the barrier's communicator unless its barrier is still pending (then it must stay). Once.
  void close();

 private:
  MPI_Comm comm_;
  MPI_Comm leave_comm_;
  int rank_;
  int world_size_;
  bool posted_ = false;
  bool complete_ = false;
  bool announced_ = false;
  bool left_on_error_ = false;
  MPI_Request barrier_ = MPI_REQUEST_NULL;
  std::set<int> gone_;
  std::set<int> vanished_;
  std::unique_ptr<PeerProcesses> node_peers_;
};

}  // namespace oomflight
