// Session: identity, the recorder, and either the trigger protocol (MPI) or the single-process dump.
#include "oomflight/control/session.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>


#include "dump_executor.hpp"
#include "leave_agreement.hpp"
#include "environment.hpp"
#include "oomflight/base/log.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/control/mpi_job.hpp"
#include "oomflight/format/collective_writer.hpp"
#include "retention.hpp"
#include "settings_agreement.hpp"
#include "snapshot_events.hpp"
#include "store_protocol.hpp"
#include "trigger_protocol.hpp"

namespace oomflight {

Session::Session(Config config, MPI_Comm world)
    : config_(std::move(config)), recorder_(config_.max_entries, true, config_.max_batches), schedule_(config_) {
  set_log_level(config_.log_level);
  keep_hdf5_out_of_process_exit();
  // Symbolising deferred stacks at a freeze is the first step of a dump: it gets a quarter of the dump's
  // deadline, at most 2 s (100,000 Python contexts resolve in about 0.12 s, docs/performance.md).
  recorder_.set_resolve_timeout(static_cast<std::uint32_t>(
      std::min<std::int64_t>(2000, std::max<std::int64_t>(1, config_.dump_timeout.count() / 4))));
  MPI_Comm comm = MPI_COMM_NULL;
  if (world != MPI_COMM_NULL) {
    MPI_Comm_dup(world, &comm);
    // A failed MPI call of the recorder (a peer that died, a transport error) must come back to us as an error
    // code, never abort the job it watches.
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    // The first collective of the recorder: every rank compares the settings that must agree before any
    // collective that depends on them (settings_agreement.hpp).
    try {
      agree_on_settings(&config_, comm);
    } catch (...) {
      MPI_Comm_free(&comm);
      throw;
    }
  }
  try {
    identity_ = identify(config_, comm);
    set_log_rank(identity_.rank);
    recorder_.context().set_environment(capture_environment(identity_, config_));
    executor_ = std::make_unique<DumpExecutor>(config_, identity_);
  } catch (const std::bad_alloc&) {
    // Not a bad_alloc: that one means "before any collective" to the caller (refuse_start_up).
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    throw std::runtime_error("out of memory while starting the session");
  } catch (...) {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    throw;
  }
  if (comm == MPI_COMM_NULL) return;
  if (!config_.enabled) {
    // OOMFLIGHT_ENABLED=0 on every rank (the agreement refused it on some only): no watcher, no signal handler,
    // no trigger to answer.
    MPI_Comm_free(&comm);
    return;
  }
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    log().warn("MPI was initialised without MPI_THREAD_MULTIPLE; coordinated dumps are off and each rank writes a "
               "rank-local file");
    MPI_Comm_free(&comm);
    return;
  }
  protocol_ = std::make_unique<TriggerProtocol>(config_, identity_, recorder_, *executor_, comm);
}

void Session::refuse_start_up(MPI_Comm world) noexcept {
  try {
    MPI_Comm comm = MPI_COMM_NULL;
    if (MPI_Comm_dup(world, &comm) != MPI_SUCCESS) return;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    try {
      agree_on_settings(nullptr, comm);
    } catch (...) {
      // Always thrown (this rank cannot start): its own error is the one its caller reports.
    }
    MPI_Comm_free(&comm);
  } catch (...) {
  }
}

Session::~Session() {
  const bool ended = shutdown(End::error);
  bool left_behind = false;
  for (auto& left : left_stores_) {
    // A store this rank left whose watcher was left behind (in a dump of its own) still reads the session's parts.
    if (!left->watcher_joined()) {
      (void)left.release();
      left_behind = true;
    }
  }
  if (!ended || left_behind) {
    // The watcher is stuck inside a dump and still refers to this session: keep the parts it uses alive.
    (void)protocol_.release();
    (void)store_protocol_.release();
    (void)executor_.release();
  }
}

