// The text report of a known archive (the schema-v1 fixture of tests/data/v1), line by line where it matters.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "oomflight/analysis/post_mortem.hpp"
#include "oomflight/export/text_report.hpp"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight {
namespace {

TEST(TextReport, TheMemoryOutsideTheAllocatorIsAColumnAndARankThatHoldsMuchMoreIsNamed) {
  // Issue 42, item 4: the fixture predates the figure, so every rank's is unknown, said once and shown as "?".
  Archive a = read_archive(std::string(OOMFLIGHT_SOURCE_DIR) + "/tests/data/v1/oom-4ranks-2origins.h5");
  const std::string unknown = render_report(a, analyze(a, 2), 1);
  EXPECT_NE(unknown.find("  memory outside the caching allocator: unknown on every rank (no NVML where they ran, or "
                         "it did not list their processes; archives before oomflight 0.3 do not record it)\n"),
            std::string::npos)
      << unknown;
  EXPECT_NE(unknown.find("     1.91 MiB            ?     1.43 MiB"), std::string::npos) << unknown;
  // A pipeline's last stage holds NCCL's buffers: named against the (lower) median of the ranks that know theirs.
  constexpr std::int64_t MiB = 1 << 20;
  a.ranks[0].outside_allocator_bytes = 1024 * MiB;
  a.ranks[1].outside_allocator_bytes = 1100 * MiB;
  a.ranks[3].outside_allocator_bytes = 8970 * MiB;
  const std::string known = render_report(a, analyze(a, 2), 1);
  EXPECT_NE(known.find("  rank 3 holds 8.76 GiB outside the caching allocator, the median rank 1.07 GiB (+7.69 GiB): "
                       "NCCL's buffers, the CUDA context and the libraries' workspaces are not in its snapshot\n"),
            std::string::npos)
      << known;
  EXPECT_EQ(known.find("unknown on every rank"), std::string::npos);
  EXPECT_NE(known.find("     1.91 MiB     8.76 GiB     1.43 MiB"), std::string::npos) << known;
  // Alike within 256 MiB (or half again as much): nobody named.
  a.ranks[3].outside_allocator_bytes = 1300 * MiB;
  const std::string alike = render_report(a, analyze(a, 2), 1);
  EXPECT_EQ(alike.find("outside the caching allocator, the median"), std::string::npos) << alike;
}

TEST(TextReport, NamesTheOriginsTheirRequestsEveryRankAndTheLargestBlocksWithFrames) {
  const Archive a = read_archive(std::string(OOMFLIGHT_SOURCE_DIR) + "/tests/data/v1/oom-4ranks-2origins.h5");
  const std::string text = render_report(a, analyze(a, 2), 1);
  for (const char* expected : {
           "run v1-fixture, kind oom, written 2026-11-22T11:23:02Z by oomflight 0.1.0 (schema 1)\n",
           "world size 4, ranks present 0,1,2,3 (4 of 4)\n",
           "origin: ranks 2, 3 (rank 2 failed first)\n",
           "  rank 2 at batch 0: requested 12.00 KiB, device free 77 B of 3.81 MiB\n",
           "    driver: out of memory on rank 3\n",
           "live memory on rank 3 by call site (of 50 live blocks, 48.97 KiB in the recorded history; 976.56 KiB "
           "allocated in all):\n",
           "  (927.59 KiB more allocated than the history's live blocks hold: blocks allocated before it began, or the "
           "allocator's rounding)\n   1. 50 blocks x 1003 B = 48.97 KiB\n",
           "        train_step (driver.py:4)\n",
           "  rank 1: 1.91 MiB reserved of 3.81 MiB (50.0%), 1.91 MiB headroom; peak reserved 2.38 MiB\n",
           // Each origin against ranks 0 and 1: its blocks come from a line no peer allocates at.
           "rank 3 against its 2 peers: 48.97 KiB live in the recorded history, the median peer 29.33 KiB "
           "(+19.65 KiB): an outlier\n   +48.97 KiB at train_step (driver.py:4): 48.97 KiB against 0 B on the median "
           "peer\n",
       }) {
    EXPECT_NE(text.find(expected), std::string::npos) << "missing: " << expected << "\nin:\n" << text;
  }
  // Ranks 0 to 3 each have one row in the table; only origins are marked.
  std::size_t marked = 0;
  for (std::size_t at = text.find("<- out of memory"); at != std::string::npos; at = text.find("<- out of memory", at + 1)) {
    ++marked;
  }
  EXPECT_EQ(marked, 2u);
}

// Blocks allocated before the first batch (a replay's predating blocks, a model's weights) are counted and said.
TEST(TextReport, CallSitesSayWhichBlocksWereAllocatedBeforeTheFirstBatch) {
  Archive a = read_archive(std::string(OOMFLIGHT_SOURCE_DIR) + "/tests/data/v1/oom-4ranks-2origins.h5");
  const RankRow* row = a.rank_row(3);
  ASSERT_NE(row, nullptr);
  std::size_t marked = 0;
  for (std::size_t i = row->event_offset; i < row->event_offset + row->event_count && marked < 10; ++i) {
    if (a.events[i].action == Action::alloc) {
      a.events[i].batch = -1;
      ++marked;
    }
  }
  const PostMortem pm = analyze(a, 2);
  const RankSummary& s = pm.ranks.at(3);
  ASSERT_EQ(s.call_sites.size(), 1u);
  EXPECT_EQ(s.call_sites[0].blocks, 50u);
  EXPECT_EQ(s.call_sites[0].before_first_batch, 10u);
  const std::string text = render_report(a, pm, 1);
  EXPECT_NE(text.find("   1. 50 blocks x 1003 B = 48.97 KiB, 10 of them allocated before the first batch\n"),
            std::string::npos)
      << text;
}

// The per-batch table: each rank's own peaks, batch after batch, and who grew the most. The fixture predates
// /batches, so the rows are added here: rank 2 (an origin) grows by 1 GiB a batch, the others stay flat.
TEST(TextReport, PerBatchPeaksShowWhichRankDrifted) {
  Archive a = read_archive(std::string(OOMFLIGHT_SOURCE_DIR) + "/tests/data/v1/oom-4ranks-2origins.h5");
  const std::uint64_t gib = std::uint64_t{1} << 30;
  for (int rank = 0; rank < 4; ++rank) {
    for (int b = 0; b < 3; ++b) {
      BatchRow row;
      row.rank = rank;
      row.batch = b;
      row.start_t_ns = 1000 * b + 1;
      row.end_t_ns = b == 2 ? 0 : 1000 * (b + 1);
      row.peak_allocated_bytes = (rank == 2 ? 10 + static_cast<std::uint64_t>(b) : 10) * gib;
      row.device_capacity_bytes = 40 * gib;
      a.batches.push_back(row);
    }
  }
  // Metadata of rank 2, the newest value of each key: epoch=3, lr=0.2.
  for (const auto& [key, value, batch] : std::vector<std::tuple<std::string, std::string, std::int64_t>>{
           {"epoch", "3", 0}, {"lr", "0.1", 0}, {"lr", "0.2", 2}}) {
    const auto id = static_cast<std::uint32_t>(a.strings.size());
    a.strings.push_back(key);
    a.strings.push_back(value);
    a.context.push_back(ContextRow{2, 1, {}, batch, id, id + 1});
  }
  const std::string text = render_report(a, analyze(a, 2), 1);
  for (const char* expected : {
           "    driver: out of memory on rank 2\n    metadata: epoch=3, lr=0.2\n",
           "per-batch peak allocated (each batch's own peak; the last 3 of 3 batches, * still running at the dump; "
           "growth and share over the ended ones):\n",
           "     2   10.00 GiB   11.00 GiB  12.00 GiB*   +2.00 GiB     30.0%  <- out of memory\n",
           "     0   10.00 GiB   10.00 GiB  10.00 GiB*        +0 B     25.0%\n",  // ended batches 0 and 1
           "  rank 2's peak grew the most over batches 0 to 2: +2.00 GiB (the median rank: +0 B)\n",
       }) {
    EXPECT_NE(text.find(expected), std::string::npos) << "missing: " << expected << "\nin:\n" << text;
  }
}

// A stack with no Python frame starts with the allocator's own C++ frames: the report shows the first frame that
// is not the allocator's (memory_viz hides them the same way).
TEST(TextReport, TopFramesSkipTheAllocatorsOwn) {
  Archive a = read_archive(std::string(OOMFLIGHT_SOURCE_DIR) + "/tests/data/v1/oom-4ranks-2origins.h5");
  const auto string_id = [&](const char* text) {
    a.strings.push_back(text);
    return static_cast<std::uint32_t>(a.strings.size() - 1);
  };
  const std::uint32_t cpp = string_id("Blas.cpp");
  a.frames.push_back(FrameRow{string_id("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"), cpp, 1});
  a.frames.push_back(FrameRow{string_id("at::detail::empty_generic"), cpp, 2});
  a.frames.push_back(FrameRow{string_id("at::native::baddbmm_out_cuda_impl"), cpp, 3});
  a.stack_frames.insert(a.stack_frames.end(), {static_cast<std::uint32_t>(a.frames.size() - 3),
                                               static_cast<std::uint32_t>(a.frames.size() - 2),
                                               static_cast<std::uint32_t>(a.frames.size() - 1)});
  a.stacks.push_back(StackRow{a.stack_frames.size() - 3, 3, 0});
  // Rank 3's live blocks all get that stack.
  const RankRow* row = a.rank_row(3);
  for (std::uint64_t i = 0; i < row->event_count; ++i) {
    a.events[row->event_offset + i].stack_id = static_cast<std::int32_t>(a.stacks.size() - 1);
  }
  const std::string text = render_report(a, analyze(a, 2), 1);
  EXPECT_NE(text.find("   1. 50 blocks x 1003 B = 48.97 KiB\n        at::native::baddbmm_out_cuda_impl (Blas.cpp:3)\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("CUDACachingAllocator"), std::string::npos) << text;
}

}  // namespace
}  // namespace oomflight
