// The snapshot writer (internal to the control wing): interval snapshots handed over by the training thread and
// written by the watcher with every rank, on a communicator of their own, in window order. Two rules live here:
//
// - Bounded memory. A waiting window holds a copy of the ring (64 bytes an event). At most kMaxWaitingWindows
//   wait per rank; a window that closes while they do is not frozen at all: it waits as a placeholder. When a
//   placeholder's turn comes, the agreement says some rank has no history for it, and every rank skips it and
//   every window up to the newest one any rank had handed over when it posted the agreement (each rank's
//   backlog is then empty, so the next windows have histories on every rank again: skipping one window at a time
//   left the ranks' placeholders out of step, and almost nothing was written). Skipped windows are counted, the
//   same on every rank. Without the bound, one-batch windows shorter than a write piled up copies: 4.2 GiB per
//   rank after 1,500 batches.
// - A dump goes first. The writer asks `dump_waiting` before a write and between its collective steps; when a dump
//   is waiting (this rank's own request, a trigger from another rank, shutdown) no write starts, and a write under
//   way is abandoned: its collectives stay pending on the snapshots' communicator, so this rank writes no snapshot
//   after it. The dump's votes carry broken(): when any rank abandoned a write, every rank abandons its snapshots
//   (abandon()), so that none waits for a window the others will never write. An OOM then ends the job as fast
//   with snapshots on as without, and a SIGUSR1 dump between two writes leaves the snapshots going.
#pragma once

#include <mpi.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "dump_executor.hpp"
#include "oomflight/control/config.hpp"
#include "oomflight/control/rank_identity.hpp"
#include "oomflight/control/snapshot_schedule.hpp"
#include "oomflight/record/recorder.hpp"

namespace oomflight {

class SnapshotWriter {
 public:
  /// Windows with a frozen history that may wait per rank (beside the one being written and the storage kept for
  /// the next freeze): at most 4 ring copies in all, 4 x 64 bytes x OOMFLIGHT_MAX_ENTRIES (25.6 MB at 100,000).
  static constexpr std::size_t kMaxWaitingWindows = 2;

  /// `comm` is the snapshots' own communicator, duplicated for this writer; it is freed by close() when no
  /// collective is left pending on it. References must outlive the writer.
  SnapshotWriter(const Config& config, const RankIdentity& identity, const DumpExecutor& executor, MPI_Comm comm);

  /// Whether the training thread should freeze its history for `window`, which just closed: false when
  /// kMaxWaitingWindows already wait (the window is then handed over with queue_skipped()), when every rank has
  /// agreed to skip it already, or when no snapshot will be written any more. Thread-safe.
  bool wants_history(const SnapshotWindow& window) const;

  /// Hands over a closed window's frozen history (training thread; returns at once). Thread-safe.
  void queue(FrozenHistory history, const SnapshotWindow& window);

  /// Hands over a closed window without a history (wants_history() was false): it takes its turn, and every rank
  /// skips it. Thread-safe.
  void queue_skipped(const SnapshotWindow& window);

  /// The event storage of the last snapshot written, for the next freeze to reuse. Thread-safe.
  std::vector<Event> take_spare_events();

  /// Waits until no window waits and none is being written, or no snapshot will be written any more, at most
  /// `timeout`. Returns whether every window was dealt with (written or skipped). Thread-safe.
  bool drain(std::chrono::milliseconds timeout);

  /// The watcher's turn (watcher thread only): while windows wait, posts or tests the agreement on the front one
  /// (an MPI_Iallreduce of two int64, the minimum of "has a history" and the maximum of the newest window handed
  /// over, that completes when every rank has handed the same window over); once it completes, writes the window
  /// with every rank or skips (see above), then goes on to the next. `dump_waiting` is asked first and between the
  /// write's steps; true returns at once, or abandons a write under way. Never throws.
  void poll(const std::function<bool()>& dump_waiting);

  /// No more windows are taken; drain() waiters wake. Thread-safe.
  void stop();

  /// Frees the communicator unless a collective is pending on it (then it must stay: the collective refers to
  /// it), and says on rank 0 how many windows were skipped after the last archive. Call once the watcher has
  /// stopped.
  void close();

  /// Writes no more snapshots: waiting windows are dropped, drain() returns. Called when a write was abandoned
  /// here, or on another rank (the dump's votes say so), or a dump could not agree. Thread-safe.
  void abandon();

  /// Whether this rank writes no more snapshots (abandon()). Thread-safe.
  bool broken() const;

  /// Windows skipped so far by every rank alike (the bound above). Thread-safe.
  std::uint64_t windows_skipped() const;

 private:
  struct Waiting {
    std::optional<FrozenHistory> history;  // none: skipped on this rank (the bound)
    SnapshotWindow window;
  };
  bool write(Waiting& w, std::uint64_t skipped_before, const std::function<bool()>& dump_waiting);
  void hand_over(std::optional<FrozenHistory> history, const SnapshotWindow& window);

  const Config& config_;
  const RankIdentity& id_;
  const DumpExecutor& executor_;
  MPI_Comm comm_;

  mutable std::mutex mutex_;
  std::condition_variable idle_;    // drain() waits here
  std::deque<Waiting> waiting_;     // in window order, oldest first
  std::size_t waiting_histories_ = 0;
  bool writing_ = false;            // the watcher holds the front one
  bool stopped_ = false;
  bool broken_ = false;             // a collective was abandoned on comm_: no more snapshots
  std::vector<Event> spare_events_;
  std::uint64_t skipped_ = 0;       // windows every rank skipped, in all
  std::uint64_t skipped_unreported_ = 0;  // ... since the last archive written (it says how many)

  std::int64_t newest_handed_over_ = -1;  // the newest window index queued or queued_skipped on this rank
  std::int64_t skip_through_ = -1;        // every rank skips the windows up to this index (agreed)

  // The agreement on the front window (watcher thread only): {has a history, -newest window handed over}, reduced
  // with MPI_MIN. Its buffers are members: an abandoned MPI_Iallreduce may still complete and write into them.
  MPI_Request agreement_ = MPI_REQUEST_NULL;
  std::array<std::int64_t, 2> agreement_mine_{};
  std::array<std::int64_t, 2> agreement_all_{};
};

}  // namespace oomflight
