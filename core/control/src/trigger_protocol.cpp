// The trigger protocol (docs/protocol.md):
//   1. The origin, in the failing thread, sends a trigger to every rank (point to point), rings the doorbells of its
//      node's watchers so that they see it at once, and freezes its ring.
//   2. Every rank's watcher, on a trigger, freezes its own ring, then all ranks gather their votes (am I an
//      origin, my kind, batch and request, how many rows my history adds) with a non-blocking collective under
//      one deadline.
//   Before step 2, every rank writes its frozen history to its rank-local file (the safety copy): from then on
//   nothing another rank does (a stall, a crash, a full disk under the archive) can lose it.
//   3. All ranks write the archive together (the DumpExecutor): the lowest origin names the file, lays it out and
//      sends its path with the layout, each rank writes its rows, the lowest origin marks it complete and
//      renames it; then each rank removes its safety copy and tells the origins it is done. Every step between
//      the ranks is a non-blocking collective under the same deadline. If one does not complete by it, the
//      communicator is abandoned and the safety copies are the result; ranks then tell the origins they are done,
//      so that an origin does not let its error end the job before the others wrote.
//   The origin prints its reason to stderr before step 1, so that a teardown during the dump cannot hide it.
//   Watchers sleep on a doorbell (watcher_doorbell.hpp) between polls; anything that needs them rings it.
#include "trigger_protocol.hpp"

#include "dump_outcome.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <fmt/format.h>

#include <unistd.h>

#include "collective_dump.hpp"
#include "dump_role.hpp"
#include "dump_run.hpp"
#include "dump_signal.hpp"
#include "dump_words.hpp"
#include "peer_processes.hpp"
#include "protocol_timing.hpp"
#include "settings_agreement.hpp"
#include "vote_summary.hpp"
#include "oomflight/format/collective_writer.hpp"
#include "retention.hpp"
#include "oomflight/base/log.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/record/clock.hpp"

namespace oomflight {
namespace {

using protocol::kTagDone;
using protocol::kJointTrigger;
using protocol::kTagTrigger;
using protocol::TriggerMessage;
using protocol::kVotesKept;
using protocol::Vote;
using protocol::VoteSummary;
using protocol::VoteSummaryHead;

// What a rank learns of its node's other ranks once, collectively over `comm`: their doorbells, and their processes
// to watch for an end without a word (peer_processes.hpp). Any failure leaves the lists short, which only means
// those ranks see triggers at their next poll, and their silent end is learnt at the deadline.
struct NodePeers {
  std::vector<DoorbellAddress> doorbells;
  std::vector<PeerProcesses::Peer> processes;
};

NodePeers exchange_node_peers(MPI_Comm comm, int rank, const DoorbellAddress& mine) {
  // Abstract socket names are per network namespace, and MPI_COMM_TYPE_SHARED may group ranks of different ones
  // (a container per rank sharing /dev/shm): a ring there would reach whichever socket has that name. Only the
  // ranks of this rank's namespace are rung; likewise, only processes of this rank's pid namespace are watched.
  struct Entry {
    std::uint64_t net_dev = 0, net_ino = 0;  // /proc/self/ns/net
    std::uint64_t pid_dev = 0, pid_ino = 0;  // /proc/self/ns/pid
    std::int64_t pid = 0;
    std::int32_t rank = -1;
    DoorbellAddress address;
  };
  NodePeers peers;
  Entry me{};
  const NamespaceId net_ns = own_namespace("net");
  me.net_dev = net_ns.dev;
  me.net_ino = net_ns.ino;
  const NamespaceId pid_ns = own_namespace("pid");
  me.pid_dev = pid_ns.dev;
  me.pid_ino = pid_ns.ino;
  me.pid = static_cast<std::int64_t>(::getpid());
  me.rank = rank;
  me.address = mine;
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) != MPI_SUCCESS) return peers;
  int size = 0;
  MPI_Comm_size(node, &size);
  std::vector<Entry> all(static_cast<std::size_t>(size));
  if (MPI_Allgather(&me, sizeof(Entry), MPI_BYTE, all.data(), sizeof(Entry), MPI_BYTE, node) == MPI_SUCCESS) {
    for (const Entry& e : all) {
      if (e.rank == rank) continue;
      const bool same_net = e.net_dev == me.net_dev && e.net_ino == me.net_ino;
      if (e.address.length > 0 && same_net) peers.doorbells.push_back(e.address);
      const bool same_pids = pid_ns.ino != 0 && e.pid_dev == me.pid_dev && e.pid_ino == me.pid_ino;
      if (same_pids) peers.processes.push_back({e.rank, e.pid});
    }
  }
  MPI_Comm_free(&node);
  return peers;
}

