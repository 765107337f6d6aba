// What a Session asks of whatever coordinates its rank's dumps with the job's other ranks (docs/protocol.md, "One
// coordinator, two transports"): the MPI transport (trigger_protocol.hpp: a watcher on a duplicated communicator,
// votes and a collective write) or the job's c10d store (store_protocol.hpp: keys, rank-local files and a merge).
// Both are one Coordinator (coordinator.hpp: the watcher's loop and the state its rules are about) over their own
// mechanics, and run a dump's steps with DumpRun (dump_run.hpp). A Session holds at most one at a time and never asks
// which: what one transport cannot do, the interface asks as a capability (leaves_with_the_job), and the rules both
// keep are written once in the pieces they share (dump_ledger, dump_requests, signal_turn, dump_role, leave_rule,
// agreed_settings, dump_words, dump_outcome, dump_signal, peer_processes, dump_executor, snapshot_dump).
//
// Thread-safety: request(), why_alone(), agreeing() and await_agreement() may be called from any thread at any time
// before end(); the rest from the session's thread, under its batch lock where the Session says so.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "oomflight/control/dump_request.hpp"
#include "oomflight/control/snapshot_schedule.hpp"
#include "oomflight/record/recorder.hpp"

namespace oomflight {

class DumpCoordinator {
 public:
  virtual ~DumpCoordinator() = default;

  /// A dump this rank asks for: freezes its history, makes every rank dump, and returns once the archive has its
  /// name, this rank's rank-local file is the result, or 3 x OOMFLIGHT_DUMP_TIMEOUT has passed. A request while a dump
  /// is under way joins it (or, when its failure came after this rank's freeze for it, the joint dump that follows).
  /// nullopt when this rank's dumps are not coordinated (why_alone() says why): the caller writes its history alone.
  /// Never throws.
  virtual std::optional<DumpResult> request(const DumpRequest& request) = 0;

  /// Why this rank's dumps are its own and not every rank's, in the words a file's reason and its log line use
  /// ("the job's ranks did not agree at start to coordinate their dumps", ...). Never throws.
  virtual std::string why_alone() = 0;

  /// A snapshot window closed on this rank: `freeze` freezes its history (into the storage given, or a new one).
  /// Hands the window to the coordination of every rank's and returns without waiting for another rank; false when
  /// this rank's snapshots are not coordinated (the caller writes it alone). Called under the session's batch lock.
  virtual bool take_snapshot(const SnapshotWindow& window,
                             const std::function<FrozenHistory(std::vector<Event>)>& freeze) = 0;

  /// Whether this rank's dumps are coordinated with the other ranks' now (MPI: always; the store: once the ranks
  /// agreed to). Where not, and no agreement is to come, what the watcher would have dumped (a headroom crossing) is
  /// the session's to write alone.
  virtual bool coordinates() = 0;

  /// Whether the ranks' start-up agreement is still to come (a dump or a snapshot waits for it: issue 40).
  virtual bool agreeing() = 0;

  /// Waits for the start-up agreement within its bound, and returns whether the ranks agreed. Never call it holding
  /// the session's batch lock.
  virtual bool await_agreement() = 0;

  /// Ends this rank's part. `normal`: the job ends normally here (snapshots still queued are written, and the rank
  /// leaves together with the others, answering their dumps meanwhile; each bounded by OOMFLIGHT_DUMP_TIMEOUT);
  /// else it waits for nobody, and `error` says the process ends on an error. Idempotent: a later call only
  /// confirms. Returns false when the watcher was stuck in a dump and left behind (this object, and what it refers
  /// to, must then outlive it).
  virtual bool end(bool normal, bool error) = 0;

  /// Whether the job can let go of this transport while the session goes on (the job's store, at
  /// destroy_process_group; never MPI's communicator).
  virtual bool leaves_with_the_job() const = 0;

  /// The job lets go of the transport (leaves_with_the_job): this rank leaves at once, without waiting for anyone,
  /// and the others learn it. Idempotent.
  virtual void leave(const std::string& why) = 0;

  /// After leave(): waits at most `bound` for a watcher still inside a call to the transport.
  virtual void finish_leaving(std::chrono::milliseconds bound) = 0;

  /// Whether the watcher has ended and was joined: only then may this object be destroyed.
  virtual bool watcher_joined() = 0;

  /// After end(): whether a rank is known to end without finalising its transport (MPI_Finalize might then wait
  /// for it for good). No call to the transport.
  virtual bool peer_never_finalises() = 0;

  /// After end(): closes the watch of this node's peer processes, for a process that starts a new session.
  virtual void stop_watching_peers() = 0;
};

}  // namespace oomflight