bool Session::shutdown(End how) {
  const bool normal_end = how == End::normal || (how == End::requested && !oom_dumped_);
  {
    std::unique_lock lock(batch_mutex_);
    if (shut_down_) return protocol_ ? protocol_->shutdown(false, LeaveAgreement::Leaving::on_error) : true;
    if (normal_end && config_.enabled) {
      // A normal end ends the running batch: a window whose last batch it is closes now, and is written
      // before the watcher stops (every rank shuts down alike; bounded by the dump deadline).
      if (const auto w = schedule_.closed_at_end(recorder_.batch()); w && await_store_agreement(lock)) {
        take_snapshot(*w);
      }
    }
    shut_down_ = true;
  }
  // An error exit, or a requested end after this rank's OOM dump, is the job ending on its error, and its peers
  // may be stuck in the job's own collectives: no window is closed or waited for (a dump goes first: the OOM ends
  // the job as fast with snapshots on as without).
  if (normal_end && protocol_ && !protocol_->drain_snapshots(config_.dump_timeout)) {
    log().warn("a snapshot was not written within OOMFLIGHT_DUMP_TIMEOUT at shutdown (a rank did not reach the "
               "end of its window, or left); it is dropped");
  }
  // The store transport has no leave agreement: it tells the others this rank left, so that no dump waits for it.
  if (store_protocol_) store_protocol_->shutdown(normal_end);
  // A store this rank left (destroy_process_group) whose watcher was still inside a call to it lets go of it when
  // that call returns: given up to a second more now, so that the job's store (a FileStore's file) does not outlive
  // the process for oomflight's sake.
  std::vector<StoreProtocol*> left;
  {
    std::lock_guard lock(batch_mutex_);
    for (const auto& l : left_stores_) left.push_back(l.get());
  }
  for (StoreProtocol* l : left) l->finish_leaving(std::chrono::seconds(1));
  // A normal end leaves together with the other ranks (answering their dumps meanwhile); any other end does not
  // wait for them, and says whether it finalises MPI: an error never does; a requested end after an OOM dump may
  // (a caught and retried OOM that exits 0), so it does not claim otherwise.
  return protocol_ ? protocol_->shutdown(normal_end, how == End::error ? LeaveAgreement::Leaving::on_error
                                                                       : LeaveAgreement::Leaving::normally)
                   : true;
}

void Session::stop_watching_peers() {
  if (protocol_) protocol_->stop_watching_peers();
}

bool Session::peer_never_finalises() { return protocol_ && protocol_->peer_never_finalises(); }

void Session::join_store(std::unique_ptr<StoreClient> store, int rank, int world_size, int local_rank) {
  if (world_size < 1 || rank < 0 || rank >= world_size || local_rank < 0 || local_rank >= world_size) {
    throw std::invalid_argument(fmt::format("rank {} and local rank {} of world size {}: out of range", rank,
                                            local_rank, world_size));
  }
  std::lock_guard lock(batch_mutex_);
  if (protocol_) throw std::logic_error("this process joined its MPI job already (an MPI launcher started it)");
  if (store_protocol_) throw std::logic_error("this process joined the job's store already (leave it first)");
  if (shut_down_) throw std::logic_error("the session has ended");
  identity_.rank = rank;
  identity_.world_size = world_size;
  identity_.local_rank = local_rank;
  set_log_rank(rank);
  recorder_.context().set_environment(capture_environment(identity_, config_));
  store_protocol_ =
      std::make_unique<StoreProtocol>(config_, identity_, batch_mutex_, files_mutex_, recorder_, *executor_,
                                      std::move(store));
  store_view_.store(store_protocol_.get(), std::memory_order_release);
}

