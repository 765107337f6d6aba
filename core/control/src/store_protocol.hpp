// The coordinated dump of a job that no MPI launcher started (torchrun, the trainers' own launchers), over a
// key-value store every rank reaches: the job's c10d store, handed over by the PyTorch plugin (store_client.hpp).
// docs/protocol.md, "Jobs without MPI", says what each key means and why; in short:
//
//   hello/R          rank R's settings that must agree, and (rank 0's) the run name and job id everyone adopts
//   hellos           counter of those: rank 0 reads the hellos once every rank has written its own
//   agreement        rank 0's verdict: "ok", the run name and job id everyone adopts; or "off" and why (every rank
//                    says it, and coordinates nothing)
//   dN/trigger       counter: origins of dump N (the first one, which gets 1, writes the cause)
//   dN/cause         the first origin's rank, kind, batch, figures and reason: every rank's file of dump N says so
//   dN/file/R        rank R's rank-local file of dump N (written before anything waits on another rank)
//   dN/files         counter of those files
//   dN/claim         counter: the lowest rank with a file that gets 1 merges the files into the archive
//   dN/merged        "ok", the archive's path and the ranks in it; or "failed" and why
//   dN/claim_late    counter: when no merged appears within one more deadline (the merger died), the first waiter
//                    with a file merges instead
//   left, left/R     ranks whose session ended (R: the dump number it had reached): nobody waits for them
//   node/R           rank R's peers on its node ("rank pid doorbell" each), set by rank 0 at the agreement: R watches
//                    their processes, and rings their watchers' doorbells when it writes a dump's cause
//   vanished/R, silent/R  a peer saw rank R's process end: the first (whose add gives 1) writes left/R for it, and
//                    silent/R, unless R had said ending/R or left/R itself
//   ending/R         rank R counts itself in `ending` (set first)
//   ending, left_early  ranks ending normally, and ranks that left on an error: a normal end answers dumps until
//                    the two add up to the world size (the leave agreement)
//   sW/file/R, sW/files  rank R's file of the snapshot window starting at batch W, and their count: the rank
//                    whose add gives the world size merges them (nobody waits: a snapshot never holds a rank up)
//
// No collective: every step is a round trip to the store, polled until OOMFLIGHT_DUMP_TIMEOUT, at a pace that
// bounds the whole job's requests (store_pacing.hpp). A rank's history reaches disk (its rank-local file) before it
// waits for anyone; the archive is a merge of those files, so a rank that stalls or dies costs the others the
// deadline and its place in the archive, never their histories.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "coordinator.hpp"
#include "dump_coordinator.hpp"
#include "dump_executor.hpp"
#include "dump_ledger.hpp"
#include "dump_requests.hpp"
#include "dump_run.hpp"
#include "dump_signal.hpp"
#include "signal_turn.hpp"
#include "oomflight/control/config.hpp"
#include "oomflight/control/dump_request.hpp"
#include "oomflight/control/rank_identity.hpp"
#include "oomflight/control/store_client.hpp"
#include "oomflight/record/recorder.hpp"
#include "store_handle.hpp"
#include "peer_processes.hpp"
#include "store_pacing.hpp"
#include "oomflight/control/watcher_doorbell.hpp"

namespace oomflight {

class StoreProtocol final : public Coordinator {
 public:
  /// `identity` already holds this rank's rank, world size and local rank; its run name and job id are replaced by
  /// rank 0's once the ranks agree (on the watcher thread, under `identity_mutex`, which whoever reads them outside
  /// a dump holds: the session's batch lock). Publishes this rank's hello
  /// and starts the watcher; never waits for another rank. All references must outlive the protocol; `headroom`
  /// (may be null) too: its crossings are this watcher's to dump once the ranks agreed (take_signals).
  StoreProtocol(const Config& config, RankIdentity& identity, std::mutex& identity_mutex, std::mutex& files_mutex,
                Recorder& recorder, DumpExecutor& executor, std::unique_ptr<StoreClient> store,
                HeadroomWatch* headroom = nullptr);
  ~StoreProtocol();
  StoreProtocol(const StoreProtocol&) = delete;
  StoreProtocol& operator=(const StoreProtocol&) = delete;

