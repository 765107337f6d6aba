// The collective ring: a rank's bounded history of collective and point-to-point records, beside the event ring.
//
// Why not the event ring: a record is 64 bytes (operation, communicator, sequence number, count, bytes, stream,
// peer), the event ring's slots carry 48; and collectives come at most thousands a second, not millions, so one
// shared claim counter (one atomic add per record) costs nothing next to the operation itself, where the event
// ring needs per-thread chunks. Each slot is a seqlock, as in the event ring, so a copy never returns a torn record
// while NCCL's threads keep writing.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "oomflight/api.h"
#include "oomflight/record/collective.hpp"

namespace oomflight {

/// What CollectiveRing::copy() got, oldest record first, and what it did not.
struct CollectiveRingCopy {
  std::vector<Collective> records;  ///< by stamp, oldest first
  std::uint64_t recorded = 0;       ///< records offered up to the copy
  std::uint64_t overwritten = 0;    ///< pushed out by newer records
  std::uint64_t in_flight = 0;      ///< being written during the copy (their writer was between claim and store)
};

/// Bounded multi-producer buffer of Collective records that overwrites the oldest and counts them.
/// Thread-safety: push() from any number of threads, lock-free (it never waits for another writer: a slot an older
/// lap's writer still holds is skipped), no allocation; copy() concurrently with push() from any thread.
class OOMFLIGHT_API CollectiveRing {
 public:
  /// Keeps the newest `capacity` records (1 .. 2^24, rounded up to a power of two), 128 bytes a slot.
  /// Throws std::invalid_argument for a size out of range, std::bad_alloc when the slots cannot be allocated.
  explicit CollectiveRing(std::size_t capacity);
  ~CollectiveRing();
  CollectiveRing(const CollectiveRing&) = delete;
  CollectiveRing& operator=(const CollectiveRing&) = delete;

  /// Records one record; its t_ns is its stamp (copy() orders by it). Wait-free but for the rare skipped slot.
  void push(const Collective& record) noexcept;
  /// Copies every complete record, oldest first. Allocates; throws std::bad_alloc. Thread-safe.
  CollectiveRingCopy copy() const;
  /// Records offered so far. Thread-safe.
  std::uint64_t recorded() const noexcept;
  /// Slots (the bound), a power of two.
  std::size_t capacity() const noexcept { return static_cast<std::size_t>(mask_ + 1); }

 private:
  static constexpr int kWords = 8;
  struct alignas(64) Slot {
    std::atomic<std::uint64_t> seq{0};  // 0 empty; 2i+1 index i being written; 2i+2 index i complete
    std::atomic<std::uint64_t> words[kWords];
  };
  std::uint64_t mask_;
  std::unique_ptr<Slot[]> slots_;
  alignas(64) std::atomic<std::uint64_t> next_{0};
  std::atomic<std::uint64_t> skipped_{0};  // indices claimed and given up (their slot was busy): never written
};

}  // namespace oomflight