// Messages must outlive their MPI_Isend; they are tiny and rare, so they are kept for the process. A requesting
// thread and the watcher both send: the storage is taken under its own lock.
// Never destroyed (allocated once, not a static object): a send may still be in MPI's queue, or a watcher left
// behind may still send, while the process's static destructors run.
std::array<std::int64_t, 3>& new_outgoing_message() {
  static auto* mutex = new std::mutex;
  static auto* messages = new std::deque<std::array<std::int64_t, 3>>;
  std::lock_guard lock(*mutex);
  return messages->emplace_back();
}

}  // namespace

TriggerProtocol::TriggerProtocol(const Config& config, const RankIdentity& identity, Recorder& recorder,
                                 const DumpExecutor& executor, MPI_Comm comm, HeadroomWatch* headroom)
    : Coordinator(config, identity, recorder, executor, headroom), id_(identity), executor_(executor), comm_(comm) {
  MPI_Irecv(&incoming_, sizeof(incoming_), MPI_BYTE, MPI_ANY_SOURCE, kTagTrigger, comm_, &trigger_request_);
  NodePeers node = exchange_node_peers(comm_, id_.rank, doorbell_.address());
  node_doorbells_ = std::move(node.doorbells);
  usr1_handler_ = install_dump_signal();  // the watcher starts below: no lock needed yet
  if (config_.dump_on_exit) term_handler_ = install_exit_signal();
  MPI_Comm leave_comm = MPI_COMM_NULL;
  MPI_Comm_dup(comm_, &leave_comm);  // collective, like this constructor
  MPI_Comm_set_errhandler(leave_comm, MPI_ERRORS_RETURN);
  leave_ = std::make_unique<LeaveAgreement>(comm_, leave_comm, id_.rank, id_.world_size,
                                            std::make_unique<PeerProcesses>(node.processes));
  votes_ = std::make_unique<protocol::VoteReduction>(id_.world_size);
  leave_tally_.world_size = id_.world_size;
  if (config_.snapshots()) {
    MPI_Comm snapshot_comm = MPI_COMM_NULL;
    MPI_Comm_dup(comm_, &snapshot_comm);  // collective, like this constructor
    MPI_Comm_set_errhandler(snapshot_comm, MPI_ERRORS_RETURN);
    snapshots_ = std::make_unique<SnapshotWriter>(config_, id_, executor_, snapshot_comm);
  }
  start_watcher();
}

TriggerProtocol::~TriggerProtocol() { shutdown(false, LeaveAgreement::Leaving::on_error); }

