// Merging rank-local files into one archive: rows in rank order, ids rebased, every event and stack the same as
// in its input; and the refusals (two dumps, a rank twice, the output among the inputs).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <optional>

#include "oomflight/format/archive_merge.hpp"
#include "oomflight/format/archive_reader.hpp"
#include "oomflight/format/archive_writer.hpp"
#include "test_support.hpp"

namespace oomflight {
namespace {

// A rank-local file of `rank` (world size 4): 3 + rank events, each on a stack whose frame line is rank + 1.
std::string write_rank_file(const std::filesystem::path& dir, int rank, const std::string& run = "merge",
                            std::optional<std::int64_t> dump_batch = 0,
                            std::optional<std::int64_t> dump_number = std::nullopt) {
  StackTable table;
  const std::string file = fmt::format("rank{}.py", rank);
  const FrameRef frames[] = {{"alloc", file, rank + 1}, {"main", "train.py", 7}};
  const auto stack = table.intern(frames);
  const StackTableCopy stacks = table.copy();
  std::vector<Event> events;
  for (int i = 0; i < 3 + rank; ++i) {
    Event e;
    e.t_ns = 100 * i;
    e.addr = 0x1000u * static_cast<std::uint64_t>(rank + 1) + static_cast<std::uint64_t>(i);
    e.size = 512u + static_cast<std::uint64_t>(rank);
    e.stack_id = i == 0 ? kNoStack : stack;
    events.push_back(e);
  }
  RankRow row;
  row.rank = rank;
  row.is_origin = rank == 2 ? 1 : 0;
  row.events_recorded = events.size();
  ArchiveHeader h;
  h.producer = "oomflight test";
  h.run_name = run;
  h.kind = "oom";
  h.created_at_utc = "2026-11-23T00:00:00Z";
  h.reason = rank == 2 ? "rank 2: CUDA out of memory" : "";
  h.origin_ranks = {2};
  h.world_size = 4;
  h.ranks_present = {rank};
  h.dump_batch = dump_batch;
  h.dump_number = dump_number;
  const auto path = (dir / fmt::format("oom.{}.{}rank{}.h5", dump_batch.value_or(0),
                                       dump_number ? fmt::format("{}.", *dump_number) : "", rank))
                        .string();
  write_archive(path, h, RankDump{.row = row, .events = events, .stacks = &stacks, .batches = {}, .context = {},
                                   .state_segments = {}, .state_blocks = {}, .collectives = {},
                                   .communicators = {}});
  return path;
}

std::string merge_error(const std::vector<std::string>& inputs, const std::string& output) {
  try {
    merge_archives(inputs, output);
  } catch (const ArchiveError& e) {
    return e.what();
  }
  return "";
}

TEST(ArchiveMerge, JoinsRankLocalFilesEventForEvent) {
  test::TempDir dir;
  const std::vector<std::string> inputs = {write_rank_file(dir.path(), 3), write_rank_file(dir.path(), 0),
                                           write_rank_file(dir.path(), 2)};
  const auto out = (dir.path() / "merged.h5").string();
  const ArchiveHeader h = merge_archives(inputs, out);
  EXPECT_EQ(h.ranks_present, (std::vector<std::int32_t>{0, 2, 3}));
  const Archive a = read_archive(out);
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{0, 2, 3}));
  EXPECT_EQ(a.header.world_size, 4);
  EXPECT_EQ(a.header.origin_ranks, std::vector<std::int32_t>{2});
  EXPECT_EQ(a.header.reason, "rank 2: CUDA out of memory");
  EXPECT_EQ(a.header.run_name, "merge");
  ASSERT_EQ(a.ranks.size(), 3u);
  for (const RankRow& row : a.ranks) {
    const Archive in = read_archive((dir.path() / fmt::format("oom.0.rank{}.h5", row.rank)).string());
    const auto merged = a.events_of(row);
    const auto original = in.events_of(in.ranks[0]);
    ASSERT_EQ(merged.size(), original.size()) << "rank " << row.rank;
    EXPECT_EQ(row.is_origin, row.rank == 2 ? 1 : 0);
    for (std::size_t i = 0; i < merged.size(); ++i) {
      EXPECT_EQ(merged[i].addr, original[i].addr);
      EXPECT_EQ(merged[i].size, original[i].size);
      const auto frames = a.stack(merged[i].stack_id);
      ASSERT_EQ(frames.size(), i == 0 ? 0u : 2u);
      if (i == 0) continue;
      EXPECT_EQ(frames[0]->line, row.rank + 1);  // the rank's own stack, after rebasing
      EXPECT_EQ(a.string(frames[0]->file), fmt::format("rank{}.py", row.rank));
      EXPECT_EQ(a.string(frames[1]->function), "main");
    }
  }
}

