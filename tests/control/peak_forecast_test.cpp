// PeakForecast: the running job's one warning when its per-batch peak reserved heads for its limit (issue 42, item
// 2). On a real replay: GrowthReport.* (the line in the job's output before its OOM).
#include "peak_forecast.hpp"

#include <gtest/gtest.h>

namespace oomflight {
namespace {

constexpr std::uint64_t MiB = 1ull << 20;

TEST(PeakForecast, ALineThatReachesTheLimitSoonIsSaidOnceAWindow) {
  PeakForecast f;
  EXPECT_FALSE(f.ended(0, 100 * MiB, 1000 * MiB, false));
  EXPECT_FALSE(f.ended(1, 200 * MiB, 1000 * MiB, false));  // two points: no line yet
  const auto line = f.ended(2, 300 * MiB, 1000 * MiB, false);
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(*line, "peak reserved grows 100.00 MiB a batch over batches 0-2 (the peaks stray 0 B from the line, root "
                   "mean square); at this rate it reaches its 1000.00 MiB capacity at batch ~9");
  for (std::int64_t b = 3; b < 66; ++b) {
    EXPECT_FALSE(f.ended(b, static_cast<std::uint64_t>(b + 1) * 10 * MiB, 100000 * MiB, false)) << b;
  }
  EXPECT_TRUE(f.ended(66, 670 * MiB, 1000 * MiB, true).has_value());  // a window later, said again (it still rises)
}

TEST(PeakForecast, NoLimitAFlatSeriesOrAFarLimitSaysNothing) {
  PeakForecast unknown, flat, far;
  for (std::int64_t b = 0; b < 10; ++b) {
    EXPECT_FALSE(unknown.ended(b, static_cast<std::uint64_t>(b) * 100 * MiB, 0, false));
    EXPECT_FALSE(flat.ended(b, (b % 2 ? 510 : 500) * MiB, 600 * MiB, false));
    // A MiB a batch from 1 GiB towards 80 GiB: 80,000 batches away, past the 1,000-batch horizon.
    EXPECT_FALSE(far.ended(b, (1024 + static_cast<std::uint64_t>(b)) * MiB, 80ull << 30, false));
  }
}

TEST(PeakForecast, AWarmUpThenAPlateauIsNoTrend) {
  // A healthy job: a first batch at half its peak, then the optimizer's state, then the same peak every batch. A line
  // through it rises, and would reach 80 GiB within batches; but the peaks rose once, not batch after batch.
  PeakForecast f;
  for (std::int64_t b = 0; b < 70; ++b) {
    EXPECT_FALSE(f.ended(b, (b == 0 ? 35ull : 70ull) << 30, 80ull << 30, false)) << b;
  }
}

TEST(PeakForecast, BatchesNumberedAnewStartAFreshLine) {
  PeakForecast f;
  (void)f.ended(10, 900 * MiB, 1000 * MiB, false);
  (void)f.ended(11, 950 * MiB, 1000 * MiB, false);
  // The job starts counting from 0 again (a new epoch numbered from 0): the old points are not on its line.
  EXPECT_FALSE(f.ended(0, 100 * MiB, 1000 * MiB, false));
  EXPECT_FALSE(f.ended(1, 100 * MiB, 1000 * MiB, false));
  EXPECT_FALSE(f.ended(2, 100 * MiB, 1000 * MiB, false));
}

}  // namespace
}  // namespace oomflight