bool TriggerProtocol::shutdown(bool together, LeaveAgreement::Leaving alone) {
  {
    std::lock_guard lock(mutex_);
    if (ending_) return !abandoned_;
    ending_ = true;
  }
  // The leave agreement (leave_agreement.hpp): the watcher keeps answering triggers until every rank has asked to
  // leave, a rank left without it, or the deadline. The rule is leave_rule.hpp's, the tally the watcher's
  // (poll_leave): MPI's barrier says only that all ended.
  if (together) (void)leave_together();
  if (snapshots_) snapshots_->stop();
  stop_watching(true);
  const bool joined = join_watcher();
  {
    std::lock_guard lock(mutex_);
    abandoned_ = !joined;
  }
  if (!joined) {
    // A SIGTERM still to act on ends the process all the same (the LEFT message is the stuck watcher's to send: it
    // uses the agreement's communicator; the others see this process end on its node, or reach their deadline).
    if (sigterm_at_end()) end_by_sigterm_saying("while leaving at the end of the job, with a dump stuck");
    const std::string safety_path = run_.rank_file();
    log().error("the dump is stuck in an MPI call (a rank stalled or died during it); leaving it behind so that "
                "the job can exit. Every rank that froze its history wrote its rank-local file before the first "
                "collective step{}",
                safety_path.empty() ? std::string() : fmt::format(" (this rank's: {})", safety_path));
    return false;  // comm_, the pending receive and this object stay as they are: the watcher still uses them
  }
  // A SIGTERM the watcher took but could not end the process for before it stopped, or one that came after its
  // last turn: ended here, as it meant.
  const bool end_on_sigterm = sigterm_at_end();
  // Told before the communicator goes: a rank that asks for a dump after this one left must not wait for it.
  leave_->receive_left_messages();
  leave_->announce_leaving(end_on_sigterm ? LeaveAgreement::Leaving::on_error
                           : together     ? LeaveAgreement::Leaving::normally
                                          : alone);
  leave_->close();
  if (trigger_request_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&trigger_request_);
    MPI_Wait(&trigger_request_, MPI_STATUS_IGNORE);
  }
  // A communicator with an abandoned collective on it must not be freed (the collective still refers to it).
  if (!broken_) MPI_Comm_free(&comm_);
  if (snapshots_) snapshots_->close();
  if (end_on_sigterm) end_by_sigterm_saying("while leaving at the end of the job");  // never finalises MPI
  return true;
}

void TriggerProtocol::say_ending() {
  {
    std::lock_guard lock(mutex_);
    leaving_ = true;
  }
  doorbell_.ring();  // the watcher posts this rank's part of the barrier now (poll_leave)
}

std::optional<LeaveTally> TriggerProtocol::leave_tally() {
  std::lock_guard lock(mutex_);
  if (watcher_exited_) return std::nullopt;
  return leave_tally_;
}

void TriggerProtocol::await_leave_news(std::int64_t deadline_ns) {
  std::unique_lock lock(mutex_);
  // The watcher notifies when its tally changes (poll_leave); the wait is bounded all the same.
  const std::int64_t left = deadline_ns - monotonic_ns();
  if (left <= 0 || watcher_exited_) return;
  cv_.wait_for(lock, std::min<std::chrono::nanoseconds>(std::chrono::nanoseconds(left), config_.poll_interval));
}

void TriggerProtocol::stop_watching_peers() {
  {
    std::lock_guard lock(mutex_);
    if (!watcher_exited_) return;
  }
  leave_->stop_watching_processes();
}

bool TriggerProtocol::peer_never_finalises() {
  {
    std::lock_guard lock(mutex_);
    if (!watcher_exited_) return false;  // the agreement is the watcher's until it stops
  }
  return leave_->peer_process_ended() || leave_->any_left_on_error();
}

bool TriggerProtocol::take_snapshot(const SnapshotWindow& window,
                                    const std::function<FrozenHistory(std::vector<Event>)>& freeze) {
  queue_snapshot(window, freeze);
  return true;
}

bool TriggerProtocol::end(bool normal, bool error) {
  if (normal && !drain_snapshots(config_.dump_timeout)) {
    log().warn("a snapshot was not written within OOMFLIGHT_DUMP_TIMEOUT at shutdown (a rank did not reach the "
               "end of its window, or left); it is dropped");
  }
  return shutdown(normal, error ? LeaveAgreement::Leaving::on_error : LeaveAgreement::Leaving::normally);
}

std::optional<DumpResult> TriggerProtocol::request(const DumpRequest& request) {
  std::unique_lock lock(mutex_);
  return requests_.request(lock, request);  // nullopt once shut down: the session writes this rank alone
}

std::string TriggerProtocol::why_alone() {
  std::lock_guard lock(mutex_);
  return stop_ ? "after this rank's oomflight session ended" : "";
}

std::int64_t TriggerProtocol::ask_others(const DumpRequest& request, std::int64_t batch, std::int64_t number) {
  bool joint = false;
  {
    std::lock_guard lock(mutex_);
    joint = ledger_.asks_joint(request.kind);
  }
  send_triggers(number, batch, request.kind, joint);
  log().debug("triggers sent to every rank before the freeze");
  return 1;
}

