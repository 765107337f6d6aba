// The per-batch figures of one rank: a bounded table, one row per batch, that outlives the event ring by far
// (a ring of 100,000 events holds seconds of a training step; 10,000 batch rows hold hours of training), so that
// any archive shows how a rank's memory grew batch after batch up to the dump.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "oomflight/api.h"

namespace oomflight {

/// One batch of one rank. Bytes; times are CLOCK_MONOTONIC ns. "Allocated" and "reserved" as PyTorch defines
/// them; the peaks are the batch's own (reset when the batch starts, as KempnerForge's DeviceMemoryMonitor resets
/// torch's peak every interval), taken over the figures the source published during the batch
/// (Recorder::set_memory), so they are exact when the source publishes after every allocation, as oomflight's
/// PyTorch tracker and the simulator do.
struct BatchStats {
  std::int64_t batch = -1;
  std::int64_t start_t_ns = 0;
  std::int64_t end_t_ns = 0;                ///< 0: the batch was still running when the table was copied
  std::int32_t device = 0;                  ///< the device whose figures these are (the current one at the end)
  std::int32_t reserved_field = 0;          ///< padding, 0
  std::uint64_t allocated_bytes = 0;        ///< at the end of the batch (or at the copy)
  std::uint64_t reserved_bytes = 0;
  std::uint64_t peak_allocated_bytes = 0;   ///< the batch's own peak
  std::uint64_t peak_reserved_bytes = 0;
  std::uint64_t device_capacity_bytes = 0;  ///< 0: unknown
  std::uint64_t device_free_bytes = 0;      ///< at the end; 0: unknown
  std::uint64_t alloc_events = 0;           ///< alloc events recorded during the batch
  std::uint64_t free_events = 0;            ///< free_completed events recorded during the batch
  std::uint64_t oom_events = 0;             ///< oom events recorded during the batch
  /// The device memory the process held outside the caching allocator at the batch's end (Recorder::
  /// set_outside_allocator); -1: unknown.
  std::int64_t outside_allocator_bytes = -1;
};

/// What BatchTable::copy() returns: the kept rows, oldest first, and how many older ones were pushed out.
struct BatchTableCopy {
  std::vector<BatchStats> rows;
  std::uint64_t overwritten = 0;  ///< rows dropped because the table holds at most max_rows
};

/// A bounded ring of batch rows. Thread-safety: every member takes the table's mutex; push() is called once per
/// batch, never on the recording hot path.
class OOMFLIGHT_API BatchTable {
 public:
  /// Keeps the newest `max_rows` rows (>= 1; throws std::invalid_argument otherwise). Memory grows with the rows
  /// kept, 112 bytes each, up to max_rows.
  explicit BatchTable(std::size_t max_rows);

  /// Appends a row, pushing out the oldest when full. Returns false (the row is counted as overwritten) only when
  /// memory for it cannot be had.
  bool push(const BatchStats& row) noexcept;

  /// The rows kept, oldest first.
  BatchTableCopy copy() const;

  std::size_t max_rows() const noexcept { return max_rows_; }

 private:
  mutable std::mutex mutex_;
  std::size_t max_rows_;
  std::vector<BatchStats> rows_;  // a ring once full: rows_[next_] is the oldest
  std::size_t next_ = 0;
  std::uint64_t overwritten_ = 0;
};

}  // namespace oomflight
