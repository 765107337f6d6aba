// `oomflight whatif --fidelity`: the allocator model (allocator_model.hpp) replayed over real traces, as a user runs
// it: this project's H200 snapshot, an archive imported from it (each rank's own line), and what it says of inputs it
// cannot judge. The PyTorch snapshots in ../shared are in AllocatorModel's own tests.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <string>

#include "test_support.hpp"

namespace oomflight {
namespace {

using test::run_command;
using test::TempDir;

std::string cli(const std::string& args) { return fmt::format("{} {}", OOMFLIGHT_CLI, args); }

const std::string kH200 = std::string(OOMFLIGHT_SOURCE_DIR) + "/examples/pytorch/snapshots/h200-transformer-lm-step1.pickle";

TEST(Whatif, FidelityOfThisProjectsH200SnapshotIsEveryAllocationAndSegment) {
  TempDir dir;
  const auto r = run_command(cli("whatif --fidelity " + kH200), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, kH200 + " device 0: fidelity: 1332 of 1332 allocations at the recorded address, 66 of 66 "
                              "segment events as recorded\n");
}

TEST(Whatif, AnArchiveIsReplayedRankByRank) {
  TempDir dir;
  ASSERT_EQ(run_command(cli(fmt::format("import {} {} -o two.h5", kH200, kH200)), dir.path()).exit_code, 0);
  const auto r = run_command(cli("whatif two.h5 --fidelity --rank 1"), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "rank 1 device 0: fidelity: 1332 of 1332 allocations at the recorded address, 66 of 66 "
                      "segment events as recorded\n");
  const auto none = run_command(cli("whatif two.h5 --fidelity --rank 5"), dir.path());
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.output.find("two.h5 holds none of the ranks asked for"), std::string::npos) << none.output;
}

TEST(Whatif, AllocationsWhoseSegmentTheHistoryLacksAreNotJudged) {
  // The v1 fixture's blocks have no segment_alloc in their history (memory_viz.hpp makes one up for each).
  TempDir dir;
  const auto r = run_command(
      cli(fmt::format("whatif {}/tests/data/v1/oom-4ranks-2origins.h5 --fidelity --rank 2", OOMFLIGHT_SOURCE_DIR)),
      dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "rank 2 device 0: fidelity: 0 of 0 allocations at the recorded address, 0 of 0 segment events "
                      "as recorded\n  40 allocations in no segment the trace or its end state holds: not judged\n");
}

TEST(Whatif, WhatIsNotBuiltOrDoesNotApplyIsAUsageError) {
  TempDir dir;
  const auto table = run_command(cli("whatif " + kH200), dir.path());
  EXPECT_EQ(table.exit_code, 2);
  EXPECT_NE(table.output.find("oomflight error: whatif: only --fidelity is built so far"), std::string::npos)
      << table.output;
  const auto rank = run_command(cli("whatif --fidelity --rank 1 " + kH200), dir.path());
  EXPECT_EQ(rank.exit_code, 2);
  EXPECT_NE(rank.output.find("is a snapshot pickle, one process's: it has no ranks"), std::string::npos)
      << rank.output;
  const auto missing = run_command(cli("whatif --fidelity nothing.pickle"), dir.path());
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("nothing.pickle"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace oomflight
