// Seeing the OOM coming (issue 42, items 2 and 3, in the post-mortem): the trend of each rank's per-batch peak
// reserved bytes, and when it reaches the rank's limit at that rate; and the call sites whose live bytes grew batch
// after batch through the recorded history. Both are least-squares lines over the last ended batches, stated with how
// far the figures stray from them, so that a flat or noisy series is said to be one and not given a forecast.
//
// Thread-safety: pure functions of what they read. Cost: near-linear in the history (each event is seen once; each
// call site's series is built from its own changes).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "oomflight/api.h"
#include "oomflight/base/trend.hpp"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight {

/// The trend of a rank's peak reserved bytes over its last `window` batches that ended (/batches rows with an end);
/// nullopt with fewer than 3. `limit`: the rank's cap or device capacity (0: unknown).
OOMFLIGHT_API std::optional<Trend> peak_reserved_trend(std::span<const BatchRow> batches, std::uint64_t limit,
                                                       std::size_t window = 64);

/// A call site whose live bytes grew through the recorded batches.
struct GrowingSite {
  std::int32_t stack_id = kNoStack;
  Trend trend;                  ///< of its live bytes at the end of each batch
  std::uint64_t first_bytes = 0;  ///< live at the end of the trend's first batch
  std::uint64_t last_bytes = 0;   ///< ... and of its last
};

/// The call sites (stacks) of `row`'s history in `archive` whose live bytes, at the end of each of the last `window`
/// batches the history holds whole (a later batch's event follows), never fell, rose from one batch to the next at
/// least two times in three, and rose as a trend (Trend::rising), fastest first, at most `top`. A block allocated
/// before the history began is not counted (its alloc is not there). Empty with fewer than 3 such batches.
OOMFLIGHT_API std::vector<GrowingSite> growing_call_sites(const Archive& archive, const RankRow& row, std::size_t top,
                                                          std::size_t window = 64);

}  // namespace oomflight
