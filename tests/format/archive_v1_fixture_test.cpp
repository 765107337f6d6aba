// Archives written by schema v1 (tests/data/v1, see its README) must stay readable, field for field.
#include <gtest/gtest.h>

#include <string>

#include "oomflight/format/archive_reader.hpp"

namespace oomflight {
namespace {

std::string fixture(const std::string& name) { return std::string(OOMFLIGHT_SOURCE_DIR) + "/tests/data/v1/" + name; }

TEST(ArchiveV1, CollectiveArchiveOfFourRanksWithTwoOrigins) {
  const Archive a = read_archive(fixture("oom-4ranks-2origins.h5"));
  EXPECT_EQ(a.header.schema_version, 1);
  EXPECT_EQ(a.header.producer, "oomflight 0.1.0");
  EXPECT_EQ(a.header.run_name, "v1-fixture");
  EXPECT_EQ(a.header.kind, "oom");
  EXPECT_EQ(a.header.created_at_utc, "2026-11-22T11:23:02Z");
  EXPECT_EQ(a.header.reason, "rank 2: driver: out of memory on rank 2\nrank 3: driver: out of memory on rank 3");
  EXPECT_EQ(a.header.origin_ranks, (std::vector<std::int32_t>{2, 3}));
  EXPECT_EQ(a.header.world_size, 4);
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{0, 1, 2, 3}));
  ASSERT_EQ(a.ranks.size(), 4u);
  EXPECT_EQ(a.events.size(), 146u);
  std::uint64_t offset = 0;
  for (int rank = 0; rank < 4; ++rank) {
    const RankRow* row = a.rank_row(rank);
    ASSERT_NE(row, nullptr);
    const bool origin = rank >= 2;
    const std::uint64_t count = 1 + 20 + 10 * static_cast<std::uint64_t>(rank) + (origin ? 1 : 0);
    EXPECT_EQ(row->event_offset, offset);
    EXPECT_EQ(row->event_count, count);
    offset += count;
    EXPECT_EQ(row->events_recorded, count);
    EXPECT_EQ(row->overwritten + row->dropped + row->unreadable, 0u);
    EXPECT_EQ(row->is_origin, origin ? 1 : 0);
    EXPECT_EQ(row->batch, 0);
    EXPECT_EQ(row->allocated_bytes, 1'000'000u);
    EXPECT_EQ(row->reserved_bytes, 2'000'000u);
    EXPECT_EQ(row->peak_allocated_bytes, 1'500'000u);
    EXPECT_EQ(row->peak_reserved_bytes, 2'500'000u);
    EXPECT_EQ(row->device_capacity_bytes, 4'000'000u);
    EXPECT_EQ(row->device_free_bytes, origin ? 77u : 0u);
    EXPECT_EQ(row->oom_requested_bytes, origin ? 4096u * static_cast<unsigned>(rank + 1) : 0u);
    EXPECT_EQ(fixed_string(row->reason), origin ? "driver: out of memory on rank " + std::to_string(rank) : "");
    EXPECT_FALSE(fixed_string(row->host).empty());
    EXPECT_LT(row->anchor_monotonic_ns, row->anchor_realtime_ns);
    EXPECT_LE(row->freeze_t_ns, row->anchor_monotonic_ns);
    EXPECT_EQ(row->stack_count, 1u);
    EXPECT_EQ(row->stack_offset, static_cast<std::uint64_t>(rank));

    const auto events = a.events_of(*row);
    EXPECT_EQ(events.front().action, Action::step);
    EXPECT_EQ(events.back().action, origin ? Action::oom : Action::alloc);
    for (std::size_t i = 1; i < events.size(); ++i) {
      const Event& e = events[i];
      EXPECT_EQ(e.batch, 0);
      EXPECT_EQ(e.device, 0);
      if (e.action == Action::oom) {
        EXPECT_EQ(e.size, 4096u * static_cast<unsigned>(rank + 1));
        EXPECT_EQ(e.addr, 77u);
        EXPECT_EQ(e.stack_id, kNoStack);
        continue;
      }
      ASSERT_EQ(e.action, Action::alloc);
      EXPECT_EQ(e.size, 1000u + static_cast<unsigned>(rank));
      EXPECT_EQ(e.addr, 0x1000u * i);
      const auto frames = a.stack(e.stack_id);
      ASSERT_EQ(frames.size(), 1u);
      EXPECT_EQ(a.string(frames[0]->function), "train_step");
      EXPECT_EQ(a.string(frames[0]->file), "driver.py");
      EXPECT_EQ(frames[0]->line, rank + 1);
    }
  }
}

TEST(ArchiveV1, RankLocalFileOfOneRank) {
  const Archive a = read_archive(fixture("rank-local-rank1-of-4.h5"));
  EXPECT_EQ(a.header.schema_version, 1);
  EXPECT_EQ(a.header.kind, "oom");
  EXPECT_EQ(a.header.world_size, 4);
  EXPECT_EQ(a.header.ranks_present, std::vector<std::int32_t>{1});
  EXPECT_EQ(a.header.origin_ranks, std::vector<std::int32_t>{1});
  EXPECT_EQ(a.header.reason, "rank 1: driver: out of memory on rank 1");
  ASSERT_EQ(a.ranks.size(), 1u);
  const RankRow& row = a.ranks[0];
  EXPECT_EQ(row.rank, 1);
  EXPECT_EQ(row.is_origin, 1);
  EXPECT_EQ(row.event_offset, 0u);
  EXPECT_EQ(row.event_count, 1u + 5u + 10u + 1u);
  EXPECT_EQ(row.oom_requested_bytes, 8192u);
  EXPECT_EQ(a.events.back().action, Action::oom);
  ASSERT_EQ(a.stacks.size(), 1u);
  EXPECT_EQ(a.stack(a.events[1].stack_id).at(0)->line, 2);
}

}  // namespace
}  // namespace oomflight
