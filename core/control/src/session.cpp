// Session: identity, the recorder, and the coordinator of this rank's dumps (the MPI transport or the job's store;
// dump_coordinator.hpp), or its dumps alone.
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
#include "dump_coordinator.hpp"
#include "snapshot_dump.hpp"
#include "peak_forecast.hpp"
#include "headroom_watch.hpp"
#include "process_device_memory.hpp"
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
    if (config_.enabled && config_.headroom_ppm > 0) headroom_ = std::make_unique<HeadroomWatch>(config_.headroom_ppm);
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
    alone_because_ = "MPI was initialised without MPI_THREAD_MULTIPLE";
    MPI_Comm_free(&comm);
    return;
  }
  coordinator_ = std::make_unique<TriggerProtocol>(config_, identity_, recorder_, *executor_, comm, headroom_.get());
  view_.store(coordinator_.get(), std::memory_order_release);
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
  for (auto& left : left_) {
    // A store this rank left whose watcher was left behind (in a dump of its own) still reads the session's parts.
    if (!left->watcher_joined()) {
      (void)left.release();
      left_behind = true;
    }
  }
  if (!ended || left_behind) {
    // The watcher is stuck inside a dump and still refers to this session: keep the parts it uses alive.
    (void)coordinator_.release();
    (void)executor_.release();
    (void)headroom_.release();
  }
}

bool Session::shutdown(End how) {
  const bool normal_end = how == End::normal || (how == End::requested && !oom_dumped_);
  {
    std::unique_lock lock(batch_mutex_);
    if (shut_down_) return coordinator_ ? coordinator_->end(false, true) : true;
    if (normal_end && config_.enabled) {
      // A normal end ends the running batch: a window whose last batch it is closes now, and is written
      // before the watcher stops (every rank shuts down alike; bounded by the dump deadline).
      if (const auto w = schedule_.closed_at_end(recorder_.batch()); w && await_agreement(lock)) take_snapshot(*w);
    }
    shut_down_ = true;
  }
  // An error exit, or a requested end after this rank's OOM dump, is the job ending on its error, and its peers
  // may be stuck in the job's own collectives: no window is closed or waited for (a dump goes first: the OOM ends
  // the job as fast with snapshots on as without). A normal end leaves together with the other ranks (answering
  // their dumps meanwhile); any other end does not wait for them, and says whether it ends on an error: a requested
  // end after an OOM dump may finalise MPI (a caught and retried OOM that exits 0), so it does not claim otherwise.
  const bool ended = coordinator_ ? coordinator_->end(normal_end, how == End::error) : true;
  // A store this rank left (destroy_process_group) whose watcher was still inside a call to it lets go of it when
  // that call returns: given up to a second more now, so that the job's store (a FileStore's file) does not outlive
  // the process for oomflight's sake.
  std::vector<DumpCoordinator*> left;
  {
    std::lock_guard lock(batch_mutex_);
    for (const auto& l : left_) left.push_back(l.get());
  }
  for (DumpCoordinator* l : left) l->finish_leaving(std::chrono::seconds(1));
  return ended;
}

void Session::stop_watching_peers() {
  if (coordinator_) coordinator_->stop_watching_peers();
}

bool Session::peer_never_finalises() { return coordinator_ && coordinator_->peer_never_finalises(); }

void Session::join_store(std::unique_ptr<StoreClient> store, int rank, int world_size, int local_rank) {
  if (world_size < 1 || rank < 0 || rank >= world_size || local_rank < 0 || local_rank >= world_size) {
    throw std::invalid_argument(fmt::format("rank {} and local rank {} of world size {}: out of range", rank,
                                            local_rank, world_size));
  }
  std::lock_guard lock(batch_mutex_);
  if (coordinator_ && !coordinator_->leaves_with_the_job()) {
    throw std::logic_error("this process joined its MPI job already (an MPI launcher started it)");
  }
  if (coordinator_) throw std::logic_error("this process joined the job's store already (leave it first)");
  if (shut_down_) throw std::logic_error("the session has ended");
  identity_.rank = rank;
  identity_.world_size = world_size;
  identity_.local_rank = local_rank;
  set_log_rank(rank);
  recorder_.context().set_environment(capture_environment(identity_, config_));
  coordinator_ = std::make_unique<StoreProtocol>(config_, identity_, batch_mutex_, files_mutex_, recorder_, *executor_,
                                                 std::move(store), headroom_.get());
  view_.store(coordinator_.get(), std::memory_order_release);
}

