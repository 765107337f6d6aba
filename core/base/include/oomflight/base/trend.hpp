// A straight line through per-batch figures, by least squares, and the words for it (issue 42, item 2): the one fit
// and the one wording that the post-mortem (growth.hpp, the report's trends) and the running job's forecast line
// (the session, at each batch's end) use.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "oomflight/api.h"

namespace oomflight {

/// A straight line through per-batch figures (bytes), by least squares.
struct Trend {
  std::int64_t first_batch = 0;  ///< the batches it was fitted on, first and last
  std::int64_t last_batch = 0;
  std::size_t points = 0;        ///< how many batches
  double slope = 0;              ///< bytes a batch
  double residual = 0;           ///< root mean square distance of the figures from the line, bytes
  /// The figures rise: up from one batch to the next at least two times in three, and the line's rise over the
  /// batches is positive and more than twice the residual, over at least 3 batches. Anything else is no trend, not a
  /// small one (a warm-up followed by a plateau is none).
  bool rising = false;
  /// When rising and a limit was given: the batch at which the line reaches it, if that is within 100,000 batches
  /// of the last (a forecast further out says nothing a reader can act on).
  std::optional<std::int64_t> reaches_limit_at;
};

/// Fits `values` (bytes) at `batches` (the same length, ascending). nullopt with fewer than 3 points. `limit`: bytes
/// the figures must stay below (0: none).
OOMFLIGHT_API std::optional<Trend> fit_trend(std::span<const std::int64_t> batches,
                                             std::span<const double> values, std::uint64_t limit);

/// "peak reserved grows 204.80 MiB a batch over batches 0-4 (the peaks stray 72.41 MiB from the line, root mean
/// square); at this rate it reaches its 8.00 GiB capacity at batch ~6" (or "... the line is at its ... by batch 4
/// already", "... does not reach ... within 100,000 batches", "... its limit is unknown"), or "no rising trend in
/// peak reserved over ...". `limit`: the rank's limit in bytes (0: unknown); `cap`: it is a per-process cap, not
/// the device's capacity.
OOMFLIGHT_API std::string peak_trend_words(const Trend& trend, std::uint64_t limit, bool cap);

/// A trend's figure (a slope, a residual, a fitted value) as bytes: 0 below 0 (or NaN), at most the largest double
/// below 2^64.
OOMFLIGHT_API std::uint64_t trend_bytes(double value);

/// "over batches 0-4 (the live bytes stray 0 B from the line, root mean square)": the span of a trend of `what`.
OOMFLIGHT_API std::string trend_span_words(const Trend& trend, std::string_view what);

}  // namespace oomflight
