// AllocatorModel (allocator_model.hpp): PyTorch's caching allocator's rules, each on a constructed sequence with the
// function of torch 2.11's c10/cuda/CUDACachingAllocator.cpp it follows named, then the whole model on real traces:
// this project's own H200 snapshot (examples/pytorch/snapshots) and PyTorch's in ../shared (skipped when absent).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "oomflight/analysis/allocator_model.hpp"

namespace oomflight {
namespace {

constexpr std::uint64_t MiB = 1ull << 20;

TEST(AllocatorModel, RoundsToBlocksAndSegmentsAsTorchDoes) {
  const AllocatorModel m;
  // round_size(): at least kMinBlockSize, then multiples of it.
  EXPECT_EQ(m.round_size(1), 512u);
  EXPECT_EQ(m.round_size(512), 512u);
  EXPECT_EQ(m.round_size(513), 1024u);
  // get_allocation_size(): 2 MiB segments for the small pool (<= 1 MiB), 20 MiB below 10 MiB, else 2 MiB steps.
  EXPECT_TRUE(AllocatorModel::small_pool(MiB));
  EXPECT_FALSE(AllocatorModel::small_pool(MiB + 512));
  EXPECT_EQ(AllocatorModel::segment_size(MiB), 2 * MiB);
  EXPECT_EQ(AllocatorModel::segment_size(MiB + 512), 20 * MiB);
  EXPECT_EQ(AllocatorModel::segment_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(AllocatorModel::segment_size(65536000), 64 * MiB);  // the H200 trace's first segment
}

TEST(AllocatorModel, RoundupPowerTwoDivisionsRoundToTheNextStep) {
  // roundup_power2_next_division(): 4 divisions between 256 MiB and 512 MiB are steps of 64 MiB.
  AllocatorSettings s;
  s.roundup_power2_divisions.assign(16, 4);
  const AllocatorModel m(s);
  EXPECT_EQ(m.round_size(300 * MiB), 320 * MiB);
  EXPECT_EQ(m.round_size(256 * MiB), 256 * MiB) << "a power of two stays";
  EXPECT_EQ(m.round_size(1200), 1536u) << "below 512 B x divisions: the 512 B rule";
}

TEST(AllocatorModel, BestFitTakesTheSmallestBlockOfItsStreamThenTheLowestAddress) {
  AllocatorModel m;
  m.add_segment(0x100000000, 20 * MiB, 7, false);
  m.add_segment(0x200000000, 20 * MiB, 7, false);
  m.add_segment(0x300000000, 20 * MiB, 9, false);
  ASSERT_TRUE(m.allocate(0x100000000, 16 * MiB, 7));  // leaves 4 MiB free at +16 MiB (split: rest > 1 MiB)
  EXPECT_EQ(m.place(3 * MiB, 7), 0x100000000 + 16 * MiB) << "the 4 MiB rest fits best";
  EXPECT_EQ(m.place(5 * MiB, 7), 0x200000000u);
  EXPECT_EQ(m.place(5 * MiB, 9), 0x300000000u) << "another stream's blocks are its own";
  EXPECT_FALSE(m.place(5 * MiB, 8).has_value());
  EXPECT_FALSE(m.place(4096, 7).has_value()) << "a small request uses the small pool";
}

TEST(AllocatorModel, SplitsFollowEachPoolsRule) {
  // should_split(): the small pool splits a rest of 512 B or more; the large pool only a rest above 1 MiB.
  AllocatorModel m;
  m.add_segment(0x100000000, 2 * MiB, 0, true);
  ASSERT_TRUE(m.allocate(0x100000000, 2 * MiB - 512, 0));
  EXPECT_EQ(m.place(512, 0), 0x100000000 + 2 * MiB - 512);
  m.add_segment(0x200000000, 20 * MiB, 0, false);
  ASSERT_TRUE(m.allocate(0x200000000, 19 * MiB, 0));  // a 1 MiB rest: not split, the block is all 20 MiB
  EXPECT_EQ(m.allocated_bytes(), 2 * MiB - 512 + 20 * MiB);
  EXPECT_FALSE(m.place(2 * MiB, 0).has_value());
}

TEST(AllocatorModel, MaxSplitSizeKeepsOversizeBlocksWhole) {
  AllocatorSettings s;
  s.max_split_size = 64 * MiB;
  AllocatorModel m(s);
  m.add_segment(0x100000000, 128 * MiB, 0, false);
  EXPECT_FALSE(m.place(4 * MiB, 0).has_value()) << "an oversize block serves no request below max_split_size";
  EXPECT_FALSE(m.place(100 * MiB, 0).has_value()) << "nor one that would waste 20 MiB or more of it";
  EXPECT_EQ(m.place(110 * MiB, 0), 0x100000000u);
  ASSERT_TRUE(m.allocate(0x100000000, 110 * MiB, 0));
  EXPECT_EQ(m.allocated_bytes(), 128 * MiB) << "and it is not split";
}

TEST(AllocatorModel, AFreedBlockMergesWithItsFreeNeighboursAndTheSegmentCanGoBack) {
  // free_block() and try_merge_blocks(); release_cached_blocks() gives back only whole free segments.
  AllocatorModel m;
  m.add_segment(0x100000000, 2 * MiB, 0, true);
  ASSERT_TRUE(m.allocate(0x100000000, 4096, 0));
  ASSERT_TRUE(m.allocate(0x100000000 + 4096, 4096, 0));
  EXPECT_FALSE(m.release_segment(0x100000000)) << "blocks of it are allocated";
  ASSERT_TRUE(m.free(0x100000000 + 4096));
  ASSERT_TRUE(m.free(0x100000000));
  EXPECT_FALSE(m.free(0x100000000)) << "freed once";
  EXPECT_EQ(m.place(MiB, 0), 0x100000000u) << "one free block again, from the segment's start";
  EXPECT_TRUE(m.release_segment(0x100000000));
  EXPECT_EQ(m.reserved_bytes(), 0u);
}

void expect_faithful(const std::string& path) {
  StackTable stacks;
  const TorchSnapshot s = read_torch_snapshot(path, stacks);
  for (std::size_t d = 0; d < s.device_traces.size(); ++d) {
    if (s.device_traces[d].empty()) continue;
    const AllocatorFidelity f = replay_fidelity(s, static_cast<int>(d), allocator_settings_of(s));
    std::cout << path << " device " << d << ": " << f.allocations_matched << " of " << f.allocations
              << " allocations at the recorded address, " << f.segment_events_matched << " of " << f.segment_events
              << " segment events as recorded" << (f.first_difference.empty() ? "" : "; first: ")
              << f.first_difference << "\n";
    EXPECT_GT(f.allocations, 0u);
    EXPECT_EQ(f.allocations_matched, f.allocations) << f.first_difference;
    EXPECT_EQ(f.segment_events_matched, f.segment_events) << f.first_difference;
  }
}

TEST(AllocatorModel, PlacesEveryAllocationOfThisProjectsH200TraceWhereTorchDid) {
  expect_faithful(std::string(OOMFLIGHT_SOURCE_DIR) + "/examples/pytorch/snapshots/h200-transformer-lm-step1.pickle");
}

TEST(AllocatorModel, PlacesEveryAllocationOfPyTorchsOwnSnapshotsWhereTorchDid) {
  const std::filesystem::path dir(OOMFLIGHT_SNAPSHOTS);
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << "no third-party snapshots at " << dir;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".pickle") expect_faithful(entry.path().string());
  }
}

}  // namespace
}  // namespace oomflight
