// A trace's allocations replayed through the allocator model (issue 41, items 3 and 5): the one replay that
// `oomflight whatif` (replay_what_if) and the simulated device of `oomflight replay --alloc-conf` (plugins/sim) both
// drive. It takes from a trace only what the program did (each allocation's size and stream, each free, each
// empty_cache()); where blocks go, which segments are reserved and what the retry path of a failed cudaMalloc
// releases are the model's (allocator_model.hpp). Sources: torch 2.11's c10/cuda/CUDACachingAllocator.cpp
// (malloc: get_free_block, then alloc_block, then release_cached_blocks and alloc_block again); docs/allocator-model.md.
//
// Thread-safety: none; one replaying thread per object.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "oomflight/analysis/allocator_model.hpp"
#include "oomflight/api.h"
#include "oomflight/format/torch_snapshot.hpp"

namespace oomflight {

/// What AllocatorReplay::allocate() did.
struct ModelledAllocation {
  std::optional<std::uint64_t> address;  ///< the block the model gave; nullopt: it did not fit the capacity
  std::uint64_t block_size = 0;          ///< the block's bytes (what it counts in allocated)
  std::uint64_t needed = 0;              ///< when it failed: the segment it needed (the pages, with `pages`)
  bool pages = false;                    ///< ... `needed` is pages of an expandable segment
  std::uint64_t released = 0;            ///< bytes its retry path gave back (release_cached_blocks)
};

class OOMFLIGHT_API AllocatorReplay {
 public:
  /// The model under `settings`, holding `start` (the segments and blocks that predate `trace`, at their recorded
  /// places: snapshot_start_state), with its own new segments above every address `trace` records (or 2^60, for a
  /// damaged file's). `capacity`: bytes of segments the device allows; 0, no limit.
  AllocatorReplay(const SnapshotStartState& start, const std::vector<TraceEntry>& trace,
                  const AllocatorSettings& settings, std::uint64_t capacity);

  /// An allocation of `size` bytes on `stream`: the cached block the model chooses, else a new segment of the
  /// model's size (with expandable_segments, pages of the stream's expandable segment); where that would take
  /// reserved past the capacity, the retry path first gives back every wholly free segment and free page, then
  /// tries once more. `recorded`: the address the trace gave it, so that its free finds it (nullopt: never freed,
  /// as for a request that failed in the recorded run). Appends to `changes` the segments reserved and given back,
  /// in order (not the pages of expandable segments). A request over 16 TiB (a damaged file) is not replayed:
  /// returns it failed with `needed` 0.
  ModelledAllocation allocate(std::uint64_t size, std::uint64_t stream, std::optional<std::uint64_t> recorded,
                              std::vector<SegmentChange>* changes = nullptr);

  /// free_completed of the block the trace recorded at `recorded`: frees the model's block, and returns its address
  /// there (nullopt: the model holds no block of that record).
  std::optional<std::uint64_t> free(std::uint64_t recorded);

  /// The model's address of the live block the trace recorded at `recorded` (nullopt: none).
  std::optional<std::uint64_t> address_of(std::uint64_t recorded) const;

  /// empty_cache(): every wholly free segment and free page goes back. Returns the bytes; appends the segments to
  /// `changes`.
  std::uint64_t empty_cache(std::vector<SegmentChange>* changes = nullptr);

  /// The live blocks: the trace's address of each -> the model's.
  const std::unordered_map<std::uint64_t, std::uint64_t>& live() const { return placed_; }

  const AllocatorModel& model() const { return model_; }
  std::uint64_t capacity() const { return capacity_; }
  /// From now on (bytes; 0: no limit), as when another process takes memory on the GPU.
  void set_capacity(std::uint64_t capacity) { capacity_ = capacity; }

 private:
  std::uint64_t release(std::vector<SegmentChange>* changes);

  AllocatorSettings settings_;
  AllocatorModel model_;
  std::uint64_t capacity_;
  std::uint64_t next_address_ = 0;
  std::unordered_map<std::uint64_t, std::uint64_t> placed_;  // recorded address -> the model's
};

/// A run of segment_free entries in a trace.
struct SegmentFreeBurst {
  std::size_t end = 0;      ///< the index after its last entry
  bool retry_path = false;  ///< followed by a segment_alloc or an oom entry: the recorded allocator's answer to its
                            ///< own pressure (release_cached_blocks), which a replay through the model does not
                            ///< repeat (the model has its own); otherwise the program's empty_cache(), which it does
};

/// The burst of segment_free entries of `trace` that starts at `i` (trace[i] is one).
OOMFLIGHT_API SegmentFreeBurst segment_free_burst(const std::vector<TraceEntry>& trace, std::size_t i);

}  // namespace oomflight