Coordinator::SignalFlags TriggerProtocol::signal_flags() {
  // The handler of SIGTERM is installed only with OOMFLIGHT_DUMP_ON_EXIT, and the ranks agreed before this protocol
  // was made.
  return SignalFlags{.usr1 = true, .term = term_handler_, .leaving = leaving_, .dump_on_exit = true,
                     .coordinated = true, .headroom = true};
}

bool TriggerProtocol::run_own_dump() {
  {
    std::lock_guard lock(mutex_);
    if (!requests_.due()) return false;
  }
  // The triggers that came meanwhile name their origins in this rank's own file of the dump.
  if (heard_origins_.empty()) (void)poll_trigger_message();
  return enter_dump(std::nullopt);
}

void TriggerProtocol::look_for_dump(const WatcherDoorbell::Rings& rings) {
  bool remote = !heard_origins_.empty() || poll_trigger_message();  // a snapshot's write may have taken it
  if (!remote && rings.other) remote = await_rung_trigger();
  if (!remote) return;
  // Every trigger that is here already: their origins, and whether one asks for the joint dump (a through-event
  // origin's trigger may come before the late origin's that it answers).
  while (poll_trigger_message()) {
  }
  log().debug("trigger from rank {} seen {}", *heard_origins_.begin(),
              rings.other ? "at once (a rank of this node rang)" : "at a poll");
  (void)enter_dump(heard_kind_);
}

void TriggerProtocol::between_dumps() {
  if (snapshots_) snapshots_->poll([this] { return dump_waiting(); });
  poll_leave();
}

void TriggerProtocol::tell_left_on_signal() {
  // The process ends on a signal: it never finalises MPI and never votes again. The others hear it now rather
  // than at their deadline (the watcher is between dumps here, so "left" cannot be taken for a missing vote).
  leave_->receive_left_messages();
  leave_->announce_leaving(LeaveAgreement::Leaving::on_error);
}

void TriggerProtocol::queue_snapshot(const SnapshotWindow& window,
                                     const std::function<FrozenHistory(std::vector<Event>)>& freeze) {
  if (!snapshots_) return;
  if (snapshots_->wants_history(window)) {
    snapshots_->queue(freeze(snapshots_->take_spare_events()), window);
  } else {
    snapshots_->queue_skipped(window);  // no freeze: the bound on waiting windows (snapshot_writer.hpp)
  }
  doorbell_.ring();
}

bool TriggerProtocol::drain_snapshots(std::chrono::milliseconds timeout) {
  return !snapshots_ || snapshots_->drain(timeout);
}

void TriggerProtocol::poll_leave() {
  leave_->receive_left_messages();
  // Any rank gone so far, whoever saw it first: a dump's vote or DONE wait may have taken the news (issue 29's
  // review: a rank killed during a dump kept a survivor's normal end waiting out its whole leave agreement).
  const bool gone = !leave_->gone().empty();
  bool leaving = false;
  {
    std::lock_guard lock(mutex_);
    leaving = leaving_;
  }
  if (leaving) leave_->post();
  const bool together = leaving && leave_->everyone_left();
  // A rank that is gone writes no snapshot any more: a window now waits for it in vain (and a normal end's drain
  // with it, up to the deadline).
  if (gone && snapshots_ && !snapshots_->broken()) {
    snapshots_->abandon();
    log().info("no more snapshots in this job: {}", gone_ranks_text(false));
  }
  const int gone_count = static_cast<int>(leave_->gone().size());
  std::lock_guard lock(mutex_);
  if (gone_count != leave_tally_.gone || (together && !leave_tally_.all_ended)) cv_.notify_all();
  leave_tally_.gone = gone_count;
  leave_tally_.all_ended = leave_tally_.all_ended || together;
}

std::string TriggerProtocol::gone_ranks_text(bool before_dump) const {
  return oomflight::gone_ranks_text({leave_->gone().begin(), leave_->gone().end()},
                                    {leave_->vanished().begin(), leave_->vanished().end()}, before_dump);
}

bool TriggerProtocol::dump_waiting() {
  {
    std::lock_guard lock(mutex_);
    if (stop_ || requests_.due()) return true;
  }
  // A trigger taken here is kept in heard_origins_ for the watcher's next turn (watch_until_stopped).
  return !heard_origins_.empty() || poll_trigger_message();
}