bool Session::leave_store(const std::string& why) noexcept {
  try {
    DumpCoordinator* leaving = nullptr;
    {
      std::lock_guard lock(batch_mutex_);
      if (!coordinator_ || !coordinator_->leaves_with_the_job()) return false;
      const std::string because = "after this rank left the job's store (" + why + ")";
      left_.reserve(left_.size() + 1);  // the push_back below cannot throw
      // dump() reads the view without the lock: what it finds stays alive (kept in left_, whatever leave() does),
      // and answers as a coordinator that left (its dump, if any, is this rank's alone).
      view_.store(nullptr, std::memory_order_release);
      leaving = coordinator_.get();
      left_.push_back(std::move(coordinator_));
      alone_because_ = because;
    }
    leaving->leave(why);
    return true;
  } catch (...) {
    return false;  // out of memory before anything was moved: still joined
  }
}

void Session::mark_batch(std::int64_t batch) {
  // NVML before the batch lock: a failing thread's dump alone waits for that lock, never for the driver.
  if (config_.enabled) sample_outside_allocator();
  std::unique_lock lock(batch_mutex_);
  const std::int64_t previous = recorder_.batch();
  recorder_.mark_batch(batch);
  if (!config_.enabled || shut_down_) return;
  if (const auto row = recorder_.last_ended_batch(); row && row->batch == previous) {
    // The forecast (peak_forecast.hpp): against the process's cap where it has one below the device's capacity.
    const MemoryStats m = recorder_.memory(row->device);
    const bool cap = m.memory_cap_bytes != 0 &&
                     (row->device_capacity_bytes == 0 || m.memory_cap_bytes < row->device_capacity_bytes);
    if (!forecast_) forecast_ = std::make_unique<PeakForecast>();
    if (const auto line = forecast_->ended(row->batch, row->peak_reserved_bytes,
                                           cap ? m.memory_cap_bytes : row->device_capacity_bytes, cap)) {
      log().warn("rank {}: {}", identity_.rank, *line);
    }
  }
  if (headroom_ && headroom_->pending()) dump_crossing_alone();
  if (const auto w = schedule_.closed_by(previous, batch)) {
    if (!await_agreement(lock)) return;
    take_snapshot(*w);
  }
}

