// A model of PyTorch's CUDA caching allocator (issue 41): the policy that decides at which address an allocation
// lands and when a new segment is asked of the driver, replayed over a snapshot's trace. Its facts come from torch
// 2.11's c10/cuda/CUDACachingAllocator.cpp (the functions named at each rule in allocator_model.cpp); its code is
// ours. What it does not model yet is in docs/allocator-model.md.
//
// The model takes what the driver decides from the trace (a segment's address: cudaMalloc's answer) and decides
// the rest itself (which cached block an allocation takes, where it is split, which blocks coalesce, how large a
// segment the allocator asks for), so replaying a recorded trace measures the model: every allocation at the
// recorded address and every segment of the recorded size, in the recorded order, is the target.
//
// Thread-safety: none of its own; an AllocatorModel is used by one thread. Pure: no I/O, no log.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "oomflight/analysis/cache_figures.hpp"
#include "oomflight/api.h"
#include "oomflight/format/torch_snapshot.hpp"

namespace oomflight {

/// The allocator's settings that change its decisions (PYTORCH_CUDA_ALLOC_CONF as a snapshot's
/// `allocator_settings` records them). Bytes.
struct AllocatorSettings {
  /// max_split_size_mb in bytes: blocks this large or larger are not split, and a request below it does not take
  /// one. torch's default, "unlimited", is the largest size_t.
  std::uint64_t max_split_size = UINT64_MAX;
  /// roundup_power2_divisions per size interval: [0] for sizes below 2 MiB, [k] for [2^k MiB, 2^(k+1) MiB), the last
  /// for everything above. 0 or 1: no power-of-two rounding (round to 512 B).
  std::vector<std::uint64_t> roundup_power2_divisions = std::vector<std::uint64_t>(16, 0);
  /// Segments that grow and shrink by pages (AllocatorModel::expand); replay_fidelity does not judge traces
  /// recorded with them yet.
  bool expandable_segments = false;
  double garbage_collection_threshold = 0.0;
};

/// The settings a snapshot records (`allocator_settings`, PyTorch 2.1 on); torch's defaults for a snapshot without
/// them. Throws SnapshotError naming a setting whose value does not read.
OOMFLIGHT_API AllocatorSettings allocator_settings_of(const TorchSnapshot& snapshot);

/// `settings` as a snapshot's `allocator_settings` gives them, key by key (max_split_size in bytes or -1,
/// expandable_segments True or False, roundup_power2_divisions as its dict of the 16 intervals,
/// garbage_collection_threshold): what allocator_settings_of() reads back. For a run that records the settings it
/// ran under (`oomflight replay --alloc-conf`).
OOMFLIGHT_API std::vector<std::pair<std::string, std::string>> allocator_settings_entries(
    const AllocatorSettings& settings);

/// A segment the model reserved or gave back, as a trace would record it (segment_alloc or segment_free). Bytes.
struct SegmentChange {
  Action action = Action::segment_alloc;
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
};

/// The caching allocator's decisions for one device: pools of cached blocks per stream, best fit, splits and
/// coalescing. Addresses and sizes in bytes.
class OOMFLIGHT_API AllocatorModel {
 public:
  explicit AllocatorModel(AllocatorSettings settings = {});

  /// The block size torch gives a request of `size` bytes (round_size): at least 512 B, a multiple of 512 B, or the
  /// next of roundup_power2_divisions' steps.
  std::uint64_t round_size(std::uint64_t size) const;

  /// Whether a block of `rounded` bytes comes from the small pool (<= 1 MiB) rather than the large one.
  static bool small_pool(std::uint64_t rounded);

  /// The segment torch asks the driver for when no cached block fits a block of `rounded` bytes
  /// (get_allocation_size): 2 MiB for the small pool, 20 MiB below 10 MiB, else a multiple of 2 MiB.
  static std::uint64_t segment_size(std::uint64_t rounded);

