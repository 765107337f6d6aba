// The events a snapshot archive holds for one rank: the window's own, and before them the allocator state at the
// window's start that a reader needs to draw the window's memory timeline from the archive alone.
#pragma once

#include <cstdint>
#include <vector>

#include "oomflight/record/collective.hpp"
#include "oomflight/record/event.hpp"

namespace oomflight {

/// From `events` (a frozen ring, oldest first), in time order:
///   - the `alloc` of every block still live when batch `first` starts (no `free_completed` of its address
///     before), and the `segment_alloc` of every segment still reserved then (no `segment_free`): the state at
///     the window's start, as far as the ring reaches back;
///   - every event of batches first .. last.
/// Blocks allocated before the ring's oldest event are not known; the archive's per-batch row of batch first - 1
/// gives the allocated total at the window's start, so a reader sees how much is unaccounted for.
std::vector<Event> snapshot_events(const std::vector<Event>& events, std::int64_t first, std::int64_t last);

/// The collective records of batches first .. last (an operation started in the window and ended after it keeps
/// its start only, as the window saw it).
std::vector<Collective> snapshot_collectives(const std::vector<Collective>& records, std::int64_t first,
                                             std::int64_t last);

}  // namespace oomflight