bool TriggerProtocol::poll_trigger_message() {
  int arrived = 0;
  MPI_Test(&trigger_request_, &arrived, MPI_STATUS_IGNORE);
  if (!arrived) return false;
  const TriggerMessage msg = incoming_;
  MPI_Irecv(&incoming_, sizeof(incoming_), MPI_BYTE, MPI_ANY_SOURCE, kTagTrigger, comm_, &trigger_request_);
  if (msg.epoch < ledger_.number()) return false;  // a second origin's trigger for a dump already written
  const std::int32_t kind = msg.kind & ~kJointTrigger;
  if (heard_origins_.empty() && kind >= 0 && kind < kDumpKindCount) heard_kind_ = static_cast<DumpKind>(kind);
  heard_joint_ = heard_joint_ || (msg.kind & kJointTrigger) != 0;
  heard_origins_.insert(msg.origin);
  if (heard_batch_ < 0) heard_batch_ = msg.batch;
  return true;
}

bool TriggerProtocol::await_rung_trigger() {
  // The ringing rank posted its trigger before ringing; through shared memory it is there already or within
  // microseconds. A ring that brings no trigger (from outside the job, or a trigger still in flight over the
  // network) costs a few polls, then the usual sleep.
  // At least 20 tests as well as 2 ms: a watcher descheduled for the 2 ms (more ranks than cores) still tests.
  const std::int64_t until = monotonic_ns() + 2'000'000;
  for (int tests = 0; tests < 20 || monotonic_ns() < until; ++tests) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (poll_trigger_message()) return true;
  }
  return false;
}

void TriggerProtocol::send_triggers(std::int64_t number, std::int64_t batch, DumpKind kind, bool joint) {
  auto& msg = new_outgoing_message();
  const TriggerMessage m{number, batch, id_.rank, static_cast<std::int32_t>(kind) | (joint ? kJointTrigger : 0)};
  std::memcpy(msg.data(), &m, sizeof(m));
  for (int r = 0; r < id_.world_size; ++r) {
    if (r == id_.rank) continue;
    MPI_Request request;
    MPI_Isend(msg.data(), sizeof(m), MPI_BYTE, r, kTagTrigger, comm_, &request);
    MPI_Request_free(&request);  // completes on its own; the buffer is kept for the process
  }
  // Then wake this node's watchers, so that they test for the trigger now rather than at their next poll.
  for (const DoorbellAddress& peer : node_doorbells_) doorbell_.ring(peer);
}

bool TriggerProtocol::wait_for(MPI_Request& request, std::int64_t deadline_ns, bool give_up_when_a_rank_left) {
  const std::int64_t start = monotonic_ns();
  for (;;) {
    int complete = 0;
    MPI_Test(&request, &complete, MPI_STATUS_IGNORE);
    if (complete) return true;
    // Only for the vote: a rank whose LEFT message arrives before it voted will never vote (its watcher stopped;
    // one inside this dump would not have left). Later steps are not given up on this way: a rank that completed
    // its part and left is not missing from them.
    if (give_up_when_a_rank_left && leave_->receive_left_messages()) return false;
    const std::int64_t now = monotonic_ns();
    if (now > deadline_ns) return false;
    std::this_thread::sleep_for(poll_pause(now - start));
  }
}

bool TriggerProtocol::tell_others(DumpEntry entry, bool through_event, std::int64_t asked, FrozenHistory& h,
                                  const DumpRequest& request) {
  if (entry == DumpEntry::rejoined) {
    std::lock_guard lock(mutex_);
    supersede_path_ = ledger_.joint_path();  // its vote says so: the collective write replaces that archive
  }
  // A rejoining origin's triggers are the late origin's, and a request's went out before its freeze.
  const bool send = entry == DumpEntry::asked ? asked == 0 : through_event;
  if (!send || broken_) return true;
  std::int64_t number = 0;
  bool joint = false;
  {
    std::lock_guard lock(mutex_);
    number = ledger_.number();
    joint = entry == DumpEntry::asked && ledger_.asks_joint(request.kind);
  }
  send_triggers(number, h.batch, request.kind, joint);
  return true;
}