bool Session::leave_store(const std::string& why) noexcept {
  try {
    StoreProtocol* leaving = nullptr;
    {
      std::lock_guard lock(batch_mutex_);
      if (!store_protocol_) return false;
      const std::string because = "after this rank left the job's store (" + why + ")";
      left_stores_.reserve(left_stores_.size() + 1);  // the push_back below cannot throw
      // dump() reads the view without the lock: what it finds stays alive (kept in left_stores_, whatever leave()
      // does), and answers as a protocol that left (its dump, if any, is this rank's alone).
      store_view_.store(nullptr, std::memory_order_release);
      leaving = store_protocol_.get();
      left_stores_.push_back(std::move(store_protocol_));
      alone_because_ = because;
    }
    leaving->leave(why);
    return true;
  } catch (...) {
    return false;  // out of memory before anything was moved: still joined
  }
}

void Session::mark_batch(std::int64_t batch) {
  std::unique_lock lock(batch_mutex_);
  const std::int64_t previous = recorder_.batch();
  recorder_.mark_batch(batch);
  if (!config_.enabled || shut_down_) return;
  if (const auto w = schedule_.closed_by(previous, batch)) {
    if (!await_store_agreement(lock)) return;
    take_snapshot(*w);
  }
}

bool Session::await_store_agreement(std::unique_lock<std::mutex>& batch_lock) {
  // A window that closes before the ranks' start-up agreement through the job's store waits for it (within its
  // bound), as a dump asked for then does: written alone, it would be a file of this rank under its provisional run
  // name, each rank in a run folder of its own (issue 40). The agreement takes the batch lock to adopt the run name.
  StoreProtocol* store = store_view_.load(std::memory_order_acquire);
  if (store == nullptr || !store->agreeing()) return true;
  batch_lock.unlock();
  store->await_agreement();
  batch_lock.lock();
  return !shut_down_;
}

void Session::take_snapshot(const SnapshotWindow& window) {
  try {
    if (protocol_) {
      protocol_->queue_snapshot(window, [&](std::vector<Event> storage) {
        return recorder_.freeze(-1, std::move(storage));
      });
      return;
    }
    FrozenHistory h = recorder_.freeze(-1);
    // One process: no watcher, no other rank to wait for; written here.
    std::vector<Event> events = snapshot_events(h.ring.events, window.first, window.last);
    const std::vector<Collective> window_collectives =
        snapshot_collectives(h.collectives.records, window.first, window.last);
    ArchiveHeader header = executor_->header(
        DumpKind::snapshot, window.first, fmt::format("snapshot of batches {} to {}", window.first, window.last), {},
        {identity_.rank});
    header.window_first_batch = window.first;
    header.window_last_batch = window.last;
    DumpRequest request;
    request.kind = DumpKind::snapshot;
    const RankDump dump{.row = executor_->rank_row(h, false, request), .events = events, .stacks = &h.stacks,
                        .batches = h.batches.rows, .context = h.context, .state_segments = {}, .state_blocks = {},
                        .collectives = window_collectives, .communicators = h.communicators};
    StoreProtocol* store = store_view_.load(std::memory_order_acquire);
    const bool joined = store != nullptr && store->agreed();  // asked before the files' lock: never with it
    // A failing thread's dump_alone, or a joined rank's watcher, may be in HDF5 meanwhile.
    std::unique_lock<std::mutex> files(files_mutex_);
    if (joined) {
      // Joined through the job's store: this rank's window in its rank-local file, here (as one process writes its
      // snapshot here); the rank whose file completes the window merges them on its watcher, so that no training
      // thread waits for another rank.
      const std::string mine =
          executor_->write_rank_local(header, dump, DumpKind::snapshot, window.first, Durability::verified);
      files.unlock();
      store->snapshot_written(window.first, window.last, mine);
      return;
    }
    if (identity_.world_size > 1) {
      // One of several ranks, not coordinated with the others (its launcher numbered it, the job's store is not
      // reached or was left): its own rank-local file, named and marked as such, never an archive claiming the job.
      const std::string alone = store != nullptr ? store->why_alone() : alone_because_;
      header.reason += fmt::format(" (written by this rank alone, {})", alone);
      const std::string mine =
          executor_->write_rank_local(header, dump, DumpKind::snapshot, window.first, Durability::verified);
      log().info("snapshot of batches {} to {}: rank-local file {} written by this rank alone, {}", window.first,
                 window.last, mine, alone);
      return;
    }
    const std::string path = write_archive(executor_->archive_path(DumpKind::snapshot, window.first), header, dump,
                                           Durability::verified,
                                           config_.overwrite ? Naming::replace : Naming::keep_others);
    log().info("snapshot of batches {} to {}: archive {} written", window.first, window.last, path);
    prune_archives(path, identity_.run_name, identity_.job_id, config_);
  } catch (const std::exception& e) {
    log().error("snapshot of batches {} to {} not written: {}", window.first, window.last, e.what());
  }
}

