// parse_alloc_conf and replay_what_if (what_if.hpp): a trace replayed under other allocator settings and another
// capacity (issue 41, item 3). The replay of this project's H200 snapshot is in Whatif.* (the CLI, as a user runs it).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "oomflight/analysis/what_if.hpp"

namespace oomflight {
namespace {

constexpr std::uint64_t MiB = 1ull << 20;

TEST(WhatIf, SettingsWrittenAsASnapshotGivesThemReadBackAsTheyWere) {
  // `oomflight replay --alloc-conf` records what it ran under in the snapshot's own words, and `whatif` reads them
  // back from its archive: the round trip must lose nothing.
  AllocatorSettings s = parse_alloc_conf("max_split_size_mb:300,roundup_power2_divisions:8,expandable_segments:True");
  s.roundup_power2_divisions[15] = 2;
  TorchSnapshot snapshot;
  snapshot.allocator_settings = allocator_settings_entries(s);
  const AllocatorSettings back = allocator_settings_of(snapshot);
  EXPECT_EQ(back.max_split_size, 300 * MiB);
  EXPECT_EQ(back.roundup_power2_divisions, s.roundup_power2_divisions);
  EXPECT_TRUE(back.expandable_segments);
  snapshot.allocator_settings = allocator_settings_entries(AllocatorSettings{});
  EXPECT_EQ(allocator_settings_of(snapshot).max_split_size, UINT64_MAX);  // torch's -1: no limit
  EXPECT_FALSE(allocator_settings_of(snapshot).expandable_segments);
}

TEST(WhatIf, AllocConfReadsWhatTheModelUsesAndNamesWhatItCannot) {
  const AllocatorSettings s = parse_alloc_conf("max_split_size_mb:512, roundup_power2_divisions:4,backend:native");
  EXPECT_EQ(s.max_split_size, 512 * MiB);
  for (const auto d : s.roundup_power2_divisions) EXPECT_EQ(d, 4u);
  EXPECT_EQ(parse_alloc_conf("").max_split_size, UINT64_MAX);
  const auto refused = [](const char* text) {
    try {
      (void)parse_alloc_conf(text);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refused("max_split_size_mb:20"), "max_split_size_mb: 20 is too small: torch needs > 20");
  EXPECT_EQ(refused("max_split_size_mb:lots"), "max_split_size_mb: 'lots' is not a whole number");
  EXPECT_EQ(refused("roundup_power2_divisions:3"), "roundup_power2_divisions: 3 is not a power of two");
  EXPECT_NE(refused("roundup_power2_divisions:[256:1,>:4]").find("the per-interval form [..] is not read yet"),
            std::string::npos);
  EXPECT_EQ(refused("expandable_segments:True"), "accepted");
  EXPECT_NE(refused("expandable_segments:yes").find("neither True nor False"), std::string::npos);
  EXPECT_EQ(refused("expandable_segments:False"), "accepted");
  EXPECT_NE(refused("garbage_collection_threshold:0.6").find("not modelled yet"), std::string::npos);
  EXPECT_NE(refused("max_split_size_mb").find("'max_split_size_mb' is not key:value"), std::string::npos);
  EXPECT_NE(refused("max_splt_size_mb:512").find("'max_splt_size_mb' is not an option the model reads"),
            std::string::npos);
  EXPECT_EQ(refused("backend:cudaMallocAsync"),
            "backend:cudaMallocAsync is not PyTorch's caching allocator (backend:native), which is what the model "
            "replays");
}

TraceEntry entry(Action action, std::uint64_t addr, std::uint64_t size) {
  TraceEntry e;
  e.action = action;
  e.addr = addr;
  e.size = size;
  return e;
}

// 8 MiB in a new 20 MiB segment (below 10 MiB: kLargeBuffer), 4 MiB in its rest, the 8 MiB freed, then 30 MiB: a
// new 30 MiB segment.
TorchSnapshot trace() {
  TorchSnapshot s;
  s.device_traces = {{
      entry(Action::segment_alloc, 0x10000000, 20 * MiB),
      entry(Action::alloc, 0x10000000, 8 * MiB),
      entry(Action::alloc, 0x10800000, 4 * MiB),
      entry(Action::free_completed, 0x10000000, 8 * MiB),
      entry(Action::segment_alloc, 0x20000000, 30 * MiB),
      entry(Action::alloc, 0x20000000, 30 * MiB),
  }};
  return s;
}

TEST(WhatIf, WithoutALimitThePeaksAreTheTracesAndEveryAllocationFits) {
  const WhatIfOutcome o = replay_what_if(trace(), 0, {}, 0);
  EXPECT_TRUE(o.fits);
  EXPECT_EQ(o.allocations, 3u);
  EXPECT_EQ(o.peak_reserved, 50 * MiB);
  EXPECT_EQ(o.peak_allocated, 34 * MiB);  // 4 + 30: the 8 MiB block was freed before
  EXPECT_EQ(o.unallocated_at_peak, 16 * MiB);
  EXPECT_EQ(o.large.free, 16 * MiB);
  EXPECT_EQ(o.large.free_blocks, 2u);  // the 8 MiB freed and the 8 MiB past the 4 MiB block: apart
  EXPECT_EQ(o.large.largest_free, 8 * MiB);
}

TEST(WhatIf, ASegmentBeyondTheCapacityFailsWhenTheRetryPathCannotReleaseEnough) {
  const WhatIfOutcome o = replay_what_if(trace(), 0, {}, 40 * MiB);
  EXPECT_FALSE(o.fits);
  EXPECT_EQ(o.failing_entry, 5u);
  EXPECT_EQ(o.failing_size, 30 * MiB);
  EXPECT_EQ(o.failing_segment, 30 * MiB);
  EXPECT_EQ(o.reserved_at_failure, 20 * MiB);  // the first segment holds the live 4 MiB block: not released
  EXPECT_EQ(o.released_by_retries, 0u);
}

TEST(WhatIf, TheRetryPathReleasesWhollyFreeSegmentsToFit) {
  TorchSnapshot s = trace();
  // The 4 MiB block freed too: the first segment is wholly free when the 30 MiB request needs room.
  s.device_traces[0].insert(s.device_traces[0].begin() + 4, entry(Action::free_completed, 0x10800000, 4 * MiB));
  const WhatIfOutcome o = replay_what_if(s, 0, {}, 40 * MiB);
  EXPECT_TRUE(o.fits);
  EXPECT_EQ(o.released_by_retries, 20 * MiB);
  EXPECT_EQ(o.peak_reserved, 30 * MiB);
}

TEST(WhatIf, WithMaxSplitSizeTheRetryPathFirstReleasesTheOversizeBlockTheRequestNeeds) {
  // max_split_size 256 MiB: 300 MiB and 400 MiB blocks, each a segment of its own (oversize: never split), and a
  // 20 MiB segment, all freed; then 350 MiB within 800 MiB. No cached block serves it (the 400 MiB one is 20 MiB or
  // more above it: get_free_block's limit), and a new segment would take 1070 MiB. torch's retry path first gives
  // back the smallest oversize block of at least 350 MiB (release_available_cached_blocks), the 400 MiB one, and the
  // segment then fits: the other two stay cached. Without max_split_size the 400 MiB block is split for it.
  TorchSnapshot s;
  s.device_traces = {{
      entry(Action::segment_alloc, 0x100000000, 300 * MiB),
      entry(Action::alloc, 0x100000000, 300 * MiB),
      entry(Action::segment_alloc, 0x200000000, 400 * MiB),
      entry(Action::alloc, 0x200000000, 400 * MiB),
      entry(Action::segment_alloc, 0x300000000, 20 * MiB),
      entry(Action::alloc, 0x300000000, 8 * MiB),
      entry(Action::free_completed, 0x100000000, 300 * MiB),
      entry(Action::free_completed, 0x200000000, 400 * MiB),
      entry(Action::free_completed, 0x300000000, 8 * MiB),
      entry(Action::alloc, 0x400000000, 350 * MiB),
  }};
  const WhatIfOutcome split = replay_what_if(s, 0, parse_alloc_conf("max_split_size_mb:256"), 800 * MiB);
  EXPECT_TRUE(split.fits);
  EXPECT_EQ(split.released_by_retries, 400 * MiB);
  EXPECT_EQ(split.large.reserved, 670 * MiB);  // 300 + 20 cached, 350 new
  EXPECT_EQ(split.peak_reserved, 720 * MiB);
  const WhatIfOutcome unlimited = replay_what_if(s, 0, {}, 800 * MiB);
  EXPECT_TRUE(unlimited.fits);
  EXPECT_EQ(unlimited.released_by_retries, 0u);
  EXPECT_EQ(unlimited.large.reserved, 720 * MiB);

  // 450 MiB within 900 MiB: no oversize block is that large, so they go largest first until 450 MiB are back (the
  // 400 MiB, then the 300 MiB one); the 20 MiB segment is not oversize and stays.
  s.device_traces[0].back().size = 450 * MiB;
  const WhatIfOutcome several = replay_what_if(s, 0, parse_alloc_conf("max_split_size_mb:256"), 900 * MiB);
  EXPECT_TRUE(several.fits);
  EXPECT_EQ(several.released_by_retries, 700 * MiB);
  EXPECT_EQ(several.large.reserved, 470 * MiB);
}

TEST(WhatIf, ASmallRequestsRetryPathReleasesEveryFreeSegment) {
  // torch's first step searches the request's own pool, and the small pool holds no oversize block: for a small
  // request it releases nothing, and the second step gives back every wholly free segment (the 300 MiB oversize one
  // and the 20 MiB one), not only the oversize block.
  TorchSnapshot s;
  s.device_traces = {{
      entry(Action::alloc, 0x100000000, 300 * MiB),
      entry(Action::alloc, 0x200000000, 8 * MiB),  // in a 20 MiB segment (below 10 MiB)
      entry(Action::free_completed, 0x100000000, 300 * MiB),
      entry(Action::free_completed, 0x200000000, 8 * MiB),
      entry(Action::alloc, 0x400000000, 4096),  // small: a new 2 MiB segment, past 321 MiB with the 320 cached
  }};
  const WhatIfOutcome o = replay_what_if(s, 0, parse_alloc_conf("max_split_size_mb:256"), 321 * MiB);
  EXPECT_TRUE(o.fits);
  EXPECT_EQ(o.released_by_retries, 320 * MiB);
}

TEST(WhatIf, AnOomEntryIsTheFailedRequestAskedAgain) {
  TorchSnapshot s = trace();
  s.device_traces[0].resize(4);  // up to the free: 20 MiB reserved, 4 MiB allocated
  s.device_traces[0].push_back(entry(Action::oom, 6 * MiB /* device free */, 30 * MiB));
  EXPECT_EQ(capacity_at_oom(s, 0), 26 * MiB);  // 20 MiB of segments and 6 MiB free
  const WhatIfOutcome recorded = replay_what_if(s, 0, {}, 26 * MiB);
  EXPECT_FALSE(recorded.fits);
  EXPECT_EQ(recorded.failing_entry, 4u);
  // With 64 MiB it fits, in a segment of its own.
  const WhatIfOutcome larger = replay_what_if(s, 0, {}, 64 * MiB);
  EXPECT_TRUE(larger.fits);
  EXPECT_EQ(larger.peak_reserved, 50 * MiB);
  EXPECT_FALSE(capacity_at_oom(trace(), 0).has_value());
}

TEST(WhatIf, ADamagedEntryIsSkippedAndCountedAndAddressesNeverWrap) {
  TorchSnapshot s = trace();
  s.device_traces[0].insert(s.device_traces[0].begin() + 1, entry(Action::alloc, UINT64_MAX - 10, UINT64_MAX / 2));
  s.device_traces[0].push_back(entry(Action::alloc, UINT64_MAX, 64 * MiB));  // its address is the recorded one's
  const WhatIfOutcome o = replay_what_if(s, 0, {}, 0);
  EXPECT_TRUE(o.fits);
  EXPECT_EQ(o.skipped_requests, 1u);
  EXPECT_EQ(o.allocations, 4u);
  EXPECT_EQ(o.peak_reserved, 114 * MiB);  // 20 + 30 + 64: the model's own segments, wherever the trace put them
}

// expandable_segments: one segment of address space per (stream, pool), mapped by 20 MiB pages in the large pool
// (torch 2.11's try_allocate_expandable_block, map_block, unmap_block).
TEST(WhatIf, AnExpandableSegmentMapsPagesAtItsEndAndUnmapsWhollyFreeOnes) {
  AllocatorSettings settings;
  settings.expandable_segments = true;
  AllocatorModel m(settings);
  const auto take = [&](std::uint64_t size) {
    std::optional<std::uint64_t> at = m.place(size, 0);
    if (!at) at = m.expand(size, 0, 0).address;
    EXPECT_TRUE(at.has_value());
    EXPECT_TRUE(at && m.allocate(*at, size, 0));
    return at.value_or(0);
  };
  const std::uint64_t a = take(8 * MiB);  // one 20 MiB page
  EXPECT_EQ(m.reserved_bytes(), 20 * MiB);
  const std::uint64_t b = take(4 * MiB);  // the page's free rest
  EXPECT_EQ(b, a + 8 * MiB);
  EXPECT_EQ(m.reserved_bytes(), 20 * MiB);
  // 30 MiB: the 8 MiB free at the page's end and 22 MiB more, mapped as two pages (40 MiB).
  const AllocatorModel::Expansion would = m.expand(30 * MiB, 0, 50 * MiB);
  EXPECT_FALSE(would.address.has_value()) << "60 MiB would pass a 50 MiB capacity";
  EXPECT_EQ(would.mapped, 40 * MiB);
  EXPECT_EQ(m.reserved_bytes(), 20 * MiB) << "a refused expansion changes nothing";
  const std::uint64_t c = take(30 * MiB);
  EXPECT_EQ(c, a + 12 * MiB);  // contiguous with what was mapped: no fragmentation across segments
  EXPECT_EQ(m.reserved_bytes(), 60 * MiB);
  EXPECT_EQ(m.pool_figures(false).free, 18 * MiB);  // past the 30 MiB block, split at 512 B granularity
  // Freed at the front, 12 MiB free in a page that also holds the 30 MiB block: nothing to unmap.
  ASSERT_TRUE(m.free(a));
  ASSERT_TRUE(m.free(b));
  EXPECT_EQ(m.release_free_segments(), 0u);
  // All free: every page goes back.
  ASSERT_TRUE(m.free(c));
  EXPECT_EQ(m.release_free_segments(), 60 * MiB);
  EXPECT_EQ(m.reserved_bytes(), 0u);
  EXPECT_EQ(m.pool_figures(false).free, 0u);
  // And maps again from the segment's start.
  EXPECT_EQ(take(8 * MiB), a);
  EXPECT_EQ(m.reserved_bytes(), 20 * MiB);
}

TEST(WhatIf, ExpandableSegmentsMapWholePagesSoTheyCanNeedMoreThanSegmentsOfTheirOwn) {
  // 8 MiB, 4 MiB, the 8 MiB freed, 30 MiB. With segments of their own: 20 + 30 MiB. With expandable segments the live
  // 4 MiB keeps the first 20 MiB page mapped (the retry path unmaps only pages wholly free), and the 30 MiB block
  // takes the 8 MiB free at that page's end and 22 MiB more, which is two pages: 60 MiB.
  const AllocatorSettings expandable = parse_alloc_conf("expandable_segments:True");
  EXPECT_TRUE(expandable.expandable_segments);
  EXPECT_TRUE(replay_what_if(trace(), 0, {}, 50 * MiB).fits);
  const WhatIfOutcome o = replay_what_if(trace(), 0, expandable, 50 * MiB);
  EXPECT_FALSE(o.fits);
  EXPECT_TRUE(o.failing_pages);
  EXPECT_EQ(o.failing_entry, 5u);
  EXPECT_EQ(o.failing_segment, 40 * MiB);
  EXPECT_EQ(o.reserved_at_failure, 20 * MiB);
  EXPECT_EQ(o.released_by_retries, 0u);
  const WhatIfOutcome fits = replay_what_if(trace(), 0, expandable, 60 * MiB);
  EXPECT_TRUE(fits.fits);
  EXPECT_EQ(fits.peak_reserved, 60 * MiB);
}

}  // namespace
}  // namespace oomflight
