// Snapshot windows: Composer's once-through window and the repeating one, and which batch mark closes each.
#include <gtest/gtest.h>

#include "oomflight/control/snapshot_schedule.hpp"

namespace oomflight {
namespace {

Config with(std::optional<std::int64_t> skip, std::optional<std::int64_t> interval, std::optional<std::int64_t> every) {
  Config c = Config::defaults();
  c.skip_batches = skip;
  c.interval_batches = interval;
  c.snapshot_every_batches = every;
  return c;
}

TEST(SnapshotSchedule, ComposersWindowSkipOneIntervalThree) {
  const SnapshotSchedule s(with(1, 3, std::nullopt));
  EXPECT_FALSE(s.window_of(0));
  EXPECT_EQ(s.window_of(1)->first, 1);
  EXPECT_EQ(s.window_of(3)->last, 3);
  EXPECT_FALSE(s.window_of(4));
  EXPECT_FALSE(s.closed_by(2, 3));                  // still inside
  EXPECT_EQ(s.closed_by(3, 4)->first, 1);           // batch 4 ends it
  EXPECT_FALSE(s.closed_by(4, 5));                  // once only
  EXPECT_EQ(s.closed_at_end(3)->last, 3);           // a normal end during batch 3 ends it too
  EXPECT_FALSE(s.closed_at_end(2));                 // an incomplete window is not written
}

TEST(SnapshotSchedule, RepeatingWindowsAndDefaults) {
  const SnapshotSchedule every(with(0, std::nullopt, 2));  // interval defaults to the period
  EXPECT_EQ(every.closed_by(1, 2)->first, 0);
  EXPECT_EQ(every.closed_by(3, 4)->index, 1);
  EXPECT_EQ(every.closed_at_end(5)->first, 4);
  const SnapshotSchedule gaps(with(2, 1, 5));  // batches 2, 7, 12, ...
  EXPECT_EQ(gaps.closed_by(7, 8)->first, 7);
  EXPECT_FALSE(gaps.window_of(8));
  EXPECT_EQ(gaps.closed_by(2, 9)->first, 2);  // a jump past a window still closes the one it left
  const SnapshotSchedule only_interval(with(std::nullopt, 2, std::nullopt));  // skip defaults to 1
  EXPECT_EQ(only_interval.window_of(1)->last, 2);
  EXPECT_FALSE(SnapshotSchedule(Config::defaults()).enabled());
}

}  // namespace
}  // namespace oomflight
