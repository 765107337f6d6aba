// The running job's forecast (issue 42, item 2): at each batch's end, the trend of this rank's per-batch peak
// reserved bytes over its last 64 ended batches (fit_trend, base/trend.hpp: the post-mortem's own fit), and one
// warning when that line reaches the rank's limit soon, in the report's words (peak_trend_words). Internal to the
// control wing.
//
// Thread-safety: none; the session calls it under its batch mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>

namespace oomflight {

class PeakForecast {
 public:
  /// How many ended batches the line is fitted on, and the least number of batches between two warnings.
  static constexpr std::size_t kWindow = 64;
  /// A warning is said when the line reaches the limit within this many batches of the last ended one: further out
  /// it would be said for hours of a healthy job's slow drift.
  static constexpr std::int64_t kHorizon = 1000;

  /// Batch `batch` ended with its own peak reserved `peak_reserved` bytes, against the rank's `limit` (0: unknown)
  /// which is its per-process cap when `cap`. Returns the line to log at warning level, or nothing: when the line
  /// rises and reaches the limit within kHorizon batches, at most once per kWindow batches.
  std::optional<std::string> ended(std::int64_t batch, std::uint64_t peak_reserved, std::uint64_t limit, bool cap);

 private:
  std::deque<std::pair<std::int64_t, double>> points_;
  std::optional<std::int64_t> last_warned_;
};

}  // namespace oomflight