  /// A dump that this rank asks for: freezes its history, makes every rank dump, returns once the archive has its
  /// name, this rank's rank-local file is the result, or 3 x OOMFLIGHT_DUMP_TIMEOUT has passed (a request before
  /// the ranks' start-up agreement first waits for it: up to 2 x OOMFLIGHT_DUMP_TIMEOUT from the join). A request
  /// while a dump is under way waits for it and returns its result, unless its own oom event came after this
  /// rank's freeze for it (then a dump of its own follows). nullopt when the ranks never agreed at start (the
  /// caller dumps this rank alone). Thread-safe; never throws.
  std::optional<DumpResult> request(const DumpRequest& request) override;

  /// The lock every HDF5 use of a joined process takes (Debian's HDF5 is not built thread-safe, and the store path
  /// writes from the watcher, a failing thread and the batch thread): around each file's write, read or merge, never
  /// around a wait for another rank. The session's `files_mutex`, so that its own writes take the same one.
  std::unique_lock<std::mutex> lock_files() override { return std::unique_lock(files_mutex_); }

  /// Whether the ranks agreed at start (run name, job id, settings): only then are snapshots merged. Thread-safe.
  bool agreed();

  /// Whether the ranks' start-up agreement is still to come (neither agreed nor off). Thread-safe.
  bool agreeing() override;
  /// Whether the ranks agreed to coordinate their dumps (not yet while agreeing; never when they did not).
  bool coordinates() override;

  /// Waits for the start-up agreement, within its bound (2 x OOMFLIGHT_DUMP_TIMEOUT from the join, as a dump
  /// asked for before it waits), and returns agreed(): a snapshot window that closes before the agreement is written
  /// under the job's one run name, with every rank's (issue 40). Never call it holding `identity_mutex` (the
  /// agreement takes it). Thread-safe; never throws.
  bool await_agreement() override;

  /// Why a dump of this rank is its own and not every rank's (request() gave nullopt, or agreed() is false), in the
  /// words its file's reason and its log line use: the ranks did not agree, have not agreed yet, or this rank left.
  /// Thread-safe.
  std::string why_alone() override;

  /// A snapshot window's history of this rank is in its rank-local file `path`: says so in the store
  /// (`sW/file/R`, `sW/files`, W the window's first batch); the rank whose file completes the window merges every
  /// rank's file into the snapshot archive on its watcher (at its next poll, after any dump), then removes them. A
  /// window that some rank never writes stays in rank-local files. Never waits for another rank; never throws (a
  /// failure of the store is logged, and the file stays).
  void snapshot_written(std::int64_t first_batch, std::int64_t last_batch, const std::string& path);

  /// Once the ranks agreed: freezes this rank's history, writes the window's part to its rank-local file (under the
  /// files' lock) and says so (snapshot_written); false before or without the agreement (the session writes it
  /// alone). Throws what the write throws.
  bool take_snapshot(const SnapshotWindow& window,
                     const std::function<FrozenHistory(std::vector<Event>)>& freeze) override;

  /// shutdown(normal); true.
  bool end(bool normal, bool error) override;

  /// The job's store is the job's: it lets go of it at destroy_process_group (leave()).
  bool leaves_with_the_job() const override { return true; }

  /// Nothing here waits on a finalise: false.
  bool peer_never_finalises() override { return false; }

  /// Closes the watch of this node's peer processes (their pidfds).
  void stop_watching_peers() override;

  /// Ends this rank's part. A `normal` end first keeps answering dumps until every rank has ended or left on an
  /// error (the leave agreement; at most OOMFLIGHT_DUMP_TIMEOUT); any other end waits for nobody. Then the dump under
  /// way ends (bounded by 3 x OOMFLIGHT_DUMP_TIMEOUT), the watcher stops, a snapshot window this rank completed is
  /// merged, and the other ranks learn that this one left (so that no dump waits for it). The store is released
  /// last (store_handle.hpp). Idempotent; never throws.
  void shutdown(bool normal);

  /// The job is letting go of its store (torch's destroy_process_group): this rank leaves at once, as an error end
  /// does (the other ranks learn it, and no dump waits for it), without waiting for anyone: a dump under way on this
  /// rank ends at its next store call (its rank-local file stands), the watcher is given at most a poll interval to
  /// stop (else it is left behind), and the store is released once no call is in flight. `why` names the cause in
  /// any later error. Idempotent; never throws.
  void leave(const std::string& why) override;

  /// After leave(): waits at most `bound` for a watcher that was left inside a call to the store to end (the store
  /// is released as that call returns). Thread-safe; never throws.
  void finish_leaving(std::chrono::milliseconds bound) override;