DumpResult Session::dump(const DumpRequest& given) {
  // An OutOfMemoryError that no allocator hook saw arrives with its message only: its figures come from there.
  const int device = given.device >= 0 ? given.device : recorder_.current_device();
  const DumpRequest request =
      complete_from_message(given, recorder_.memory(device).device_capacity_bytes != 0);
  if (!config_.enabled) {
    DumpResult r;
    r.kind = request.kind;
    r.status = DumpResult::Status::disabled;
    return r;
  }
  if (request.kind == DumpKind::oom) oom_dumped_ = true;
  if (protocol_) return protocol_->request(request);
  std::string alone;  // why a rank of several dumps alone, for its file's reason and its log line
  if (StoreProtocol* store = store_view_.load(std::memory_order_acquire)) {
    if (auto r = store->request(request)) return std::move(*r);
    alone = store->why_alone();
  }
  if (identity_.world_size > 1 && alone.empty()) {
    std::lock_guard lock(batch_mutex_);
    alone = alone_because_;
  }
  return dump_alone(request, alone);
}

DumpResult Session::dump_alone(const DumpRequest& request, const std::string& alone) {
  const std::int64_t start = monotonic_ns();
  FrozenHistory h = recorder_.freeze(request.device);
  if (request.batch >= 0) h.batch = request.batch;
  const std::vector<std::int32_t> me = {identity_.rank};
  // The root cause first (as the trigger protocol does), before any file is touched.
  const std::string cause = dump_summary(request.kind, me, h.batch, request.requested_bytes, request.device_free_bytes,
                                         request.numbers_from_message);
  if (request.kind == DumpKind::oom) {
    log().error("{}{}{}", cause, request.reason.empty() ? "" : ": ", request.reason);
  }
  const std::string note = alone.empty() ? "" : fmt::format(" (written by this rank alone, {})", alone);
  const ArchiveHeader header = executor_->header(
      request.kind, h.batch, fmt::format("rank {}: {}{}", identity_.rank, request.reason, note), me, me);
  // The batch thread's snapshot, or a joined rank's watcher, may be in HDF5 meanwhile.
  std::unique_lock<std::mutex> files(files_mutex_);
  DumpResult r =
      executor_->write_single_rank(header, executor_->rank_row(h, true, request), h, h.batch, &request.state);
  r.seconds = static_cast<double>(monotonic_ns() - start) / 1e9;
  const std::string summary =
      dump_summary(request.kind, me, h.batch, request.requested_bytes, request.device_free_bytes,
                   request.numbers_from_message);
  switch (r.status) {
    case DumpResult::Status::archive:
      log().info("{}; archive {} written in {}", summary, r.path, format_seconds(r.seconds));
      prune_archives(r.path, identity_.run_name, identity_.job_id, config_);
      break;
    case DumpResult::Status::rank_local:
      log().warn("{}; rank-local file {} written in {}{}{}", summary, r.path, format_seconds(r.seconds),
                 alone.empty() ? "" : fmt::format(" by this rank alone, {}", alone),
                 r.error.empty() ? "" : fmt::format(" ({})", r.error));
      break;
    default:
      log().error("{}; no file written: {}", summary, r.error);
      break;
  }
  return r;
}

}  // namespace oomflight