void TriggerProtocol::dump_threw() {
  broken_ = true;  // this rank left the dump's collective steps where they were: the others' next ones would hang
  if (snapshots_) snapshots_->abandon();
}

bool TriggerProtocol::heard_is_joint() { return heard_joint_; }

void TriggerProtocol::dump_ended() {
  supersede_path_.clear();
  heard_joint_ = false;
  heard_origins_.clear();
  heard_batch_ = -1;
  heard_kind_ = DumpKind::oom;
}

DumpFacts TriggerProtocol::local_facts(const FrozenHistory& h, bool is_origin, const DumpRequest& request,
                                       std::vector<std::int32_t> origins) const {
  // Without an agreement, the origins this rank knows of are itself and the senders of the triggers it received.
  origins.insert(origins.end(), heard_origins_.begin(), heard_origins_.end());
  if (is_origin) origins.push_back(id_.rank);
  std::sort(origins.begin(), origins.end());
  origins.erase(std::unique(origins.begin(), origins.end()), origins.end());
  const bool heard = !is_origin && !heard_origins_.empty();
  DumpFacts f;
  f.batch = heard && heard_batch_ >= 0 ? heard_batch_ : h.batch;
  f.kind = heard ? heard_kind_ : request.kind;
  f.origins = std::move(origins);
  // A trigger carries no figures: this rank's own request's (an origin's), or none.
  f.requested_bytes = request.requested_bytes;
  f.device_free_bytes = request.device_free_bytes;
  f.numbers_from_message = request.numbers_from_message;
  f.reason = request.reason;
  return f;
}

DumpFacts TriggerProtocol::facts_known(const FrozenHistory& h, bool is_origin, const DumpRequest& request) {
  return local_facts(h, is_origin, request);
}

AssembledDump TriggerProtocol::failed(const FrozenHistory& h, bool is_origin, const DumpRequest& request,
                                      std::string why, std::vector<std::int32_t> origins) {
  // The ranks are out of step (or every one of them failed to write): no snapshot can be agreed on after this.
  if (snapshots_) snapshots_->abandon();
  AssembledDump a;
  a.facts = local_facts(h, is_origin, request, std::move(origins));
  a.error = std::move(why);
  return a;
}

AssembledDump TriggerProtocol::assemble(FrozenHistory& h, bool is_origin, const DumpRequest& request,
                                        const std::string& /*rank_file*/, std::int64_t deadline_ns,
                                        DumpTimeline& timeline) {
  try {
    return vote_and_write(h, is_origin, request, deadline_ns, timeline);
  } catch (const std::exception& e) {
    // Thrown on this rank alone, maybe between two collectives the others are in: comm_ is out of step.
    broken_ = true;
    return failed(h, is_origin, request, e.what());
  }
}

