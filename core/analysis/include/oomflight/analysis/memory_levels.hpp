// A rank's allocated and reserved bytes after each event of its recorded history: the one walk the report's charts
// (HTML) and the Perfetto counters draw from (issue 41, item 1: each wrote its own, and they differed on an
// expandable segment's unmap). The figures are the history's own sums, relative to where it began; each reader
// anchors them on the figures the archive holds (the rank's at the trigger, a batch's at its end), which also
// count what was allocated before the history began.
//
// Thread-safety: a pure function of the archive it reads.
#pragma once

#include <cstdint>
#include <vector>

#include "oomflight/api.h"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight {

/// The history's sums after one event.
struct MemoryLevel {
  std::int64_t t_ns = 0;       ///< the event's time, on the rank's monotonic clock (ns), as recorded
  std::int64_t allocated = 0;  ///< bytes allocated since the history began (below 0 after frees of older blocks)
  std::int64_t reserved = 0;   ///< bytes reserved since the history began (likewise)
};

/// One level per event of `row`'s history in `archive`, oldest first (events that change neither figure included:
/// a chart's resolution follows the history's length). An alloc adds its size; a free_completed takes away the size
/// its alloc recorded, or its own when the alloc came before the history began (PyTorch's trace gives a free its
/// size); a segment_alloc or segment_map adds its size and a segment_free or segment_unmap takes away its own (an
/// expandable segment unmaps ranges that need not be the ones it mapped). Sums saturate at the limits of int64 (a
/// damaged archive's sizes are arbitrary). Costs one pass and one hash map of the live blocks; no error.
OOMFLIGHT_API std::vector<MemoryLevel> memory_levels(const Archive& archive, const RankRow& row);

}  // namespace oomflight
