// The ring: a rank's bounded, wait-free event history.
//
// Writers claim an index with one atomic fetch_add and publish the record behind a per-slot sequence number
// (a seqlock per slot). A reader copies the newest max_entries records while writers keep writing and keeps
// only slots whose sequence number was stable and named the expected index before and after the copy, so it
// never returns a torn record. Nothing on the writers' path locks, allocates or makes a system call.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "oomflight/record/event.hpp"
#include "oomflight/api.h"

namespace oomflight {

/// What a reader got from Ring::copy(), oldest event first, and what it did not get.
struct RingCopy {
  std::vector<Event> events;       ///< the newest events, oldest first (at most max_entries)
  std::uint64_t recorded = 0;      ///< events ever offered to the ring (claimed indices) up to the copy
  std::uint64_t overwritten = 0;   ///< events pushed out of the window by newer ones
  std::uint64_t dropped = 0;       ///< events a writer gave up because its slot was busy (see Ring::push)
  std::uint64_t in_flight = 0;     ///< events in the window still being written during the copy (skipped)
};

/// Bounded multi-producer event buffer that overwrites the oldest events and counts them.
///
/// Thread-safety: push() may be called from any number of threads at once and is wait-free (a fetch_add, a
/// compare-exchange and seven relaxed stores). copy() may run concurrently with push() from any thread.
class OOMFLIGHT_API Ring {
 public:
  /// Keeps the newest `max_entries` events (1 .. 2^30). The slot array is the next power of two, 64 bytes a
  /// slot (so 100,000 entries take 8 MiB). Throws std::invalid_argument for a size out of range,
  /// std::bad_alloc when the slots cannot be allocated.
  explicit Ring(std::size_t max_entries);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  /// Records one event. Returns false when the event was dropped: that happens only when the writer that
  /// held the same slot one lap earlier has not finished (it was preempted for a whole lap of the ring), or a
  /// newer event already took the slot. Dropped events are counted, never silently lost.
  bool push(const Event& event) noexcept;

  /// Copies the newest max_entries events, oldest first, without stopping writers.
  /// Allocates the result (max_entries * 48 bytes at most). Thread-safe.
  RingCopy copy() const;

  /// Events offered so far (including overwritten and dropped ones). Thread-safe.
  std::uint64_t recorded() const noexcept { return head_.load(std::memory_order_relaxed); }
  /// The bound given at construction.
  std::size_t max_entries() const noexcept { return max_entries_; }

 private:
  struct alignas(64) Slot {
    std::atomic<std::uint64_t> seq{0};  // 0 empty; 2i+1 index i being written; 2i+2 index i complete
    std::atomic<std::uint64_t> words[6];
  };
  static_assert(sizeof(Slot) == 64);

  std::size_t max_entries_;
  std::uint64_t mask_;
  std::unique_ptr<Slot[]> slots_;
  alignas(64) std::atomic<std::uint64_t> head_{0};
  alignas(64) std::atomic<std::uint64_t> dropped_{0};
};

}  // namespace oomflight