  /// Where an allocation of `size` bytes (as a trace's alloc gives it) on `stream` goes: the address of the cached
  /// block it takes, or nullopt when none fits (a new segment of segment_size(round_size(size)) is needed).
  std::optional<std::uint64_t> place(std::uint64_t size, std::uint64_t stream) const;

  /// The allocation at `address` (place()'s answer, or the address a trace recorded when the model disagrees):
  /// takes the free block that starts there and splits off the rest where torch would. Returns false when no free
  /// block starts at `address` on that stream's pool (the model's state and the trace disagree).
  bool allocate(std::uint64_t address, std::uint64_t size, std::uint64_t stream);

  /// A new segment of `size` bytes at `address` for `stream`, in the pool a block of `rounded` bytes uses.
  void add_segment(std::uint64_t address, std::uint64_t size, std::uint64_t stream, bool small);

  /// free_completed: the block at `address` is free again and merges with free neighbours of its segment. Returns
  /// false when no allocated block starts there.
  bool free(std::uint64_t address);

  /// segment_free: the driver gets the segment at `address` back. Returns false when there is none, or when a block
  /// of it is still allocated.
  bool release_segment(std::uint64_t address);

  /// A block allocated before the trace began (the state walked back from the snapshot's end): `block_size` bytes at
  /// `address`, inside a segment added first.
  bool restore_allocated(std::uint64_t address, std::uint64_t block_size);

  /// The bytes of the block that starts at `address` (allocated or free), 0 when none does.
  std::uint64_t block_size(std::uint64_t address) const;

  /// Whether a segment holds `address`.
  bool holds(std::uint64_t address) const;

  /// release_cached_blocks(): every segment that is one free block goes back to the driver (the retry path of a
  /// failed cudaMalloc, and empty_cache()), and every page of an expandable segment that lies wholly in a free
  /// block is unmapped. Returns the bytes released; appends each segment given back to `released` (by address; not
  /// the pages). O(blocks).
  std::uint64_t release_free_segments(std::vector<SegmentChange>* released = nullptr);

  /// release_available_cached_blocks(): the first step of the retry path of a failed cudaMalloc, with
  /// max_split_size (without it, or for a small-pool request, it does nothing and says so). Of the large pool's free
  /// blocks on `stream`, the
  /// smallest oversize one (at or above max_split_size) of at least `rounded` bytes (or max_split_size, when that is
  /// more) goes back to the driver; where none is that large, the oversize ones do, largest first, until as many bytes
  /// are back (and those released stay released even when they fall short). An oversize block is a whole segment
  /// (such blocks are never split). Returns whether it released enough; adds the bytes to `released_bytes` and each
  /// segment to `released`. Blocks of expandable segments are not released here.
  bool release_available_cached_blocks(std::uint64_t rounded, std::uint64_t stream, std::uint64_t& released_bytes,
                                       std::vector<SegmentChange>* released = nullptr);

  /// What expand() maps, or would: the address of the free block it leaves for the request, and the bytes of pages
  /// it maps for it.
  struct Expansion {
    std::optional<std::uint64_t> address;  ///< nullopt: the pages would take reserved past the capacity
    std::uint64_t mapped = 0;              ///< bytes of pages mapped (or that would be)
  };

  /// expandable_segments (try_allocate_expandable_block): the request's (stream, pool) has one segment of address
  /// space (made at its first use), mapped by pages of 2 MiB (small pool) or 20 MiB (large). The lowest unmapped
  /// range that, with the free block before it and the free or unmapped ones after, holds round_size(size) is
  /// mapped, page by page, as far as the request needs, and merges with its free neighbours into one free block
  /// (after 64 ranges tried, the segment's unmapped end: a bound torch does not have, so that any history replays
  /// in near-linear time).
  /// Nothing changes when the pages would take reserved past `capacity` (0: no limit). Only with
  /// settings.expandable_segments.
  Expansion expand(std::uint64_t size, std::uint64_t stream, std::uint64_t capacity);

