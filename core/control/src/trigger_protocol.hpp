// The MPI transport (internal to the control wing): the Coordinator's mechanics over a duplicated communicator
// (coordinator.hpp). Trigger messages and the doorbells of the node's ranks, the votes, the collective write of the
// archive (collective_dump.hpp), the DONE messages, the leave agreement's barrier and LEFT messages, and the
// snapshots' collective writer live here; the watcher's loop, a dump's steps and the rules on a rank's dumps are the
// Coordinator's, DumpRun's and DumpLedger's, as over the job's store.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "coordinator.hpp"
#include "dump_coordinator.hpp"
#include "dump_executor.hpp"
#include "dump_ledger.hpp"
#include "dump_requests.hpp"
#include "dump_run.hpp"
#include "dump_signal.hpp"
#include "signal_turn.hpp"
#include "dump_timeline.hpp"
#include "oomflight/control/config.hpp"
#include "oomflight/control/dump_request.hpp"
#include "oomflight/control/rank_identity.hpp"
#include "oomflight/record/recorder.hpp"
#include "protocol_messages.hpp"
#include "vote_summary.hpp"
#include "oomflight/control/snapshot_schedule.hpp"
#include "leave_agreement.hpp"
#include "leave_rule.hpp"
#include "snapshot_writer.hpp"
#include "oomflight/control/watcher_doorbell.hpp"

namespace oomflight {

class TriggerProtocol final : public Coordinator {
 public:
  /// Collective over `comm` (already duplicated for us; we own it). Posts the trigger receive and starts the
  /// watcher thread. References must outlive the protocol; `headroom` (may be null) too: its crossings are this
  /// watcher's to dump (take_signals).
  TriggerProtocol(const Config& config, const RankIdentity& identity, Recorder& recorder,
                  const DumpExecutor& executor, MPI_Comm comm, HeadroomWatch* headroom = nullptr);
  ~TriggerProtocol();

  /// Freezes this rank's history at once, asks every rank to dump, and returns when the archive is closed, the
  /// rank-local fallback is written, or 3 x dump_timeout has passed. Thread-safe; concurrent requests of one
  /// process join the same dump when they can.
  std::optional<DumpResult> request(const DumpRequest& request) override;

  /// Why a request was not coordinated: only once this rank's session ended (a rank that cannot be coordinated makes
  /// no TriggerProtocol).
  std::string why_alone() override;

  /// queue_snapshot(); always true.
  bool take_snapshot(const SnapshotWindow& window,
                     const std::function<FrozenHistory(std::vector<Event>)>& freeze) override;

  /// A rank that cannot be coordinated makes no TriggerProtocol: always.
  bool coordinates() override { return true; }
  /// The ranks agreed before the protocol was made (settings_agreement.hpp): never agreeing.
  bool agreeing() override { return false; }
  bool await_agreement() override { return true; }

  /// A normal end drains the queued snapshots (OOMFLIGHT_DUMP_TIMEOUT), then shutdown(true, normally); any other
  /// shutdown(false, on_error when `error`, else normally).
  bool end(bool normal, bool error) override;

  /// MPI's communicator is the session's to the end: the job never lets go of it.
  bool leaves_with_the_job() const override { return false; }
  void leave(const std::string&) override {}
  void finish_leaving(std::chrono::milliseconds) override {}

  /// Hands a closed snapshot window to the watcher and returns at once (the training thread never waits for
  /// another rank). `freeze` is called here with the last written snapshot's event storage (warm pages: the freeze
  /// is what a snapshot costs the training thread), unless the window has no place (SnapshotWriter's bound): it
  /// is then skipped by every rank. The watcher writes it with every rank as one archive of kind snapshot once
  /// every rank has handed over the same window. No-op without a schedule. Thread-safe.
  void queue_snapshot(const SnapshotWindow& window, const std::function<FrozenHistory(std::vector<Event>)>& freeze);

