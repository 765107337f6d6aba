// The policy of a rank's coordinated dumps, written once over a transport (internal to the control wing;
// docs/protocol.md, "One coordinator, two transports"). Issue 40: the MPI transport (trigger_protocol.*) and the job's
// c10d store (store_protocol.*) each had their own watcher loop, with the same rules in their own lines: the signals'
// turn, a rank's own request first, a SIGTERM that ends the process once what it queued is written, a request whose
// other ranks were told already run even while stopping. The Coordinator holds the state those rules are about (the
// ledger, the requests, the dump's steps, the watcher and its doorbell) and runs the loop; a transport derives from
// it and supplies its mechanics through the hooks below, as NCCL's socket and IB transports implement one ncclNet_t:
//
//   signal_flags     what the transport lets the signals' turn do now (its handlers, its agreement)
//   run_own_dump     this rank's request that is due (MPI first takes the triggers heard so far): enter_dump
//   look_for_dump    another rank's dump: MPI's trigger messages, the store's paced look at dN/cause (and its
//                    agreement and snapshot merges, which its look carries)
//   between_dumps    what the transport does between dumps (MPI: its snapshots' collective writes, the leave
//                    agreement's messages)
//   tell_left_on_signal  the others learn that this rank ends on SIGTERM (MPI's LEFT message, the store's left/R)
//   runs_asked_dump_after_stop  a capability: whether a request whose other ranks were told is still run once the
//                    session stops (MPI: yes, the others wait for it in the vote; the store: no, its stop lets go of
//                    the store, and the others' merge does without this rank)
//   tell_others      between this rank's freeze and DumpRun: the others hear of its dump where they have not yet
//                    (MPI's triggers; the store's cause or its trigger count, and the first origin's cause read back)
//   dump_ended       what the transport kept for the dump that just ended goes (MPI: the triggers it heard)
//
// Both transports enter a dump through enter_dump (from run_own_dump and look_for_dump): the same order of steps
// (the request that is due first, the joint dump's rejoining origins from the ledger, the freeze, the role, the
// others told, DumpRun, the end), so that the two cannot drift again. A dump's steps after the freeze are DumpRun's
// (dump_run.hpp), over the transport's DumpAssembly; what a request does is DumpRequests' (dump_requests.hpp); the
// rules on a rank's dumps are DumpLedger's (dump_ledger.hpp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "dump_coordinator.hpp"
#include "dump_executor.hpp"
#include "dump_ledger.hpp"
#include "dump_requests.hpp"
#include "dump_role.hpp"
#include "dump_run.hpp"
#include "dump_signal.hpp"
#include "headroom_watch.hpp"
#include "leave_rule.hpp"
#include "oomflight/control/config.hpp"
#include "oomflight/control/rank_identity.hpp"
#include "oomflight/control/watcher_doorbell.hpp"
#include "oomflight/record/recorder.hpp"

namespace oomflight {

class Coordinator : public DumpCoordinator, protected DumpRequests::Transport, protected DumpAssembly {
 public:
  /// Whether the watcher ended and was joined (join_watcher): only then may this object be destroyed. Takes mutex_.
  bool watcher_joined() override;

 protected:
  /// All references must outlive the coordinator; `headroom` (may be null) too: its crossings are this watcher's to
  /// dump (the signals' turn).
  Coordinator(const Config& config, const RankIdentity& identity, Recorder& recorder, const DumpExecutor& executor,
              HeadroomWatch* headroom);

  /// Starts the watcher thread (the loop below): the derived transport's constructor calls it last.
  void start_watcher();

