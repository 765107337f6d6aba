// One rank of an archive as a PyTorch memory snapshot: the pickle that pytorch.org/memory_viz and
// torch.cuda._memory_viz open (`oomflight export --format memory_viz`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "oomflight/api.h"
#include "oomflight/format/archive_reader.hpp"
#include "oomflight/format/torch_snapshot.hpp"

namespace oomflight {

/// What the rebuilt end state could not take from the history as it was recorded.
struct MemoryVizNotes {
  std::size_t blocks_outside_segments = 0;  ///< live blocks whose segment_alloc is not in the history: each got a
                                            ///< segment of its own (an "unknown" segment type)
  std::vector<std::pair<int, std::uint64_t>> made_up_segments;  ///< those segments: (device, address)
  std::size_t frees_of_unknown_blocks = 0;  ///< frees of blocks allocated before the history (memory_viz shows
                                            ///< them as allocated from the start, as it does for PyTorch's own)
  std::size_t events = 0;                   ///< trace entries written (step markers are not trace entries)
  std::size_t segments = 0;                 ///< segments in the end state
  std::size_t unreadable_fields = 0;        ///< a source snapshot's top-level fields (/context) that are not a
                                            ///< readable pickle (a damaged file): left out
};

/// The snapshot of one rank: `device_traces` holds every event of the rank (alloc, free_requested,
/// free_completed, segment_*, oom, snapshot) on the device it happened on, oldest first, with the frames of its
/// stack (no `frames` key for kNoStack, as PyTorch) and time_us (UTC microseconds, the rank's clock anchors
/// applied; none when the rank's source snapshot had none); events flagged kEventPredatesHistory are not trace
/// entries (they are in the end state). The rank's source snapshot's other top-level keys and left-out optional
/// keys (/context kinds snapshot_field, snapshot_layout) are given back as they were. `segments` is the
/// allocator's state at the freeze: the rank's /state_segments and /state_blocks when it has them (every field
/// as the source gave it; a segment type the source did not give follows PyTorch's sizing rule: 2 MiB and not
/// expandable is "small"), else rebuilt from the history: segments reserved and not released, their live blocks
/// (active_allocated, or active_pending_free between free_requested and free_completed; size = the request
/// rounded up to PyTorch's 512-byte block granularity, never past the next block; requested_size = the
/// request), and inactive blocks filling the rest, so that blocks tile each segment as memory_viz requires.
/// Stack ids are the archive's. Pure; thread-safe.
OOMFLIGHT_API TorchSnapshot memory_viz_snapshot(const Archive& archive, const RankRow& rank, MemoryVizNotes* notes = nullptr);

/// memory_viz_snapshot pickled (torch_snapshot_writer.hpp), frames from the archive. Pure; thread-safe.
OOMFLIGHT_API std::string render_memory_viz(const Archive& archive, const RankRow& rank, MemoryVizNotes* notes = nullptr);

}  // namespace oomflight