  /// Waits until every queued snapshot is written or skipped, at most `timeout`. Returns whether they all were.
  bool drain_snapshots(std::chrono::milliseconds timeout);

  /// Ends the session. With `together` (a normal end), first the leave agreement (leave_agreement.hpp):
  /// the watcher keeps answering triggers until every rank has asked to leave, a rank left without it, or
  /// OOMFLIGHT_DUMP_TIMEOUT. Without it (an error exit, this rank's OOM), or when that wait runs out, every other
  /// rank is told that this one left, so that a dump asked for later does not wait for it.
  /// Then the dump under way, and one a request of this rank asked for, end (the watcher runs both), the watcher
  /// stops, and the communicator is freed (no collective: safe when other ranks are gone); a SIGTERM still to act
  /// on then ends the process, the others told (Coordinator::sigterm_at_end). Idempotent.
  /// A watcher stuck in a dump's MPI call (a stalled or dead rank) is waited for only until that dump's bound,
  /// 3 x OOMFLIGHT_DUMP_TIMEOUT from its start; then it is detached and shutdown() returns false: the object,
  /// its communicator and everything it refers to must then stay alive until the process exits.
  /// `alone` is what the LEFT message says when this rank leaves without the others: on_error for an ending that
  /// never finalises MPI, normally otherwise.
  bool shutdown(bool together, LeaveAgreement::Leaving alone);

  /// After shutdown(): closes the watch of the node's peer processes (their pidfds), for a process that starts a
  /// new session. No MPI call.
  void stop_watching_peers() override;

  /// After shutdown() (the watcher stopped): whether a rank is known to end without MPI_Finalize: it said it leaves
  /// on an error, or its process on this node ended without a word, before or now (the node's processes are looked
  /// at again). No MPI call. One caller at a time.
  bool peer_never_finalises() override;

 private:
  // DumpRequests::Transport: the triggers, sent by a request before its freeze (not once a dump left the ranks out
  // of step).
  bool can_ask() const override { return !broken_; }
  std::int64_t ask_others(const DumpRequest& request, std::int64_t batch, std::int64_t number) override;
  // Coordinator (coordinator.hpp): the handlers this protocol installed, always coordinated (a rank that cannot be
  // makes no TriggerProtocol); a due request runs with the triggers heard so far; another rank's dump is a trigger
  // message (looked for a little longer when a rank of this node rang); between dumps, the snapshots' writes and the
  // leave agreement; SIGTERM's LEFT message; a request whose triggers went out runs even after shutdown() (the
  // others wait for it in the vote); an origin whose request did not send them, or through its oom event, sends its
  // triggers after the freeze; a joint dump's rejoining origin names the archive it replaces.
  SignalFlags signal_flags() override;
  bool run_own_dump() override;
  void look_for_dump(const WatcherDoorbell::Rings& rings) override;
  void between_dumps() override;
  void tell_left_on_signal() override;
  bool runs_asked_dump_after_stop() const override { return true; }
  bool tell_others(DumpEntry entry, bool through_event, std::int64_t asked, FrozenHistory& h,
                   const DumpRequest& request) override;
  void dump_ended() override;
  void dump_threw() override;
  // Whether a trigger of the dump heard said it is the joint dump (kJointTrigger).
  bool heard_is_joint() override;
  // The leave agreement's mechanics: the watcher posts this rank's part of the barrier and keeps the tally
  // (poll_leave); shutdown() waits on it.
  void say_ending() override;
  std::optional<LeaveTally> leave_tally() override;
  void await_leave_news(std::int64_t deadline_ns) override;
  // Whether a dump waits for this watcher (its own request, a trigger from another rank, shutdown): a snapshot
  // write yields to it. Watcher thread only.
  bool dump_waiting();
  // The watcher's part of the leave agreement: LEFT messages, and the barrier once shutdown() asked to leave.
  void poll_leave();
  // "ranks 0-1, 3 left the job before this dump (...)"; the ranks whose process ended without a word are named too.
  std::string gone_ranks_text(bool before_dump = true) const;