  /// What the signals' turn may do now (take_signals' arguments). Called under mutex_.
  struct SignalFlags {
    bool usr1 = false;          // oomflight's SIGUSR1 handler is installed, and the transport acts on it now
    bool term = false;          // ... and its SIGTERM handler
    bool leaving = false;       // this rank is leaving at its normal end, or left
    bool dump_on_exit = false;  // OOMFLIGHT_DUMP_ON_EXIT
    bool coordinated = false;   // the ranks agreed to coordinate their dumps
    bool headroom = false;      // a headroom crossing may be dumped now
  };
  virtual SignalFlags signal_flags() = 0;
  /// Runs this rank's own request when it is due (DumpRequests::due); returns whether it ran a dump. Watcher only,
  /// without mutex_.
  virtual bool run_own_dump() = 0;
  /// Looks for another rank's dump (`rings`: what woke the watcher) and runs this rank's part of it. Watcher only,
  /// without mutex_.
  virtual void look_for_dump(const WatcherDoorbell::Rings& rings) = 0;
  /// Between dumps, each turn. Watcher only, without mutex_.
  virtual void between_dumps() {}
  /// SIGTERM ends the process: the other ranks learn now that this one left on an error, so that no dump waits
  /// for it. Watcher only, without mutex_.
  virtual void tell_left_on_signal() = 0;
  /// Whether a request whose other ranks were told (DumpRequests::due_and_asked) is run after stop_ (MPI's others
  /// wait for this rank's vote; the store's stop lets go of the store, and the others merge without this rank).
  virtual bool runs_asked_dump_after_stop() const = 0;
  /// The ledger expects the joint dump, and an oom dump of another rank was heard: whether it is that joint dump, as
  /// its late origin said by the ledger's rule (DumpLedger::asks_joint): the store's cause replaces the archive the
  /// ledger names or names this rank among the origins it rejoins; an MPI trigger carries kJointTrigger. Under
  /// mutex_.
  virtual bool heard_is_joint() = 0;
  /// A dump threw on this rank before its end (enter_dump ends it with the error): MPI marks its communicator out
  /// of step with the others. Watcher only, without mutex_.
  virtual void dump_threw() {}
  /// Between this rank's freeze for the dump under way and its steps (DumpRun): tells the other ranks where they
  /// have not heard of it from this rank, as its origin (`entry` asked with `asked` 0: its request did not tell them
  /// before its freeze, a dump being under way; or `through_event`: settle_role made it one). `asked`: what
  /// ask_others() returned for the request (0: not asked). The transport also keeps what its assembly needs of the
  /// dump, and may set `h.batch` to the dump's (a joint dump keeps the batch of the archive it replaces). Returns
  /// whether the dump counts: the other ranks heard of it (DumpLedger::finish). Watcher only, without mutex_; may
  /// throw (the dump then ends with the error).
  virtual bool tell_others(DumpEntry entry, bool through_event, std::int64_t asked, FrozenHistory& h,
                           const DumpRequest& request) = 0;
  /// The dump under way just ended on this rank (DumpLedger::finish): what the transport kept for it goes. Under
  /// mutex_.
  virtual void dump_ended() {}

  /// This rank's part in a dump: its own request when one is due, else the dump another rank asked for, of the kind
  /// `heard` said (nullopt: only a due request of this rank), while it is still dump `number` (-1: the next, whatever
  /// its number). Begins it on the ledger (as a joint dump's rejoining origin when the ledger expects the joint
  /// dump and the transport takes the oom dump heard for it: heard_is_joint), freezes the history (a request's is frozen already), settles this rank's role (settle_role), has the
  /// transport tell the others (tell_others), runs DumpRun's steps and ends the dump. Returns whether a dump ran:
  /// false when one is under way, none is due and none was heard, or the session stopped (where the transport does
  /// not run dumps after it). Watcher only, without mutex_. A dump that throws ends with the error.
  bool enter_dump(std::optional<DumpKind> heard, std::int64_t number = -1);

  // --- The session's end (docs/protocol.md, "Leaving"), in the same steps on both transports: the leave agreement
  // of a normal end (leave_together), the dump under way and this rank's request first, the watcher stopped
  // (stop_watching) and waited for within the dump's bound (join_watcher), then a SIGTERM that is still to end the
  // process (sigterm_at_end). The transport says who ended and who is gone (its tally) and closes its mechanics.

  /// This rank ends normally: the others can count it now (MPI: the watcher posts this rank's part of the barrier;
  /// the store: `ending`). Session's thread, without mutex_; may throw (the agreement then ends, unsaid).
  virtual void say_ending() = 0;
  /// What the transport knows of the other ranks' ends now; nullopt when it can tell no more (MPI's watcher, which
  /// keeps the tally, stopped). Session's thread, without mutex_; may throw.
  virtual std::optional<LeaveTally> leave_tally() = 0;
  /// Waits, at most until `deadline_ns` (monotonic), for news of the others' ends (MPI: the watcher's tally
  /// changes; the store: a pause at its pace, this node's vanished peers noticed). Session's thread, without mutex_;
  /// may throw.
  virtual void await_leave_news(std::int64_t deadline_ns) = 0;

