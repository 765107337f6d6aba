// The recorder: a rank's ring, its stack table, its batch counter and its memory gauges.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>

#include "oomflight/clock.hpp"
#include "oomflight/event.hpp"
#include "oomflight/export.hpp"
#include "oomflight/ring.hpp"
#include "oomflight/stack_table.hpp"

namespace oomflight {

/// The device's memory as the source (allocator, simulator) last reported it. Bytes.
struct MemoryStats {
  std::uint64_t allocated_bytes = 0;       ///< in live blocks
  std::uint64_t reserved_bytes = 0;        ///< in segments the allocator holds (allocated + cached)
  std::uint64_t peak_allocated_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;
  std::uint64_t device_capacity_bytes = 0; ///< 0 when unknown
  std::uint64_t device_free_bytes = 0;     ///< as the driver reports it; 0 when unknown
};

/// Everything a dump needs from one rank, copied at the moment of the trigger.
struct FrozenHistory {
  RingCopy ring;
  StackTableCopy stacks;
  MemoryStats memory;
  std::int64_t batch = -1;
  std::uint64_t oom_events = 0;       ///< oom events recorded up to the freeze
  std::int64_t freeze_t_ns = 0;       ///< monotonic
  std::int64_t anchor_monotonic_ns = 0;  ///< taken back to back with anchor_realtime_ns
  std::int64_t anchor_realtime_ns = 0;
};

/// Records events into the ring. One per process.
///
/// Thread-safety: record(), mark_batch() and set_memory() are safe from any thread and lock-free (record() is
/// the ring's push plus a clock read); intern_stack() takes the stack table's mutex; freeze() may run
/// concurrently with all of them.
class OOMFLIGHT_API Recorder {
 public:
  /// Throws std::invalid_argument when max_entries is out of the ring's range.
  explicit Recorder(std::size_t max_entries);

  /// Records an event stamped now with the current batch. Returns false if the ring dropped it (see Ring::push).
  bool record(Action action, std::int16_t device, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
              std::int32_t stack_id = kNoStack) noexcept {
    if (action == Action::oom) oom_events_.fetch_add(1, std::memory_order_relaxed);
    Event e;
    e.t_ns = monotonic_ns();
    e.addr = addr;
    e.size = size;
    e.stream = stream;
    e.batch = batch_.load(std::memory_order_relaxed);
    e.stack_id = stack_id;
    e.device = device;
    e.action = action;
    return ring_.push(e);
  }

  /// Starts batch `batch` (>= 0) and records a `step` event for it.
  void mark_batch(std::int64_t batch) noexcept;

  /// The current batch, -1 before the first mark_batch().
  std::int64_t batch() const noexcept { return batch_.load(std::memory_order_relaxed); }

  /// Interns a stack (innermost frame first) for use as an event's stack_id.
  std::int32_t intern_stack(std::span<const FrameRef> frames) { return stacks_.intern(frames); }

  /// Publishes the device's memory figures (relaxed atomic stores; cheap enough to call after every event).
  void set_memory(const MemoryStats& stats) noexcept;
  MemoryStats memory() const noexcept;

  /// Number of oom events recorded so far.
  std::uint64_t oom_events() const noexcept { return oom_events_.load(std::memory_order_relaxed); }

  /// Copies the history (ring, stacks, gauges) without stopping writers. Allocates; ~1 ms per 100k events.
  FrozenHistory freeze() const;

  const Ring& ring() const noexcept { return ring_; }
  /// The stack table, for sources that intern whole batches of stacks (the snapshot decoder).
  StackTable& stacks() noexcept { return stacks_; }

 private:
  Ring ring_;
  StackTable stacks_;
  std::atomic<std::int64_t> batch_{-1};
  std::atomic<std::uint64_t> oom_events_{0};
  std::atomic<std::uint64_t> allocated_{0}, reserved_{0}, peak_allocated_{0}, peak_reserved_{0}, capacity_{0},
      free_{0};
};

}  // namespace oomflight
