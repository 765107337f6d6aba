// `oomflight diff A B` (issue 42, item 3) on one process's snapshot windows: the call site that grew between them,
// nothing when an archive is compared with itself, and the errors it names. Several ranks: MpiReplay.Diff*.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <string>

#include "test_support.hpp"

namespace oomflight {
namespace {

using test::cli;
using test::run_command;
using test::TempDir;

TEST(DiffCommand, BetweenTwoSnapshotWindowsTheLeakIsTheOneCallSiteThatChanged) {
  TempDir dir;
  const auto r = run_command(
      fmt::format("env OOMFLIGHT_SKIP_BATCHES=1 OOMFLIGHT_INTERVAL=1ba OOMFLIGHT_SNAPSHOT_EVERY=2ba {}",
                  cli(fmt::format("replay {} --device-memory 16GiB --steps 6 --rank-leak 0=256MiB",
                                  test::own_snapshot()))),
      dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto files = test::files_with_suffix(dir.path(), ".h5");
  ASSERT_EQ(files.size(), 3u) << r.output;
  const std::string first = files[0].string(), last = files[2].string();

  const auto d = run_command(cli(fmt::format("diff {} {}", first, last)), dir.path());
  EXPECT_EQ(d.exit_code, 0) << d.output;
  EXPECT_NE(d.output.find("ranks compared: 0\n"), std::string::npos) << d.output;
  EXPECT_NE(d.output.find("live in their recorded histories: 2.12 GiB -> 3.12 GiB (+1.00 GiB)\n"), std::string::npos)
      << d.output;
  EXPECT_NE(d.output.find("1 call site's live bytes changed:\n   1. +1.00 GiB (512.00 MiB -> 1.50 GiB)\n"
                          "        keep_activations_for_logging (oomflight replay --rank-leak:1)\n"),
            std::string::npos)
      << d.output;
  // Backwards, the same site shrank by as much.
  const auto back = run_command(cli(fmt::format("diff {} {}", last, first)), dir.path());
  EXPECT_NE(back.output.find("   1. -1.00 GiB (1.50 GiB -> 512.00 MiB)"), std::string::npos) << back.output;

  const auto same = run_command(cli(fmt::format("diff {} {}", first, first)), dir.path());
  EXPECT_EQ(same.exit_code, 0) << same.output;
  EXPECT_NE(same.output.find("no call site's live bytes changed\n"), std::string::npos) << same.output;

  const auto absent = run_command(cli(fmt::format("diff {} {} --rank 3", first, last)), dir.path());
  EXPECT_EQ(absent.exit_code, 1) << absent.output;
  EXPECT_NE(absent.output.find("--rank 3: not in both archives"), std::string::npos) << absent.output;

  const auto missing = run_command(cli(fmt::format("diff {} nothing.h5", first)), dir.path());
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find("nothing.h5"), std::string::npos) << missing.output;

  const auto one = run_command(cli(fmt::format("diff {}", first)), dir.path());
  EXPECT_EQ(one.exit_code, 2) << one.output;  // a usage error: two archives are needed
}

}  // namespace
}  // namespace oomflight
