// memory_levels: the one walk of a rank's history that the HTML report's charts and the Perfetto counters draw from.
#include "oomflight/analysis/memory_levels.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace oomflight {
namespace {

constexpr std::uint64_t MiB = 1 << 20;

Event ev(std::int64_t t, Action action, std::uint64_t addr, std::uint64_t size) {
  Event e;
  e.t_ns = t;
  e.action = action;
  e.addr = addr;
  e.size = size;
  return e;
}

// One rank whose history is `events`.
Archive with_history(std::vector<Event> events) {
  Archive a;
  RankRow row;
  row.event_count = events.size();
  a.ranks.push_back(row);
  a.events = std::move(events);
  return a;
}

TEST(MemoryLevels, OneLevelPerEventWithAFreeTakingWhatItsAllocRecorded) {
  const Archive a = with_history({
      ev(10, Action::segment_alloc, 0x1000000, 20 * MiB),
      ev(11, Action::alloc, 0x1000000, 3 * MiB),
      ev(12, Action::free_requested, 0x1000000, 0),  // changes nothing: still a level, for a chart's resolution
      ev(13, Action::free_completed, 0x1000000, 0),  // takes the 3 MiB its alloc recorded, not its own 0
  });
  const auto levels = memory_levels(a, a.ranks[0]);
  ASSERT_EQ(levels.size(), 4u);
  EXPECT_EQ(levels[0].t_ns, 10);
  EXPECT_EQ(levels[0].reserved, static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(levels[1].allocated, static_cast<std::int64_t>(3 * MiB));
  EXPECT_EQ(levels[2].allocated, static_cast<std::int64_t>(3 * MiB));
  EXPECT_EQ(levels[3].allocated, 0);
  EXPECT_EQ(levels[3].reserved, static_cast<std::int64_t>(20 * MiB));
}

TEST(MemoryLevels, AFreeOfABlockOlderThanTheHistoryTakesItsOwnSize) {
  // PyTorch's trace gives a free its block's size: a history that begins mid-run goes below zero, and the readers
  // anchor it on the archive's figures.
  const Archive a = with_history({ev(5, Action::free_completed, 0x2000000, 2 * MiB)});
  const auto levels = memory_levels(a, a.ranks[0]);
  ASSERT_EQ(levels.size(), 1u);
  EXPECT_EQ(levels[0].allocated, -static_cast<std::int64_t>(2 * MiB));
}

TEST(MemoryLevels, AnUnmapTakesItsOwnRangeNotTheMappingAtItsAddress) {
  // An expandable segment maps two 20 MiB ranges, then unmaps both in one range of 40 MiB from the first's address.
  // Keyed on the mapping at that address, the Perfetto counters took 20 MiB away and left 20 MiB reserved.
  const Archive a = with_history({
      ev(1, Action::segment_map, 0x100000000000000, 20 * MiB),
      ev(2, Action::segment_map, 0x100000000000000 + 20 * MiB, 20 * MiB),
      ev(3, Action::segment_unmap, 0x100000000000000, 40 * MiB),
  });
  const auto levels = memory_levels(a, a.ranks[0]);
  ASSERT_EQ(levels.size(), 3u);
  EXPECT_EQ(levels[1].reserved, static_cast<std::int64_t>(40 * MiB));
  EXPECT_EQ(levels[2].reserved, 0);
}

TEST(MemoryLevels, AHostileArchivesSizesSaturateInsteadOfOverflowing) {
  const std::uint64_t huge = std::numeric_limits<std::uint64_t>::max();
  const Archive a = with_history({
      ev(1, Action::alloc, 1, huge),
      ev(2, Action::alloc, 2, huge),
      ev(3, Action::segment_free, 3, huge),
      ev(4, Action::segment_free, 4, huge),
  });
  const auto levels = memory_levels(a, a.ranks[0]);
  ASSERT_EQ(levels.size(), 4u);
  EXPECT_EQ(levels[1].allocated, std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(levels[3].reserved, std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(levels[3].allocated, std::numeric_limits<std::int64_t>::max());
}

TEST(MemoryLevels, ARankWithoutHistoryHasNoLevels) {
  const Archive a = with_history({});
  EXPECT_TRUE(memory_levels(a, a.ranks[0]).empty());
}

}  // namespace
}  // namespace oomflight
