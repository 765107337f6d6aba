// What-if: a recorded trace replayed through the allocator model (allocator_model.hpp) under other settings and
// another capacity (issue 41, item 3). The model decides every placement and every segment itself; the trace gives
// what the program asked for (each alloc's size and stream, each free, each empty_cache) in its order.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "oomflight/analysis/allocator_model.hpp"
#include "oomflight/analysis/cache_figures.hpp"
#include "oomflight/api.h"
#include "oomflight/format/torch_snapshot.hpp"

namespace oomflight {

/// `settings` with the options of a PYTORCH_CUDA_ALLOC_CONF text applied ("max_split_size_mb:512,
/// roundup_power2_divisions:4"; torch's syntax: comma-separated key:value). Read: max_split_size_mb (MiB, above 20
/// as torch requires), roundup_power2_divisions (a power of two, for every size; the per-interval [..] form is not
/// read), expandable_segments (True or False), and the options that do not change where memory goes (backend,
/// release_lock_on_cudamalloc, pinned_*), which are accepted and ignored. Throws std::invalid_argument naming the
/// option and what is wrong (an unknown option, a value that does not read, one not modelled yet:
/// garbage_collection_threshold).
OOMFLIGHT_API AllocatorSettings parse_alloc_conf(std::string_view text, AllocatorSettings settings = {});

/// A replay's outcome. Bytes; entries are indices into the device's trace.
struct WhatIfOutcome {
  std::size_t allocations = 0;              ///< alloc entries replayed (to the failure, if one)
  std::size_t skipped_requests = 0;         ///< alloc or oom entries over 16 TiB (a damaged file): not replayed
  std::uint64_t peak_allocated = 0;         ///< the most allocated at once (blocks at their rounded size)
  std::uint64_t peak_reserved = 0;          ///< the most in segments at once
  std::uint64_t unallocated_at_peak = 0;    ///< reserved but unallocated when allocated peaked (fragmentation)
  std::uint64_t released_by_retries = 0;    ///< segments the retry path gave back to fit the capacity
  bool fits = true;                         ///< every allocation found room within the capacity
  std::size_t failing_entry = 0;            ///< when !fits: the alloc that found none
  std::uint64_t failing_size = 0;           ///< ... its size as asked
  std::uint64_t failing_segment = 0;        ///< ... the segment it needed (the pages, with expandable segments)
  bool failing_pages = false;               ///< ... failing_segment is pages of an expandable segment
  std::uint64_t reserved_at_failure = 0;    ///< ... what the segments held then (after the retry path's release)
  PoolFigures small;                        ///< the small pool at the failure, else at the trace's end
  PoolFigures large;                        ///< the large pool, likewise
};

/// Replays `device`'s trace of `snapshot` from the state walked back from its end (snapshot_start_state: the
/// segments and blocks that predate the trace keep their recorded places) with `settings`, within `capacity` bytes
/// of segments (0: no limit). An alloc takes the cached block the model chooses, else a new segment of the model's
/// size (with expandable_segments: pages of the stream's expandable segment, AllocatorModel::expand); a segment that
/// does not fit the capacity first makes the model release every wholly free segment and unmap every free page
/// (torch's retry path: release_cached_blocks), and fails if it still does not fit: the replay stops there. A free_completed
/// frees the block the model placed; a burst of segment_free that the program asked for (empty_cache: one not
/// followed by a segment_alloc or an oom entry) releases every wholly free segment of the model's, while one that
/// is the recorded allocator's retry path is not replayed (the model has its own); the recorded segment_alloc
/// entries are the recorded allocator's decisions and are not replayed either; an oom entry is its failed request,
/// asked again. Pure.
OOMFLIGHT_API WhatIfOutcome replay_what_if(const TorchSnapshot& snapshot, int device, const AllocatorSettings& settings,
                                           std::uint64_t capacity);

/// The memory the recorded allocator could have had at its first oom entry: the bytes in its segments then (the
/// start state's, plus segment_alloc, minus segment_free) and the device's free bytes the entry records (torch keeps
/// them in the entry's address). nullopt without an oom entry. Pure.
OOMFLIGHT_API std::optional<std::uint64_t> capacity_at_oom(const TorchSnapshot& snapshot, int device);

}  // namespace oomflight
