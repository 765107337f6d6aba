// cache_figures and cache_at_failure_text (cache_figures.hpp): what the caching allocator held at a failure, by pool,
// and whether a free block could have held the request (issue 41, item 4).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "oomflight/analysis/cache_figures.hpp"

namespace oomflight {
namespace {

constexpr std::uint64_t MiB = 1ull << 20;

StateSegmentRow segment(std::uint64_t address, std::uint64_t size, SegmentType type, bool expandable = false) {
  StateSegmentRow s;
  s.address = address;
  s.total_size = size;
  s.segment_type = type;
  s.is_expandable = expandable ? 1 : 0;
  return s;
}

StateBlockRow block(std::uint64_t address, std::uint64_t size, BlockState state) {
  StateBlockRow b;
  b.address = address;
  b.size = size;
  b.requested_size = size;
  b.state = state;
  return b;
}

// A 20 MiB large segment (4 MiB free, 8 MiB allocated, 8 MiB free that no row lists: the live tracker lists only
// the blocks that are not free), a 2 MiB segment of unknown type (the sizing rule makes it small: 512 KiB waiting on a
// stream, not free, then 1.5 MiB free), a 2 MiB expandable one with no row (large: all free), and a free block in no
// segment (a damaged row: ignored).
CacheFigures figures() {
  const std::vector<StateSegmentRow> segments = {
      segment(0x10000000, 20 * MiB, SegmentType::large),
      segment(0x20000000, 2 * MiB, SegmentType::unknown),
      segment(0x30000000, 2 * MiB, SegmentType::unknown, true),
  };
  const std::vector<StateBlockRow> blocks = {
      block(0x10000000, 4 * MiB, BlockState::inactive),
      block(0x10400000, 8 * MiB, BlockState::active_allocated),
      block(0x20000000, MiB / 2, BlockState::active_pending_free),
      block(0x20080000, 3 * MiB / 2, BlockState::inactive),
      block(0x40000000, 64 * MiB, BlockState::inactive),
  };
  const auto c = cache_figures(segments, blocks);
  EXPECT_TRUE(c.has_value());
  return c.value_or(CacheFigures{});
}

TEST(CacheFigures, FreeBytesBlocksAndTheLargestOfEachPool) {
  const CacheFigures c = figures();
  EXPECT_EQ(c.large.reserved, 22 * MiB);
  EXPECT_EQ(c.large.free, 14 * MiB);
  EXPECT_EQ(c.large.free_blocks, 3u);
  EXPECT_EQ(c.large.largest_free, 8 * MiB);
  EXPECT_EQ(c.small.reserved, 2 * MiB);
  EXPECT_EQ(c.small.free, 3 * MiB / 2);
  EXPECT_EQ(c.small.free_blocks, 1u);
  EXPECT_EQ(c.small.largest_free, 3 * MiB / 2);
  EXPECT_EQ(c.free(), 31 * MiB / 2);
  EXPECT_FALSE(cache_figures({}, {}).has_value()) << "no state: unknown, not an empty cache";
}

TEST(CacheFigures, TheVerdictComparesTheRequestWithItsPoolsLargestBlockThenWithEveryFreeByte) {
  const CacheFigures c = figures();
  const std::string figures_text =
      "the cache at the failure: 15.50 MiB reserved but free (large pool 14.00 MiB in 3 blocks, the largest 8.00 MiB; "
      "small pool 1.50 MiB in 1 block, the largest 1.50 MiB)";
  EXPECT_EQ(cache_at_failure_text(c, 0), figures_text);
  EXPECT_EQ(cache_at_failure_text(c, 10 * MiB),
            figures_text + "; no free block holds the request of 10.00 MiB, though 15.50 MiB is free in all: "
                           "fragmentation");
  EXPECT_EQ(cache_at_failure_text(c, 20 * MiB),
            figures_text + "; no free block holds the request of 20.00 MiB, nor would all the cache's free bytes "
                           "together");
  EXPECT_EQ(cache_at_failure_text(c, 6 * MiB),
            figures_text + "; a free block of the large pool (8.00 MiB) is as large as the request of 6.00 MiB: the "
                           "allocator did not take it (it is another stream's, max_split_size_mb keeps it for larger "
                           "requests, or it was freed after the failure)");
  // 1 MiB is the small pool's: its 1.5 MiB block is as large.
  EXPECT_NE(cache_at_failure_text(c, MiB).find("a free block of the small pool (1.50 MiB)"), std::string::npos);
  // 1.5 MiB is the large pool's, whatever the small pool holds.
  EXPECT_NE(cache_at_failure_text(c, 3 * MiB / 2).find("a free block of the large pool (8.00 MiB)"), std::string::npos);
}

TEST(CacheFigures, APoolWithNothingFreeSaysWhatItReserves) {
  const std::vector<StateSegmentRow> segments = {segment(0x10000000, 20 * MiB, SegmentType::large)};
  const std::vector<StateBlockRow> blocks = {block(0x10000000, 20 * MiB, BlockState::active_allocated)};
  const auto c = cache_figures(segments, blocks);
  ASSERT_TRUE(c);
  EXPECT_EQ(cache_at_failure_text(*c, 4 * MiB),
            "the cache at the failure: 0 B reserved but free (large pool nothing free of 20.00 MiB; small pool empty); "
            "no free block holds the request of 4.00 MiB, nor would all the cache's free bytes together");
}

}  // namespace
}  // namespace oomflight
