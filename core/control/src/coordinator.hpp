// The policy of a rank's coordinated dumps, written once over a transport (internal to the control wing;
// docs/protocol.md, "One coordinator, two transports"). Issue 40: the MPI transport (trigger_protocol.*) and the job's
// c10d store (store_protocol.*) each had their own watcher loop, with the same rules in their own lines: the signals'
// turn, a rank's own request first, a SIGTERM that ends the process once what it queued is written, a request whose
// other ranks were told already run even while stopping. The Coordinator holds the state those rules are about (the
// ledger, the requests, the dump's steps, the watcher and its doorbell) and runs the loop; a transport derives from
// it and supplies its mechanics through the hooks below, as NCCL's socket and IB transports implement one ncclNet_t:
//
//   signal_flags     what the transport lets the signals' turn do now (its handlers, its agreement)
//   run_own_dump     this rank's request that is due: MPI's run_dump with its triggers, the store's cause and keys
//   look_for_dump    another rank's dump: MPI's trigger messages, the store's paced look at dN/cause (and its
//                    agreement and snapshot merges, which its look carries)
//   between_dumps    what the transport does between dumps (MPI: its snapshots' collective writes, the leave
//                    agreement's messages)
//   tell_left_on_signal  the others learn that this rank ends on SIGTERM (MPI's LEFT message, the store's left/R)
//   runs_asked_dump_after_stop  a capability: whether a request whose other ranks were told is still run once the
//                    session stops (MPI: yes, the others wait for it in the vote; the store: no, its stop lets go of
//                    the store, and the others' merge does without this rank)
//
// A dump's steps after the freeze are DumpRun's (dump_run.hpp), over the transport's DumpAssembly; what a request does
// is DumpRequests' (dump_requests.hpp); the rules on a rank's dumps are DumpLedger's (dump_ledger.hpp).
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>

#include "dump_coordinator.hpp"
#include "dump_executor.hpp"
#include "dump_ledger.hpp"
#include "dump_requests.hpp"
#include "dump_run.hpp"
#include "dump_signal.hpp"
#include "headroom_watch.hpp"
#include "oomflight/control/config.hpp"
#include "oomflight/control/rank_identity.hpp"
#include "oomflight/control/watcher_doorbell.hpp"
#include "oomflight/record/recorder.hpp"

namespace oomflight {

class Coordinator : public DumpCoordinator, protected DumpRequests::Transport, protected DumpAssembly {
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
  /// Whether a request whose other ranks were told (DumpRequests::due_and_asked) is run after stop_.
  virtual bool runs_asked_dump_after_stop() const = 0;

  /// Whether the watcher took a SIGTERM and stopped before it ended the process for it (the session's end or the
  /// job's leave came first): the caller then tells the others and ends the process as SIGTERM would. True once;
  /// the watcher never ends the process after it. Takes mutex_.
  bool claim_sigterm();

  // DumpRequests::Transport: a request rings the watcher, which runs every dump of this rank.
  void wake_watcher() override { doorbell_.ring(); }

  const Config& config_;
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
  bool sigterm_claimed_ = false;   // ... by the watcher's end or the session's (claim_sigterm) (mutex_)
  bool watcher_exited_ = false;    // (mutex_)
  std::thread watcher_;

 private:
  void watch();
  // One turn after another until stop_ (and the last request run, where the transport runs it).
  void watch_until_stopped();
  // The signals since the last turn (take_signals), under the transport's flags.
  void take_signal_turn();

  SignalDumpLimiter signal_limiter_;  // SIGUSR1 bursts (OOMFLIGHT_SIGNAL_DUMP_INTERVAL); watcher only
};

}  // namespace oomflight