 private:
  enum class State { agreeing, agreed, off };
  struct Cause {
    int origin = 0;
    DumpKind kind = DumpKind::oom;
    std::int64_t batch = -1;
    std::uint64_t requested_bytes = 0;
    std::uint64_t device_free_bytes = 0;
    std::uint32_t numbers_from_message = 0;
    std::string reason;
    // The joint dump (docs/protocol.md, "Two origins at once"): a rank failed during dump N after its freeze and
    // said so (dN/late); its dump names N's origins too and replaces N's archive, whose path this is.
    std::string replaces;
    std::vector<std::int32_t> joint_origins;
  };

  // Coordinator (coordinator.hpp): SIGUSR1 once the agreement said whether the ranks coordinate (a request waits for
  // it), SIGTERM at once whatever the state (torchrun's SIGKILL follows 30 s later); a due request is enter_dump's;
  // another rank's dump is a look at dN/cause at the job's pace (or at once when a rank of this node rang), and the
  // look also carries the start-up agreement, a late verdict and the snapshot windows to merge; SIGTERM's left/R; a
  // request is not run after stop (its stop lets go of the store: the others merge without this rank).
  SignalFlags signal_flags() override;
  bool run_own_dump() override { return enter_dump(std::nullopt); }
  void look_for_dump(const WatcherDoorbell::Rings& rings) override;
  void tell_left_on_signal() override;
  bool runs_asked_dump_after_stop() const override { return false; }
  // An origin's request tells the store (tell_cause) unless it did before its freeze, and reads back the cause of
  // the first origin (its dump's kind and batch); an origin through its oom event adds its trigger; any other rank's
  // dump is heard_cause_'s.
  bool tell_others(DumpEntry entry, bool through_event, std::int64_t asked, FrozenHistory& h,
                   const DumpRequest& request) override;
  bool heard_is_joint() override;
  // Another rank's dump n, whose cause is `text` (seen at a look): this rank's part of it. Watcher only.
  void run_heard(std::int64_t n, const std::string& text, const WatcherDoorbell::Rings& rings);
  // The leave agreement's mechanics (Coordinator::leave_together): `ending/R` and the `ending` counter, the
  // `left_early` one, and a pause at the store's pace in which this node's vanished peers are noticed.
  void say_ending() override;
  std::optional<LeaveTally> leave_tally() override;
  void await_leave_news(std::int64_t deadline_ns) override;
  // After a complete leave agreement, the watcher stopped: the last word of a rank (`gone`), and rank 0's wait for
  // the others' (it may host the store's server, which goes when it lets go of the store).
  void leave_last(std::int64_t ending);
  bool state_off();
  bool try_agree(std::int64_t deadline_ns);  // false while hellos (rank 0) or the verdict (others) are missing
  bool take_verdict(std::int64_t deadline_ns);  // ranks other than 0: rank 0's verdict, once it is there
  void adopt_verdict(const std::vector<std::string>& verdict);  // {version, "ok", run, job} | {version, "off", why}
  bool wait_agreed(std::unique_lock<std::mutex>& lock);
  // DumpAssembly (dump_run.hpp), for dump dump_number_ of cause_: what its cause says; the file keys, the wait for
  // every rank's file and the merge (the lowest rank with a file merges; a late claim when it does not); and the
  // end of the dump (dN/late, dN/done/R, dN/done: an origin waits for every rank with a file, as the MPI
  // transport's DONE does).
  DumpFacts facts_known(const FrozenHistory& h, bool is_origin, const DumpRequest& request) override;
  AssembledDump assemble(FrozenHistory& h, bool is_origin, const DumpRequest& request, const std::string& rank_file,
                         std::int64_t deadline_ns, DumpTimeline& timeline) override;
  std::vector<int> end_dump(bool is_origin, const std::vector<std::int32_t>& origins, bool late, bool wrote,
                            std::int64_t deadline_ns) override;
  std::string key(std::int64_t n, const std::string& what) const;
  // Tells the job's store that this rank left before dump `reached` (and, `early`, not by a normal end: ranks
  // ending normally wait for nobody that left this way); stops at the first failure (a store that is gone answers
  // nothing, and each failed request may cost the job's log a warning of torch's).
  void tell_left(std::int64_t reached, bool early);
  // The watcher's look at the store failed: logged once with the cause, later failures counted (store_failures_).
  void store_failed(const std::exception& e);
  // Rank 0, at the agreement: node/R for each rank R with peers on its node (same host and pid namespace).
  void publish_node_peers(const std::vector<std::vector<std::string>>& hellos, std::size_t settings);
  // Watches the processes of this node's other ranks ("rank pid doorbell" each), as the MPI transport does, and
  // keeps their doorbells.
  void start_watching(const std::vector<std::string>& peers);
  // Rings the watchers of this node's other ranks: a dump's cause is in the store. Any thread; no store call.
  void ring_node_peers();
  // A rank of this node whose process ended without telling the store is told for it (left/R, left_early), by one
  // of its peers: nothing waits for it (issue 40: a worker's os._exit cost every other worker the whole deadline).
  // Any thread; calls the store.
  void notice_vanished();
  static std::string encode(const Cause& c);
  static std::optional<Cause> decode(const std::string& text);
  std::optional<Cause> wait_for_cause(std::int64_t n, std::int64_t deadline_ns);
  // Every rank with a file of dump n said done, or left (seen: what earlier looks saw).
  bool every_file_done(std::int64_t n, std::vector<char>& seen);
  // DumpRequests::Transport: a request tells the other ranks through the store before its freeze (tell_cause), and
  // rings this watcher, which runs every dump of this rank.
  bool can_ask() const override { return true; }
  std::int64_t ask_others(const DumpRequest& request, std::int64_t batch, std::int64_t number) override;
  // The cause a request of this rank gives its dump, at `batch`: for a failure that came during the last dump,
  // after this rank's freeze and said in time (end_dump), the joint dump's (that dump's origins stay for this one,
  // which names them too and replaces their archive; `say`: log it).
  Cause cause_for(const DumpRequest& request, std::int64_t batch, bool say);
  // dN/trigger, and for the first origin (the add gives it 1) dN/cause, then this node's watchers rung. Returns the
  // trigger's order, 0 when the store failed (the dump then does not count). Never throws.
  std::int64_t tell_cause(std::int64_t n, const Cause& cause);
  // The paths under `prefix`R for every rank R that this host can see (the others are named in the log).
  std::vector<std::string> visible_files(const std::string& prefix, std::vector<std::int32_t>* ranks);
  bool every_rank_answered(std::int64_t n, std::vector<char>& answered);  // answered: what earlier looks saw
  // dN/merged's fields once it is there, or nullopt at `until_ns`.
  std::optional<std::vector<std::string>> wait_merged(std::int64_t n, std::int64_t until_ns);
  // Merges the files of dump n into its archive (`replaces`: the archive a joint dump replaces, else a new name).
  std::string merge(std::int64_t n, DumpKind kind, std::int64_t batch, const std::string& replaces,
                    std::vector<std::int32_t>* ranks);
  void merge_snapshot(std::int64_t first_batch, std::int64_t last_batch);

