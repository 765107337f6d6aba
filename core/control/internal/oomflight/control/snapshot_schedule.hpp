// Which batches a snapshot window covers, and which batch mark closes it (Composer's MemorySnapshot semantics:
// skip `skip` batches, record `interval`, and with OOMFLIGHT_SNAPSHOT_EVERY start again every `every` batches).
#pragma once

#include <cstdint>
#include <optional>

#include "oomflight/control/config.hpp"

namespace oomflight {

/// One window: batches first .. last (inclusive); index counts windows from 0.
struct SnapshotWindow {
  std::int64_t index = 0;
  std::int64_t first = 0;
  std::int64_t last = 0;
};

/// The effective schedule of a Config. Pure; thread-safe.
class SnapshotSchedule {
 public:
  explicit SnapshotSchedule(const Config& config);

  bool enabled() const { return enabled_; }

  /// The window that ends when batch `next` starts after batch `previous` (-1: none was running): the one that
  /// holds `previous` and not `next`.
  std::optional<SnapshotWindow> closed_by(std::int64_t previous, std::int64_t next) const;

  /// The window that ends when the job shuts down normally during batch `running`: the one whose last batch it is.
  std::optional<SnapshotWindow> closed_at_end(std::int64_t running) const;

  /// The window that holds `batch`, if any.
  std::optional<SnapshotWindow> window_of(std::int64_t batch) const;

 private:
  bool enabled_ = false;
  std::int64_t skip_ = 1;
  std::int64_t interval_ = 3;
  std::int64_t every_ = 0;  // 0: one window only
};

}  // namespace oomflight