TEST(ArchiveMerge, RefusesWhatIsNotOneDump) {
  test::TempDir dir;
  const auto r0 = write_rank_file(dir.path(), 0);
  const auto out = (dir.path() / "merged.h5").string();
  EXPECT_NE(merge_error({r0, r0}, out).find("rank 0 is in both"), std::string::npos);
  test::TempDir other;
  const auto foreign = write_rank_file(other.path(), 1, "another-run");
  EXPECT_NE(merge_error({r0, foreign}, out).find("run_name 'merge' against 'another-run'"), std::string::npos);
  EXPECT_NE(merge_error({r0}, r0).find("is one of the inputs"), std::string::npos);
  EXPECT_NE(merge_error({r0, (dir.path() / "missing.h5").string()}, out).find("no such file"), std::string::npos);
  // Two dumps of one run and kind: rank 1's file of the dump at batch 7 with rank 0's of batch 0.
  const auto later = write_rank_file(dir.path(), 1, "merge", 7);
  EXPECT_NE(merge_error({r0, later}, out).find("dump_batch '0' against '7'"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(out));
}

// Two dumps of one batch (a signal dump, then an OOM in the same batch): the batch agrees, the dump number does not.
TEST(ArchiveMerge, RefusesFilesOfTwoDumpsOfOneBatchAndKeepsTheNumber) {
  test::TempDir dir;
  const auto out = (dir.path() / "merged.h5").string();
  const auto r0 = write_rank_file(dir.path(), 0, "merge", 3, 1), r1 = write_rank_file(dir.path(), 1, "merge", 3, 2);
  EXPECT_NE(merge_error({r0, r1}, out).find("dump_number '1' against '2'"), std::string::npos) << merge_error({r0, r1}, out);
  EXPECT_FALSE(std::filesystem::exists(out));
  const auto same = write_rank_file(dir.path(), 1, "merge", 3, 1);
  EXPECT_EQ(merge_archives({r0, same}, out).dump_number, std::optional<std::int64_t>(1));
  EXPECT_EQ(read_archive(out).header.dump_number, std::optional<std::int64_t>(1));
}

TEST(ArchiveMerge, KeepsTheDumpBatchAndReadsFilesWithoutOne) {
  test::TempDir dir;
  const auto r0 = write_rank_file(dir.path(), 0, "merge", 5), r1 = write_rank_file(dir.path(), 1, "merge", 5);
  const auto out = (dir.path() / "merged.h5").string();
  EXPECT_EQ(merge_archives({r0, r1}, out).dump_batch, std::optional<std::int64_t>(5));
  EXPECT_EQ(read_archive(out).header.dump_batch, std::optional<std::int64_t>(5));
  // Files of oomflight before 0.2.1 have none: nothing to compare, as before.
  test::TempDir old;
  const auto o0 = write_rank_file(old.path(), 0, "merge", std::nullopt);
  const auto o1 = write_rank_file(old.path(), 1, "merge", std::nullopt);
  EXPECT_FALSE(read_archive(o0).header.dump_batch.has_value());
  EXPECT_EQ(merge_error({o0, o1}, (old.path() / "merged.h5").string()), "");
}

}  // namespace
}  // namespace oomflight