  RankIdentity& id_;
  std::mutex& identity_mutex_;
  DumpExecutor& executor_;
  std::unique_ptr<StoreHandle> store_;  // released at the end of this rank's part (shutdown, leave)
  const StorePacing pacing_;  // how often this rank asks the store: bounded for the whole job (store_pacing.hpp)
  std::int64_t agree_deadline_ns_ = 0;

  std::mutex& files_mutex_;  // the session's; lock_files(); taken after mutex_ is released, never with it
  State state_ = State::agreeing;  // (mutex_)
  std::int64_t dump_number_ = 0;  // the dump under way (watcher)
  Cause cause_;                   // ... and its cause
  Cause heard_cause_;             // the cause of another rank's dump the watcher just read (run_heard)
  bool verdict_late_ = false;  // the watcher's: this rank gave up on rank 0's verdict, and still looks for it
  bool left_ = false;
  bool said_ending_ = false;  // this rank added itself to `ending` (its leave agreement): it never leaves early
  std::vector<std::pair<std::int64_t, std::int64_t>> snapshots_to_merge_;  // windows this rank completed
  std::int64_t store_failures_ = 0;
  int failures_ = 0;              // the watcher's looks that failed in a row (their backoff)
  std::int64_t next_store_ns_ = 0;  // when the watcher asks the store next: at the job's pace (store_pacing.hpp)
  std::mutex peers_mutex_;  // node_peers_ has one caller at a time (the watcher, a dump's wait, the leave agreement)
  std::unique_ptr<PeerProcesses> node_peers_;  // the processes of this node's other ranks (peers_mutex_)
  std::vector<DoorbellAddress> node_doorbells_;  // their watchers' doorbells, rung with a cause (peers_mutex_)
};

}  // namespace oomflight