AssembledDump TriggerProtocol::vote_and_write(FrozenHistory& h, bool is_origin, const DumpRequest& request,
                                              std::int64_t deadline_ns, DumpTimeline& timeline) {
  const int size = id_.world_size;
  const std::int64_t start_ns = active_start_ns_;
  if (broken_) return failed(h, is_origin, request, "an earlier dump left the ranks out of step");
  leave_->receive_left_messages();
  if (!leave_->gone().empty()) {
    // No vote can complete without them: the rank-local files now, not after the deadline.
    return failed(h, is_origin, request, gone_ranks_text());
  }
  Vote mine;
  mine.is_origin = is_origin ? 1 : 0;
  mine.rank = id_.rank;
  mine.batch = h.batch;
  mine.requested_bytes = request.requested_bytes;
  mine.device_free_bytes = request.device_free_bytes;
  mine.device = h.device;
  mine.kind = static_cast<std::int32_t>(request.kind);
  set_fixed_string(mine.reason, request.reason);
  mine.snapshots_broken = snapshots_ && snapshots_->broken() ? 1 : 0;
  mine.replaces_archive = supersede_path_.empty() ? 0 : 1;
  // One reduction of every vote into a summary of a few KB (vote_summary.hpp), not a gather of every vote. A
  // collective given up on may still complete later (a stalled rank resumes) and write into its buffers: they live
  // on the heap and are leaked when the deadline passes.
  struct Buffers {
    VoteSummary mine, all;
  };
  auto buffers = std::make_unique<Buffers>(
      Buffers{VoteSummary(mine, dump_row_counts(h, &request.state), size), VoteSummary(size)});
  MPI_Request pending;
  MPI_Iallreduce(buffers->mine.data(), buffers->all.data(), 1, votes_->type(), votes_->op(), comm_, &pending);
  const auto timeout_text = format_seconds(config_.dump_timeout.count() / 1000.0);
  if (!wait_for(pending, deadline_ns, true)) {
    buffers.release();  // NOLINT: deliberately leaked, see above
    broken_ = true;
    return failed(h, is_origin, request,
                  leave_->gone().empty()
                      ? fmt::format("not every rank joined the dump within {} (OOMFLIGHT_DUMP_TIMEOUT)", timeout_text)
                      : gone_ranks_text());
  }
  log().debug("votes of {} ranks in {}", size, format_seconds(seconds_since(start_ns)));
  timeline.mark("votes");
  const VoteSummaryHead summary = buffers->all.head();
  ArchiveRowCounts row_totals{};
  std::copy(std::begin(summary.row_totals), std::end(summary.row_totals), row_totals.begin());
  std::vector<std::int32_t> origins = buffers->all.origins();
  std::string reason;
  for (int i = 0; i < summary.kept_count && i < kVotesKept; ++i) {
    const Vote& v = summary.kept[i];
    reason += fmt::format("{}rank {}: {}", reason.empty() ? "" : "\n", v.rank, fixed_string(v.reason));
  }
  if (std::cmp_greater(origins.size(), summary.kept_count)) {
    const std::vector<int> more(origins.begin() + summary.kept_count, origins.end());
    reason += fmt::format("\nand {} more (each one's reason is in its row of /ranks): {} {}", more.size(),
                          more.size() == 1 ? "rank" : "ranks", rank_ranges(more));
  }
  if (origins.empty()) origins.push_back(heard_origins_.empty() ? 0 : *heard_origins_.begin());
  // The lowest origin's vote; without one (every origin's request was consumed by an earlier dump), the lowest
  // rank's, which every rank has alike.
  const Vote& lowest = summary.kept_count > 0 ? summary.kept[0] : summary.first;
  const std::int64_t batch = lowest.batch;
  const auto kind = lowest.kind >= 0 && lowest.kind < kDumpKindCount ? static_cast<DumpKind>(lowest.kind)
                                                                      : DumpKind::oom;
  // Every rank reads the same summary, so every rank stops its snapshots alike: when a rank abandoned a snapshot's
  // write for this dump (the others would wait for it in the next one), and after an OOM dump (the job is going
  // down; a snapshot started now would only race its teardown and leave a partial file).
  if (snapshots_ && !snapshots_->broken()) {
    const bool abandoned = summary.snapshots_broken != 0;
    if (abandoned || kind == DumpKind::oom) {
      snapshots_->abandon();
      log().info("no more snapshots in this job: {}",
                 abandoned ? "a rank abandoned a snapshot's write for this dump" : "it ran out of memory");
    }
  }

  // The lowest origin names the archive (creating its folder) and lays it out; the path travels with the layout.
  // In a joint dump, the origin whose archive it replaces does, under that archive's name.
  const int namer = summary.replacer != INT32_MAX ? summary.replacer : lowest.rank;
  std::string name;
  if (id_.rank == namer) {
    try {
      name = supersede_path_.empty() ? executor_.archive_path(kind, batch) : supersede_path_;
    } catch (const std::exception& e) {
      log().error("{}", e.what());  // an empty name tells every rank to fall back
    }
  }
  std::vector<std::int32_t> present(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) present[static_cast<std::size_t>(r)] = r;
  ArchiveHeader header = executor_.header(kind, batch, reason, origins, present);
  header.dump_number = ledger_.number();
  const RankRow row = executor_.rank_row(h, is_origin, request);
  timeline.mark("tally");
  std::string path;
  try {
    path = write_dump_collective(
        executor_, name, header, row, h, comm_,
        CollectiveArchive{.root = namer,
                          .wait = [&](MPI_Request& step) { return wait_for(step, deadline_ns); },
                          .step_done = [&timeline](const char* step) { timeline.mark(step); },
                          .stripes = config_.archive_stripes,
                          .row_totals = row_totals,
                          // A joint dump's archive replaces the one this job just wrote under that name.
                          .naming = supersede_path_.empty() ? Naming::keep_others : Naming::replace},
        &request.state);
  } catch (const CollectiveTimeout& e) {
    broken_ = true;  // a collective stays pending on comm_
    return failed(h, is_origin, request, fmt::format("{} (OOMFLIGHT_DUMP_TIMEOUT, {})", e.what(), timeout_text),
                  origins);
  } catch (const ArchiveError& e) {
    return failed(h, is_origin, request, e.what(), origins);  // every rank throws together
  } catch (const std::exception& e) {
    broken_ = true;  // thrown on this rank alone: the others wait for it in a collective
    return failed(h, is_origin, request, e.what(), origins);
  }
  log().debug("archive written in {}", format_seconds(seconds_since(start_ns)));
  AssembledDump a;
  a.archive = true;
  a.path = path;
  a.ranks_written = size;
  a.facts = DumpFacts{kind, batch, origins, lowest.requested_bytes, lowest.device_free_bytes, 0,
                      fixed_string(lowest.reason)};
  a.replaces = supersede_path_;
  // The lowest origin speaks for the dump, and prunes: every rank knows it alike from the votes.
  a.speaks = a.prunes = id_.rank == lowest.rank;
  return a;
}