  /// The leave agreement of a normal end (leave_rule.hpp): says this rank ends, then keeps answering the others'
  /// dumps (the watcher runs on) until every rank ended or left, or OOMFLIGHT_DUMP_TIMEOUT has passed (said, with the
  /// tally: leaving_without_them_text). Returns the tally when every rank ended or left; nullopt otherwise (the
  /// deadline, a rank gone where the transport cannot count, or the transport could tell no more). Session's thread,
  /// without mutex_; never throws but std::bad_alloc.
  std::optional<LeaveTally> leave_together();

  /// Stops the watcher: first, with `after_dumps`, waits for the dump under way and one a request of this rank asked
  /// for once it is due (the watcher runs both; each within its bound, 3 x OOMFLIGHT_DUMP_TIMEOUT from its start, the
  /// whole wait within two); then sets stop_, puts back oomflight's signal handlers (SIGTERM's stays while a SIGTERM it
  /// took is still to end the process: sigterm_at_end) and rings the watcher. Any thread but the watcher, without
  /// mutex_.
  void stop_watching(bool after_dumps);

  /// After stop_watching(): waits for the watcher to end, at most `bound` (default: the bound of the dump under way
  /// when one is, else OOMFLIGHT_DUMP_TIMEOUT; plus two poll intervals), and joins it; or leaves it behind, detached,
  /// inside a call that a stalled or dead rank (or store) never lets finish: this object, and what it refers to,
  /// must then outlive it. Returns whether it was joined (watcher_joined()). From the watcher's own thread: detaches
  /// it and returns false. Without mutex_.
  bool join_watcher(std::optional<std::chrono::nanoseconds> bound = std::nullopt);

  /// Whether a SIGTERM is still to end the process at the session's end: one that came after the watcher's last
  /// turn (the handler's flag is still set), or one the watcher took but stopped before acting on (the session's
  /// end or the job's leave came first). The caller then tells the others that this rank left and ends the process
  /// with end_by_sigterm_saying(). True once; the watcher never ends the process after it. Takes mutex_.
  bool sigterm_at_end();

  // DumpRequests::Transport: a request rings the watcher, which runs every dump of this rank.
  void wake_watcher() override { doorbell_.ring(); }

  const Config& config_;
  const RankIdentity& identity_;
  Recorder& recorder_;
  std::mutex mutex_;
  std::condition_variable cv_;     // requesting threads, shutdown and the leave agreement wait here
  WatcherDoorbell doorbell_;       // the watcher sleeps here between turns; rung by this process and by node peers
  bool stop_ = false;              // (mutex_)
  DumpLedger ledger_;              // the dumps' numbers and the rules on them (mutex_)
  DumpRequests requests_;          // this process's requests (mutex_)
  DumpRun run_;                    // a dump's steps after the freeze (watcher)
  HeadroomWatch* const headroom_;  // the session's (OOMFLIGHT_HEADROOM_DUMP), or null
  bool exiting_ = false;           // SIGTERM came: the process ends once nothing is queued or under way (mutex_)
  const char* exit_why_ = "";      // ... with these words
  bool sigterm_claimed_ = false;   // ... by the watcher's end or the session's (sigterm_at_end) (mutex_)
  bool usr1_handler_ = false;      // the transport installed oomflight's SIGUSR1 handler (dump_signal.hpp) (mutex_)
  bool term_handler_ = false;      // ... and its SIGTERM handler (mutex_)
  std::int64_t active_start_ns_ = 0;  // when the dump under way began (monotonic): its bound at the end (mutex_)
  bool watcher_exited_ = false;    // (mutex_)
  bool watcher_joined_ = false;    // join_watcher() joined it (mutex_)
  std::thread watcher_;

 private:
  void watch();
  // One turn after another until stop_ (and the last request run, where the transport runs it).
  void watch_until_stopped();
  // The signals since the last turn (take_signals), under the transport's flags.
  void take_signal_turn();
  // Ends the dump under way with `result` (DumpLedger::finish; `counted`: the others heard of it).
  void finish_dump(DumpResult result, bool counted);

  SignalDumpLimiter signal_limiter_;  // SIGUSR1 bursts (OOMFLIGHT_SIGNAL_DUMP_INTERVAL); watcher only
};

}  // namespace oomflight
