// Snapshot windows (snapshot_schedule.hpp).
#include "oomflight/control/snapshot_schedule.hpp"

namespace oomflight {

SnapshotSchedule::SnapshotSchedule(const Config& config) : enabled_(config.snapshots()) {
  if (config.skip_batches) skip_ = *config.skip_batches;
  if (config.snapshot_every_batches) every_ = *config.snapshot_every_batches;
  // Composer's default interval is 3 batches; a repeating schedule without one covers every batch.
  if (config.interval_batches) {
    interval_ = *config.interval_batches;
  } else if (every_ > 0) {
    interval_ = every_;
  }
}

std::optional<SnapshotWindow> SnapshotSchedule::window_of(std::int64_t batch) const {
  if (!enabled_ || batch < skip_) return std::nullopt;
  const std::int64_t index = every_ > 0 ? (batch - skip_) / every_ : 0;
  const std::int64_t first = skip_ + index * every_;
  if (batch > first + interval_ - 1) return std::nullopt;
  return SnapshotWindow{index, first, first + interval_ - 1};
}

std::optional<SnapshotWindow> SnapshotSchedule::closed_by(std::int64_t previous, std::int64_t next) const {
  const auto w = window_of(previous);
  if (!w || next <= w->last) return std::nullopt;
  return w;
}

std::optional<SnapshotWindow> SnapshotSchedule::closed_at_end(std::int64_t running) const {
  const auto w = window_of(running);
  if (!w || running != w->last) return std::nullopt;
  return w;
}

}  // namespace oomflight
