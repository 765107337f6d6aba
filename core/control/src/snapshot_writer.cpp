// The snapshot writer (snapshot_writer.hpp).
#include "snapshot_writer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <thread>

#include "oomflight/base/log.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/format/collective_writer.hpp"
#include "protocol_timing.hpp"
#include "retention.hpp"
#include "snapshot_dump.hpp"

namespace oomflight {

SnapshotWriter::SnapshotWriter(const Config& config, const RankIdentity& identity, const DumpExecutor& executor,
                               MPI_Comm comm)
    : config_(config), id_(identity), executor_(executor), comm_(comm) {}

bool SnapshotWriter::wants_history(const SnapshotWindow& window) const {
  std::lock_guard lock(mutex_);
  return !stopped_ && !broken_ && window.index > skip_through_ && waiting_histories_ < kMaxWaitingWindows;
}

void SnapshotWriter::queue(FrozenHistory history, const SnapshotWindow& window) {
  hand_over(std::move(history), window);
}

void SnapshotWriter::queue_skipped(const SnapshotWindow& window) { hand_over(std::nullopt, window); }

void SnapshotWriter::hand_over(std::optional<FrozenHistory> history, const SnapshotWindow& window) {
  std::lock_guard lock(mutex_);
  // A window every rank already agreed to skip takes no turn: no rank waits for it.
  if (stopped_ || broken_ || window.index <= skip_through_) return;
  newest_handed_over_ = std::max(newest_handed_over_, window.index);
  // Another thread's window may have taken the last place since wants_history(): then this one is a placeholder.
  if (history && waiting_histories_ >= kMaxWaitingWindows) history.reset();
  if (history) ++waiting_histories_;
  waiting_.push_back(Waiting{std::move(history), window});
}

std::vector<Event> SnapshotWriter::take_spare_events() {
  std::lock_guard lock(mutex_);
  return std::move(spare_events_);
}

bool SnapshotWriter::drain(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return idle_.wait_for(lock, timeout, [&] { return stopped_ || broken_ || (waiting_.empty() && !writing_); });
}

void SnapshotWriter::stop() {
  std::lock_guard lock(mutex_);
  stopped_ = true;
  idle_.notify_all();
}

void SnapshotWriter::close() {
  {
    std::lock_guard lock(mutex_);
    if (skipped_unreported_ > 0 && id_.rank == 0) {
      // No archive follows them to say so.
      log().info("the last {} snapshot {} skipped ({} in all in this job)", skipped_unreported_,
                 skipped_unreported_ == 1 ? "window was" : "windows were", skipped_);
    }
    skipped_unreported_ = 0;
  }
  if (comm_ != MPI_COMM_NULL && agreement_ == MPI_REQUEST_NULL && !broken_) MPI_Comm_free(&comm_);
}

std::uint64_t SnapshotWriter::windows_skipped() const {
  std::lock_guard lock(mutex_);
  return skipped_;
}

void SnapshotWriter::abandon() {
  std::lock_guard lock(mutex_);
  broken_ = true;
  for (const Waiting& w : waiting_) {
    if (w.history) --waiting_histories_;
  }
  waiting_.clear();  // nothing later will be written: drain() must not wait for them
  idle_.notify_all();
}

bool SnapshotWriter::broken() const {
  std::lock_guard lock(mutex_);
  return broken_;
}

void SnapshotWriter::poll(const std::function<bool()>& dump_waiting) {
  // A waiting dump first: its collectives are on another communicator, so a posted agreement may stay posted, but
  // no write starts (the dump's votes then say whether any rank abandoned a write, docs/protocol.md).
  while (!dump_waiting()) {
    {
      std::lock_guard lock(mutex_);
      if (waiting_.empty() || broken_) return;
      if (agreement_ == MPI_REQUEST_NULL) {
        agreement_mine_ = {waiting_.front().history ? 1 : 0, -newest_handed_over_};
      }
    }
    // The k-th agreement of every rank is about its k-th window: it completes when every rank has handed that
    // window over (windows an agreement skipped take no turn on any rank).
    if (agreement_ == MPI_REQUEST_NULL &&
        MPI_Iallreduce(agreement_mine_.data(), agreement_all_.data(), 2, MPI_INT64_T, MPI_MIN, comm_, &agreement_) !=
            MPI_SUCCESS) {
      abandon();
      log().error("snapshots: the agreement on the next window could not be posted; no more snapshots in this job");
      return;
    }
    int complete = 0;
    MPI_Test(&agreement_, &complete, MPI_STATUS_IGNORE);  // sets it back to MPI_REQUEST_NULL when complete
    if (!complete) return;
    Waiting front;
    std::uint64_t skipped_before = 0;
    {
      std::lock_guard lock(mutex_);
      front = std::move(waiting_.front());
      waiting_.pop_front();
      if (front.history) --waiting_histories_;
      if (agreement_all_[0] == 0) {
        // Some rank had no place for this window's history: every rank skips it and every window up to the newest
        // any rank had handed over, and learns so from the same agreement.
        const std::int64_t through = std::max(front.window.index, -agreement_all_[1]);
        const auto count = static_cast<std::uint64_t>(through - front.window.index + 1);
        if (skipped_ == 0 && id_.rank == 0) {
          log().warn("snapshots of batches {} on skipped ({} windows): writes were slower than the windows, and a "
                     "rank had no place for another (at most {} wait per rank, to bound their memory); the next "
                     "snapshot archive says how many were skipped",
                     front.window.first, count, kMaxWaitingWindows);
        }
        skipped_ += count;
        skipped_unreported_ += count;
        skip_through_ = through;
        if (front.history) spare_events_ = std::move(front.history->ring.events);
        while (!waiting_.empty() && waiting_.front().window.index <= through) {
          if (waiting_.front().history) --waiting_histories_;
          waiting_.pop_front();
        }
        idle_.notify_all();
        continue;
      }
      skipped_before = skipped_unreported_;
      writing_ = true;
    }
    const bool written = write(front, skipped_before, dump_waiting);
    std::lock_guard lock(mutex_);
    writing_ = false;
    if (written) skipped_unreported_ = 0;
    spare_events_ = std::move(front.history->ring.events);
    idle_.notify_all();
  }
}

bool SnapshotWriter::write(Waiting& s, std::uint64_t skipped_before, const std::function<bool()>& dump_waiting) {
  const std::int64_t start = monotonic_ns();
  const SnapshotWindow& w = s.window;
  FrozenHistory& h = *s.history;
  bool yielded = false;
  // The first rank names the archive (folder created, a unique name chosen); the path travels with its layout.
  std::string name;
  if (id_.rank == 0) {
    try {
      name = executor_.archive_path(DumpKind::snapshot, w.first);
    } catch (const std::exception& e) {
      log().error("snapshot of batches {} to {}: {}", w.first, w.last, e.what());
    }
  }
  WindowDump part = window_dump(executor_, h, w, id_.rank);
  ArchiveHeader& header = part.header;
  header.ranks_present.resize(static_cast<std::size_t>(id_.world_size));
  for (int r = 0; r < id_.world_size; ++r) header.ranks_present[static_cast<std::size_t>(r)] = r;
  header.snapshot_windows_skipped = static_cast<std::int64_t>(skipped_before);
  const std::int64_t deadline = start + to_ns(config_.dump_timeout);
  // Each step is tested, then the deadline and any waiting dump are: a step that completed is never given up.
  const CollectiveWait wait = [&](MPI_Request& step) {
    const std::int64_t since = monotonic_ns();
    for (;;) {
      int complete = 0;
      MPI_Test(&step, &complete, MPI_STATUS_IGNORE);
      if (complete) return true;
      if (dump_waiting()) {
        yielded = true;
        return false;
      }
      const std::int64_t now = monotonic_ns();
      if (now > deadline) return false;
      std::this_thread::sleep_for(poll_pause(now - since));
    }
  };
  std::string written;
  try {
    written = write_archive_collective(name, header, part.view(h), comm_, CollectiveArchive{.root = 0, .wait = wait, .step_done = {}, .stripes = config_.archive_stripes, .row_totals = {},
                                                         .naming = config_.overwrite ? Naming::replace : Naming::keep_others});
  } catch (const CollectiveTimeout& e) {
    // A step left pending on the snapshots' communicator: no later window can be agreed on. The watcher stays
    // free for dumps.
    abandon();
    if (yielded) {
      log().warn("snapshot of batches {} to {} abandoned: a dump (or the session's end) goes first; no more "
                 "snapshots in this job",
                 w.first, w.last);
    } else {
      log().error("snapshot of batches {} to {} not written: {} (OOMFLIGHT_DUMP_TIMEOUT); no more snapshots in "
                  "this job", w.first, w.last, e.what());
    }
    return false;
  } catch (const ArchiveError& e) {
    log().error("snapshot of batches {} to {} not written: {}", w.first, w.last, e.what());  // every rank alike
    return false;
  } catch (const std::exception& e) {
    // Thrown on this rank alone: the others wait for it in a collective and give up, as above.
    abandon();
    log().error("snapshot of batches {} to {} not written: {}; no more snapshots in this job", w.first, w.last,
                e.what());
    return false;
  }
  if (id_.rank == 0) {
    log().info("snapshot of batches {} to {}: archive {} written by {} {} in {}{}", w.first, w.last, written,
               id_.world_size, id_.world_size == 1 ? "rank" : "ranks", format_seconds(seconds_since(start)),
               skipped_before == 0 ? std::string()
                                   : fmt::format(" ({} earlier {} skipped: writes were slower than the windows)",
                                                 skipped_before, skipped_before == 1 ? "window" : "windows"));
    prune_archives(written, id_.run_name, id_.job_id, config_);
  }
  return true;
}

}  // namespace oomflight