std::vector<int> TriggerProtocol::end_dump(bool is_origin, const std::vector<std::int32_t>& origins, bool late,
                                           bool /*wrote*/, std::int64_t deadline_ns) {
  // DONE to every origin, from every rank, with or without a file: over MPI an origin waits for every rank not gone.
  auto& msg = new_outgoing_message();
  msg[0] = ledger_.number();
  msg[1] = late ? 1 : 0;  // this rank failed during the dump: its own follows, and the origins should stay
  for (int origin : origins) {
    if (origin == id_.rank) continue;
    MPI_Request request;
    MPI_Isend(msg.data(), 2, MPI_INT64_T, origin, kTagDone, comm_, &request);
    MPI_Request_free(&request);
  }
  std::vector<int> late_ranks;  // ranks that failed during this dump: their own dump follows
  if (!is_origin) return late_ranks;
  // An origin's error ends the job: give every other rank until the deadline to finish its own file (not those
  // that left before the dump: they write none).
  // The ranks still awaited: every other rank but those that left (before or during the dump: a rank whose
  // process ended on this node is gone too, and will never send DONE).
  std::set<int> done;
  const auto awaited = [&] {
    int n = 0;
    for (int r = 0; r < id_.world_size; ++r) {
      n += r != id_.rank && done.count(r) == 0 && leave_->gone().count(r) == 0 ? 1 : 0;
    }
    return n;
  };
  const std::int64_t waiting_since = monotonic_ns();
  leave_->receive_left_messages();
  while (awaited() > 0 && monotonic_ns() < deadline_ns) {
    int arrived = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kTagDone, comm_, &arrived, &status);
    if (!arrived) {
      std::this_thread::sleep_for(poll_pause(monotonic_ns() - waiting_since));
      leave_->receive_left_messages();
      continue;
    }
    std::array<std::int64_t, 2> done_msg{};
    MPI_Recv(done_msg.data(), 2, MPI_INT64_T, status.MPI_SOURCE, kTagDone, comm_, MPI_STATUS_IGNORE);
    if (done_msg[0] == ledger_.number()) {
      done.insert(status.MPI_SOURCE);
      if (done_msg[1] != 0) late_ranks.push_back(status.MPI_SOURCE);
    }
  }
  if (const int missing = awaited(); missing > 0) {
    // This rank and every other rank that still holds a file of the dump (not those that left: they write none).
    const int expected = 1 + missing + static_cast<int>(done.size());
    log().warn("{}", done_before_deadline_text(expected - missing, expected));
  }
  std::sort(late_ranks.begin(), late_ranks.end());
  return late_ranks;
}

}  // namespace oomflight
