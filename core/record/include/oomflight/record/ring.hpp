// The ring: a rank's bounded, wait-free event history that several threads write at once.
//
// Why chunks: one shared claim counter made two threads that really run at once record 7 - 8 times slower per
// event than one (both cores fought over the counter's cache line and over neighbouring slots). Now each writing
// thread owns a "writer" of the ring and claims 64 consecutive slots at a time from the shared counter (one atomic
// add per 64 events); within its chunk it writes slots no other thread touches. Each slot is still a seqlock, so
// a reader copies the ring while writers keep writing and never returns a torn record.
//
// Why the counts stay exact: every writer counts its own pushes (`pushed`, stored with release after the slot
// is complete) and tags each slot with (writer, ordinal). A copy first reads every writer's count, then keeps
// exactly the slots whose ordinal is below their writer's count: those are the events recorded up to the copy,
// and every one of them is either still in a slot (kept) or was overwritten by a newer lap. So
// recorded = kept + overwritten + dropped, with no estimate. Chunks make the slot order differ from time order
// across threads: the copy sorts by stamp (each thread's stamps never decrease), so the history is one time line.
#pragma once

#include <array>
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
  std::vector<Event> events;       ///< the newest events by stamp, oldest first (at most max_entries)
  std::uint64_t recorded = 0;      ///< events offered to the ring up to the copy (kept + overwritten + dropped)
  std::uint64_t overwritten = 0;   ///< events pushed out of the bound by newer ones
  std::uint64_t dropped = 0;       ///< events refused because more than Ring::kMaxWriters threads wrote at once
  std::uint64_t in_flight = 0;     ///< always 0 for this ring (an event counts only once complete); kept because
                                   ///< schema v1 archives have the column ("unreadable")
};

/// Bounded multi-producer event buffer that overwrites the oldest events and counts them.
///
/// Thread-safety: push() may be called from any number of threads at once. It is lock-free (it tries another
/// slot only when an older lap's writer is still in one, or when other writers lapped its unfinished chunk: in
/// practice never) and neither locks nor allocates after a thread's first push to this ring, which takes a
/// mutex once. copy() may run concurrently with push() from any thread.
class OOMFLIGHT_API Ring {
 public:
  /// Threads that may own a writer of one ring at the same time. A thread owns a writer from its first push
  /// until it exits; an exited thread's writer (and its unfinished chunk) goes to the next new thread. Pushes
  /// from a thread beyond this many live writing threads are dropped and counted.
  static constexpr std::size_t kMaxWriters = 64;
  /// Slots a writer claims at a time.
  static constexpr std::size_t kChunk = 64;
  static_assert(kMaxWriters <= 256, "writer hints are bytes");

  /// Keeps the newest `max_entries` events (1 .. 2^30). The slot array is the next power of two at least
  /// max_entries + kMaxWriters * kChunk (room for the writers' unfinished chunks), 64 bytes a slot: 100,000
  /// entries take 8 MiB. Throws std::invalid_argument for a size out of range, std::bad_alloc when the slots
  /// cannot be allocated.
  explicit Ring(std::size_t max_entries);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  /// Records one event. `event.t_ns` is its stamp: copy() orders by it, so one thread's stamps must not
  /// decrease. Returns false, and counts the event as dropped, only when the calling thread could not get a
  /// writer (kMaxWriters other threads own them) or, on a thread's first push, when its writer cannot be
  /// registered for release at thread exit (out of memory).
  bool push(const Event& event) noexcept;

  /// Copies the newest max_entries events by stamp, oldest first, without stopping writers. Events with equal
  /// stamps keep their slot order. The result's events are built in `storage` (its contents are dropped, its
  /// capacity kept): a caller that copies again and again passes the previous copy's vector back, and its pages
  /// are already mapped (a fresh 6 MB vector's first-touch page faults were most of a freeze). Allocates what
  /// `storage` lacks (about 48 bytes per slot); throws std::bad_alloc. Thread-safe.
  RingCopy copy(std::vector<Event> storage = {}) const;

  /// Events offered so far (pushed, including overwritten and dropped ones). Reads every writer's count.
  /// Thread-safe.
  std::uint64_t recorded() const noexcept;
  /// alloc and free_completed events pushed so far (overwritten ones included, dropped ones not): what the
  /// per-batch figures count. Each writer counts its own; this sums them. Thread-safe.
  struct ActionCounts {
    std::uint64_t allocs = 0;
    std::uint64_t frees = 0;
  };
  ActionCounts action_counts() const noexcept;
  /// The bound given at construction.
  std::size_t max_entries() const noexcept { return max_entries_; }
  /// Slots in the array (a power of two; see the constructor).
  std::size_t slot_count() const noexcept { return static_cast<std::size_t>(mask_ + 1); }

  struct Writer;  // one thread's claim state and counts; defined in ring.cpp

 private:
  struct alignas(64) Slot {
    std::atomic<std::uint64_t> seq{0};  // 0 empty; 2i+1 index i being written; 2i+2 index i complete
    std::atomic<std::uint64_t> words[6];
    std::atomic<std::uint64_t> tag{0};  // writer << 48 | the writer's ordinal of this event
  };
  static_assert(sizeof(Slot) == 64);

  Writer* writer_for_this_thread() noexcept;
  Writer* acquire_writer() noexcept;

  std::size_t max_entries_;
  std::uint64_t mask_;
  std::uint64_t serial_;  // unique per ring ever built: exiting threads give writers back only to live rings
  std::unique_ptr<Slot[]> slots_;
  std::unique_ptr<Writer[]> writers_;
  std::array<std::atomic<std::uint8_t>, 256> hints_{};  // by a hash of the thread: the writer it owns, likely
  alignas(64) std::atomic<std::uint64_t> next_chunk_{0};
  alignas(64) std::atomic<std::uint64_t> writers_used_{0};  // high-water mark of writers ever owned
  std::atomic<std::uint64_t> dropped_{0};
};

}  // namespace oomflight
