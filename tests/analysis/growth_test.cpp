// growth.hpp: the trend of a rank's per-batch peaks and the call sites that grow (issue 42, items 2 and 3). The
// report's lines on a real replay are in ReplayLeak.* (the CLI).
#include "oomflight/analysis/growth.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace oomflight {
namespace {

constexpr std::uint64_t MiB = 1ull << 20;

TEST(Growth, AStraightLineIsRisingAndReachesTheLimitWhereItCrossesIt) {
  const std::vector<std::int64_t> x = {10, 11, 12, 13, 14};
  const std::vector<double> y = {100, 110, 120, 130, 140};
  const auto t = fit_trend(x, y, 200);
  ASSERT_TRUE(t.has_value());
  EXPECT_DOUBLE_EQ(t->slope, 10);
  EXPECT_NEAR(t->residual, 0, 1e-9);
  EXPECT_TRUE(t->rising);
  EXPECT_EQ(t->first_batch, 10);
  EXPECT_EQ(t->last_batch, 14);
  EXPECT_EQ(t->points, 5u);
  ASSERT_TRUE(t->reaches_limit_at.has_value());
  EXPECT_EQ(*t->reaches_limit_at, 20);  // 140 at batch 14, 10 a batch: 200 at 20
}

TEST(Growth, NoiseAroundAFlatLineIsNoTrendAndGetsNoForecast) {
  const std::vector<std::int64_t> x = {0, 1, 2, 3, 4, 5};
  const std::vector<double> y = {100, 130, 100, 130, 100, 131};
  const auto t = fit_trend(x, y, 200);
  ASSERT_TRUE(t.has_value());
  EXPECT_GT(t->slope, 0);  // a little, by chance
  EXPECT_FALSE(t->rising);
  EXPECT_FALSE(t->reaches_limit_at.has_value());
  EXPECT_GT(t->residual, 10);
}

TEST(Growth, TwoPointsAreNoLineAndAFarLimitIsNoForecast) {
  const std::vector<std::int64_t> two = {0, 1};
  const std::vector<double> v = {1, 2};
  EXPECT_FALSE(fit_trend(two, v, 0).has_value());
  const std::vector<std::int64_t> x = {0, 1, 2};
  const std::vector<double> y = {0, 1, 2};  // a byte a batch
  const auto t = fit_trend(x, y, 1ull << 30);
  ASSERT_TRUE(t.has_value());
  EXPECT_TRUE(t->rising);
  EXPECT_FALSE(t->reaches_limit_at.has_value());  // a billion batches away: past the 100,000-batch horizon
}

TEST(Growth, ThePeakTrendIsFittedOnEndedBatchesOnly) {
  std::vector<BatchRow> rows;
  for (int b = 0; b < 5; ++b) {
    BatchRow r;
    r.batch = b;
    r.end_t_ns = b < 4 ? 1000 + b : 0;  // batch 4 still running at the freeze: its peak is partial
    r.peak_reserved_bytes = b < 4 ? (1 + b) * 100 * MiB : 1 * MiB;
    rows.push_back(r);
  }
  const auto t = peak_reserved_trend(rows, 1000 * MiB);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->last_batch, 3);
  EXPECT_DOUBLE_EQ(t->slope, 100.0 * MiB);
  ASSERT_TRUE(t->reaches_limit_at.has_value());
  EXPECT_EQ(*t->reaches_limit_at, 9);  // 400 MiB at batch 3, 100 MiB a batch
}

Event ev(std::int64_t batch, Action action, std::uint64_t addr, std::uint64_t size, std::int32_t stack) {
  Event e;
  e.batch = batch;
  e.action = action;
  e.addr = addr;
  e.size = size;
  e.stack_id = stack;
  return e;
}

TEST(Growth, OnlyASiteThatGrowsBatchAfterBatchIsNamed) {
  // Batches 0 to 6 (6 is still running at the freeze): stack 7 keeps 1 MiB a batch; stack 8 allocates and frees
  // 4 MiB each batch; stack 9 holds 64 MiB from batch 1 on (a jump, not growth); stack 10 grows, then falls.
  std::vector<Event> events;
  std::uint64_t addr = 0x1000;
  for (std::int64_t b = 0; b <= 6; ++b) {
    events.push_back(ev(b, Action::alloc, addr++, MiB, 7));
    events.push_back(ev(b, Action::alloc, 0x900000, 4 * MiB, 8));
    events.push_back(ev(b, Action::free_completed, 0x900000, 4 * MiB, 8));
    if (b == 1) events.push_back(ev(b, Action::alloc, 0x800000, 64 * MiB, 9));
    if (b < 4) events.push_back(ev(b, Action::alloc, 0x700000 + static_cast<std::uint64_t>(b), 2 * MiB, 10));
    if (b == 4) events.push_back(ev(b, Action::free_completed, 0x700000, 2 * MiB, 10));
  }
  Archive a;
  RankRow row;
  row.event_count = events.size();
  a.ranks.push_back(row);
  a.events = events;
  const auto sites = growing_call_sites(a, a.ranks[0], 10);
  ASSERT_EQ(sites.size(), 1u);
  EXPECT_EQ(sites[0].stack_id, 7);
  EXPECT_DOUBLE_EQ(sites[0].trend.slope, 1.0 * MiB);
  EXPECT_EQ(sites[0].trend.first_batch, 0);
  EXPECT_EQ(sites[0].trend.last_batch, 5);  // batch 6 is not whole
  EXPECT_EQ(sites[0].first_bytes, 1 * MiB);
  EXPECT_EQ(sites[0].last_bytes, 6 * MiB);
}

TEST(Growth, AHistoryOfFewerThanThreeWholeBatchesNamesNoSite) {
  std::vector<Event> events = {ev(0, Action::alloc, 1, MiB, 7), ev(1, Action::alloc, 2, MiB, 7),
                               ev(2, Action::alloc, 3, MiB, 7)};
  Archive a;
  RankRow row;
  row.event_count = events.size();
  a.ranks.push_back(row);
  a.events = events;
  EXPECT_TRUE(growing_call_sites(a, a.ranks[0], 10).empty());
}

}  // namespace
}  // namespace oomflight