void Session::sample_outside_allocator() {
  // At most once a second: NVML's process list can cost a millisecond a GPU, and a row's figure is then at most a
  // second old. The failing thread's freeze takes the last figure too: no NVML call on an OOM's path. One sampler at
  // a time (batch marks from two threads: the other goes on without).
  std::unique_lock sampling(sample_mutex_, std::try_to_lock);
  if (!sampling.owns_lock()) return;
  const std::int64_t now = monotonic_ns();
  if (device_memory_sampled_ns_ != 0 && now - device_memory_sampled_ns_ < 1'000'000'000) return;
  device_memory_sampled_ns_ = now;
  try {
    if (!device_memory_) {
      device_memory_ = std::make_unique<ProcessDeviceMemory>();
      if (!device_memory_->why_unknown().empty()) {
        log().debug("the memory outside the caching allocator is unknown: {}", device_memory_->why_unknown());
      }
    }
  } catch (const std::bad_alloc&) {
    return;  // unknown, as it was
  }
  const std::optional<std::uint64_t> used = device_memory_->used_bytes();
  if (!used) {
    recorder_.set_outside_allocator(-1);
    return;
  }
  std::uint64_t reserved = 0;
  for (int d = 0; d < kMaxDevices; ++d) reserved += recorder_.memory(d).reserved_bytes;
  // The driver's count includes the allocator's segments: what is left is the context, the libraries' workspaces,
  // NCCL's buffers. A sample taken while a segment was being made can put reserved ahead: then nothing is outside.
  const std::uint64_t outside = *used > reserved ? *used - reserved : 0;
  recorder_.set_outside_allocator(static_cast<std::int64_t>(std::min<std::uint64_t>(outside, INT64_MAX)));
}

bool Session::set_memory(int device, const MemoryStats& stats) noexcept {
  if (!recorder_.set_memory(device, stats)) return false;
  if (headroom_) {
    // The memory outside the allocator is the process's (one device a rank, as DDP and FSDP run): added to the
    // device's reserved where known.
    const std::int64_t outside = recorder_.outside_allocator();
    headroom_->observe(device, stats, recorder_.batch(), outside > 0 ? static_cast<std::uint64_t>(outside) : 0);
  }
  return true;
}

void Session::dump_crossing_alone() {
  // A watcher that coordinates this rank's dumps takes the crossing at its next turn (take_signals); while the ranks'
  // start-up agreement is still to come it waits for that. Otherwise no watcher will: written here, by this rank.
  if (DumpCoordinator* c = coordinator_.get(); c != nullptr && (c->coordinates() || c->agreeing())) return;
  std::optional<DumpRequest> request;
  try {
    request = headroom_->take();
  } catch (const std::exception& e) {
    log().error("the headroom dump was not written: {}", e.what());
    return;
  }
  if (!request) return;
  try {
    std::string alone;
    if (identity_.world_size > 1) alone = coordinator_ ? coordinator_->why_alone() : alone_because_;
    (void)dump_alone(*request, alone);
  } catch (const std::exception& e) {
    // Never into the job's batch mark: the crossing is said, and the job goes on.
    log().error("the headroom dump was not written: {}", e.what());
  }
}

bool Session::await_agreement(std::unique_lock<std::mutex>& batch_lock) {
  // A window that closes before the ranks' start-up agreement waits for it (within its bound), as a dump asked for
  // then does: written alone, it would be a file of this rank under its provisional run name, each rank in a run
  // folder of its own (issue 40). The agreement takes the batch lock to adopt the run name. (Over MPI the ranks
  // agree before the session exists: never agreeing.)
  DumpCoordinator* c = coordinator_.get();
  if (c == nullptr || !c->agreeing()) return true;
  batch_lock.unlock();
  c->await_agreement();
  batch_lock.lock();
  return !shut_down_;
}

void Session::take_snapshot(const SnapshotWindow& window) {
  try {
    const auto freeze = [&](std::vector<Event> storage) { return recorder_.freeze(-1, std::move(storage)); };
    if (coordinator_ && coordinator_->take_snapshot(window, freeze)) return;
    // One process, or a rank whose snapshots are not coordinated: written here, by this rank alone.
    const FrozenHistory h = recorder_.freeze(-1);
    WindowDump part = window_dump(*executor_, h, window, identity_.rank);
    std::unique_lock<std::mutex> files(files_mutex_);  // a failing thread's dump_alone may be in HDF5 meanwhile
    if (identity_.world_size > 1) {
      // One of several ranks, not coordinated with the others (its launcher numbered it, the job's store is not
      // reached or was left): its own rank-local file, named and marked as such, never an archive claiming the job.
      const std::string alone = coordinator_ ? coordinator_->why_alone() : alone_because_;
      part.header.reason += fmt::format(" (written by this rank alone, {})", alone);
      const std::string mine = executor_->write_rank_local(part.header, part.view(h), DumpKind::snapshot,
                                                           window.first, Durability::verified);
      log().info("snapshot of batches {} to {}: rank-local file {} written by this rank alone, {}", window.first,
                 window.last, mine, alone);
      return;
    }
    const std::string path = write_archive(executor_->archive_path(DumpKind::snapshot, window.first), part.header,
                                           part.view(h), Durability::verified,
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
  std::string alone;  // why a rank of several dumps alone, for its file's reason and its log line
  if (DumpCoordinator* c = view_.load(std::memory_order_acquire)) {
    if (auto r = c->request(request)) return std::move(*r);
    alone = c->why_alone();
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
  const std::string summary = dump_summary(request.kind, me, h.batch, request.requested_bytes,
                                           request.device_free_bytes, request.numbers_from_message, request.reason);
  if (request.kind == DumpKind::oom) {
    log().error("{}{}{}", summary, request.reason.empty() ? "" : ": ", request.reason);
  }
  const std::string note = alone.empty() ? "" : fmt::format(" (written by this rank alone, {})", alone);
  const ArchiveHeader header = executor_->header(
      request.kind, h.batch, fmt::format("rank {}: {}{}", identity_.rank, request.reason, note), me, me);
  // The batch thread's snapshot, or a joined rank's watcher, may be in HDF5 meanwhile.
  std::unique_lock<std::mutex> files(files_mutex_);
  DumpResult r =
      executor_->write_single_rank(header, executor_->rank_row(h, true, request), h, h.batch, &request.state);
  r.seconds = static_cast<double>(monotonic_ns() - start) / 1e9;
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