  /// One pool's figures now (cache_figures.hpp's PoolFigures: reserved, free, free blocks, the largest). O(blocks).
  PoolFigures pool_figures(bool small) const;

  /// Bytes in segments (reserved) and in allocated blocks.
  std::uint64_t reserved_bytes() const { return reserved_; }
  std::uint64_t allocated_bytes() const { return allocated_; }

 private:
  struct Block {
    std::uint64_t size = 0;
    std::uint64_t stream = 0;
    std::uint64_t segment = 0;  // the segment's address
    bool small = false;
    bool allocated = false;
    bool mapped = true;       // false: address space of an expandable segment with no page behind it
    bool expandable = false;  // in an expandable segment
  };
  struct ExpandableSegment {
    std::uint64_t size = 0;  // address space
    std::uint64_t page = 0;
    std::uint64_t mapped = 0;
    bool small = false;
  };
  struct FreeKey {  // torch's BlockComparatorSize: stream, then size, then address
    std::uint64_t stream, size, address;
    bool operator<(const FreeKey& o) const;
  };
  void insert_free(std::uint64_t address);
  void erase_free(std::uint64_t address);

  AllocatorSettings settings_;
  std::map<std::uint64_t, Block> blocks_;                // every block of every segment, by address
  std::map<std::uint64_t, std::uint64_t> segments_;      // address -> size
  std::map<FreeKey, std::uint64_t> free_small_, free_large_;  // the pools' free blocks -> address
  std::uint64_t reserved_ = 0, allocated_ = 0;
  std::map<std::uint64_t, ExpandableSegment> expandable_;                   // base address -> segment
  std::map<std::pair<std::uint64_t, bool>, std::uint64_t> expandable_of_;  // (stream, small) -> base address
  std::set<std::uint64_t> unmapped_;                                        // unmapped blocks, by address
  std::uint64_t next_expandable_base_ = 1ull << 56;
  void merge_unmapped(std::uint64_t address);
  // The free block at `start` becomes [start, lo) free, `middle` over [lo, hi), [hi, its end) free.
  void cut_free_block(std::uint64_t start, std::uint64_t lo, std::uint64_t hi, Block middle);
  std::uint64_t unmap_free_pages();
};

/// How closely the model follows a recorded trace (`oomflight whatif --fidelity`).
struct AllocatorFidelity {
  std::size_t allocations = 0;           ///< alloc entries replayed
  std::size_t allocations_matched = 0;   ///< ... at the address the model chose
  /// alloc entries in no segment the trace or its end state holds (a history whose segment_alloc the ring had
  /// overwritten and whose end state is not recorded, or a trace that is not the allocator's): not judged, and not
  /// among `allocations`.
  std::size_t allocations_outside_segments = 0;
  std::size_t segment_events = 0;        ///< segment_alloc and segment_free entries
  std::size_t segment_events_matched = 0;  ///< ... the model asked for (the size it needed) or allowed (all free)
  std::string first_difference;          ///< the first entry where model and trace part, and why; empty when none
  bool expandable = false;               ///< the snapshot's segments are expandable: not modelled yet
};

/// Replays `snapshot`'s trace of `device` through the model with `settings`, starting from the state walked back
/// from the snapshot's end (snapshot_start_state), and counts where the model chose as the allocator did. Where they
/// part, the model follows the trace (its address, its segment) and goes on, so one difference is counted once.
/// `made_up_segments`: addresses of end-state segments that are not the allocator's (an export gave blocks whose
/// segment the history lacks one of their own: MemoryVizNotes::made_up_segments); allocations in them are not
/// judged. Pure.
OOMFLIGHT_API AllocatorFidelity replay_fidelity(const TorchSnapshot& snapshot, int device,
                                                const AllocatorSettings& settings,
                                                const std::set<std::uint64_t>& made_up_segments = {});

}  // namespace oomflight