  // What a rank knows of a dump on its own (before or without the votes): its origins (`origins` and those of the
  // triggers heard), batch and kind, and its own request's figures.
  DumpFacts local_facts(const FrozenHistory& h, bool is_origin, const DumpRequest& request,
                        std::vector<std::int32_t> origins = {}) const;
  // DumpAssembly (dump_run.hpp): the votes, the collective write and the DONE messages; the rest of a dump is
  // DumpRun's, as over the store.
  DumpFacts facts_known(const FrozenHistory& h, bool is_origin, const DumpRequest& request) override;
  AssembledDump assemble(FrozenHistory& h, bool is_origin, const DumpRequest& request, const std::string& rank_file,
                         std::int64_t deadline_ns, DumpTimeline& timeline) override;
  // DONE to the origins, who wait for every rank's. Returns (on an origin) the ranks that said they failed during
  // this dump, ascending (their own dump follows: after an oom dump, the joint dump).
  std::vector<int> end_dump(bool is_origin, const std::vector<std::int32_t>& origins, bool late, bool wrote,
                            std::int64_t deadline_ns) override;
  std::unique_lock<std::mutex> lock_files() override { return {}; }  // MPI's files are the watcher's alone
  // assemble()'s work: the votes and the collective write (an exception out of it breaks comm_).
  AssembledDump vote_and_write(FrozenHistory& h, bool is_origin, const DumpRequest& request, std::int64_t deadline_ns,
                               DumpTimeline& timeline);
  // No archive: abandons the snapshots (the ranks are out of step) and says why, with what this rank knows.
  AssembledDump failed(const FrozenHistory& h, bool is_origin, const DumpRequest& request, std::string why,
                       std::vector<std::int32_t> origins = {});
  bool poll_trigger_message();
  // A rank of this node rang: its trigger is on its way. Polls for it briefly before going back to sleep.
  bool await_rung_trigger();
  // `joint`: the origin asks for the joint dump (kJointTrigger).
  void send_triggers(std::int64_t number, std::int64_t batch, DumpKind kind, bool joint);
  bool wait_for(MPI_Request& request, std::int64_t deadline_ns, bool give_up_when_a_rank_left = false);

  const RankIdentity& id_;
  const DumpExecutor& executor_;
  MPI_Comm comm_;

  std::vector<DoorbellAddress> node_doorbells_;  // the other ranks' of this node, rung with every trigger sent
  bool ending_ = false;                  // shutdown() began (mutex_)
  bool abandoned_ = false;               // shutdown() left a stuck watcher behind (mutex_)
  bool broken_ = false;                  // a collective was abandoned: comm_ must not be used collectively

  MPI_Request trigger_request_ = MPI_REQUEST_NULL;
  protocol::TriggerMessage incoming_{};
  std::set<int> heard_origins_;  // origins named by trigger messages in this dump
  std::int64_t heard_batch_ = -1;
  DumpKind heard_kind_ = DumpKind::oom;
  bool heard_joint_ = false;  // a trigger heard for this dump asks for the joint dump (watcher)
  // The joint dump (dump_ledger.hpp): a rank that fails during another rank's dump, after its freeze, says so in
  // its DONE message; the origins then stay (their requests do not return) for its dump.
  std::string supersede_path_;       // the archive the joint dump replaces, during it (watcher)
  std::unique_ptr<LeaveAgreement> leave_;
  std::unique_ptr<protocol::VoteReduction> votes_;  // the agreement's MPI datatype and operation (vote_summary.hpp)
  bool leaving_ = false;        // shutdown() asked to leave together (mutex_)
  LeaveTally leave_tally_;       // what the watcher knows of the others' ends (mutex_; world_size set at start)
  std::unique_ptr<SnapshotWriter> snapshots_;  // with a schedule: the snapshots, on a communicator of their own
};

}  // namespace oomflight
