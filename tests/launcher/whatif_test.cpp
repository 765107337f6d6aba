// `oomflight whatif`: the allocator model (allocator_model.hpp, what_if.hpp) replayed over real traces, as a user
// runs it: this project's H200 snapshot, an archive imported from it (each rank's own line), an archive of its OOM on
// a 6 GiB device replayed under its own settings and others, and what it says of inputs it cannot judge. The PyTorch snapshots in ../shared are in AllocatorModel's own tests.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <string>

#include "test_support.hpp"

namespace oomflight {
namespace {

using test::run_command;
using test::TempDir;

using test::cli;

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

// The H200 step replayed on a 6 GiB device (`oomflight replay`, one process): an archive of its OOM, whose failure
// the recorded settings' replay must find where torch did, asking for the segment torch's message names.
std::string oom_archive(const TempDir& dir) {
  const auto r = run_command(cli("replay " + kH200 + " --device-memory 6GiB"), dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("Tried to allocate 1000.00 MiB"), std::string::npos) << r.output;
  const auto files = test::files_with_suffix(dir.path(), ".h5");
  EXPECT_EQ(files.size(), 1u) << r.output;
  return files.empty() ? std::string("none.h5") : files[0].string();
}

// The line of the table whose name is `name`, spaces squeezed.
std::string table_row(const std::string& output, const std::string& name) {
  const std::size_t at = output.find("  " + name + " ");
  if (at == std::string::npos) return "";
  std::string line = output.substr(at + 2, output.find('\n', at) - at - 2), out;
  for (char c : line) {
    if (!(c == ' ' && !out.empty() && out.back() == ' ')) out += c;
  }
  return out;
}

TEST(Whatif, TheRecordedSettingsFailWhereTorchDidAndALargerDeviceFitsWithTheDemosHeadroom) {
  TempDir dir;
  const std::string archive = oom_archive(dir);
  const auto r = run_command(cli("whatif " + archive), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 0 device 0: the recorded settings against the same (no --alloc-conf), within "
                          "6.00 GiB (the rank's device capacity)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(table_row(r.output, "peak reserved"), "peak reserved 5.96 GiB 5.96 GiB") << r.output;
  // The report's cache line (the state at the freeze) and the model agree on the largest free block.
  EXPECT_EQ(table_row(r.output, "largest free block, large pool"),
            "largest free block, large pool (at failure / failure) 568.78 MiB 568.78 MiB")
      << r.output;
  // The model's retry path releases the 10 MiB of free segments that torch's released (the trace's segment_free
  // entries before its oom entry, which the replay leaves to the model).
  EXPECT_NE(r.output.find("as recorded: does not fit: entry 2197, a request of 998.05 MiB needs a new segment of "
                          "1000.00 MiB with 5.95 GiB reserved after the retry path released 10.00 MiB in the replay\n"),
            std::string::npos)
      << r.output;
  // The failing request was made on autograd's thread: C++ frames only, the allocator's own left out.
  EXPECT_NE(r.output.find("_log_softmax_backward_data"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("gather_with_cpp"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("least headroom as configured: rank 0, short by 944.00 MiB"), std::string::npos)
      << r.output;
  // On the 8 GiB of the demo's other ranks the step fits, with the peak and headroom the demo's report gives them
  // (the trace ends at the failed request, which is asked again here and fits).
  const auto larger = run_command(cli("whatif " + archive + " --device-memory 8GiB"), dir.path());
  EXPECT_EQ(larger.exit_code, 0) << larger.output;
  EXPECT_EQ(table_row(larger.output, "peak reserved"), "peak reserved 6.93 GiB 6.93 GiB") << larger.output;
  EXPECT_NE(larger.output.find("as recorded: fits, 1.07 GiB to spare at its peak"), std::string::npos)
      << larger.output;
}

TEST(Whatif, AnotherMaxSplitSizeIsReplayedBesideTheRecordedSettings) {
  TempDir dir;
  const std::string archive = oom_archive(dir);
  const auto r = run_command(cli("whatif " + archive + " --alloc-conf max_split_size_mb:200"), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("against 'max_split_size_mb:200', within 6.00 GiB"), std::string::npos) << r.output;
  // Oversize blocks are not split: less is left cached but unallocated at the peak, and the failing request finds
  // the retry path still short, with 5.39 GiB reserved. Over the replay the retry path gave back 1010.00 MiB: with
  // max_split_size its first step gives back only the oversize cached blocks a request needs (torch's
  // release_available_cached_blocks); before the model had that step it gave back every free segment each time,
  // 1.96 GiB in all, and failed at the same place.
  EXPECT_EQ(table_row(r.output, "reserved but unallocated at peak allocated"),
            "reserved but unallocated at peak allocated 56.29 MiB 48.47 MiB")
      << r.output;
  EXPECT_NE(r.output.find("as configured: does not fit: entry 2197, a request of 998.05 MiB needs a new segment of "
                          "1000.00 MiB with 5.39 GiB reserved after the retry path released 1010.00 MiB in the replay"),
            std::string::npos)
      << r.output;
}

TEST(Whatif, ExpandableSegmentsAreReplayedAndSaidToBeUnmeasured) {
  // The demo's question: does the 6 GiB device fit the step with expandable segments? No: 5.31 GiB is allocated when
  // the 998 MiB request comes, so no allocator fits it; the model unmaps the free pages (the cache's 608 MiB) and
  // still needs 1000 MiB of pages.
  TempDir dir;
  const std::string archive = oom_archive(dir);
  const auto r = run_command(cli("whatif " + archive + " --alloc-conf expandable_segments:True"), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("  expandable segments: modelled from torch 2.11's allocator"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("not yet measured against a trace recorded with them"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("as configured: does not fit: entry 2197, a request of 998.05 MiB needs pages of "
                          "1000.00 MiB with 5.36 GiB reserved after the retry path released 608.00 MiB in the replay"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("least headroom as configured: rank 0, short by 342.00 MiB"), std::string::npos)
      << r.output;
}

TEST(Whatif, EveryRankOfAnArchiveIsReplayedAndTheLeastHeadroomNamed) {
  // Two ranks of the same step, replayed at once (one thread per core), printed in rank order; a tie is the lower
  // rank's.
  TempDir dir;
  ASSERT_EQ(run_command(cli(fmt::format("import {} {} -o two.h5", kH200, kH200)), dir.path()).exit_code, 0);
  const auto r = run_command(cli("whatif two.h5 --device-memory 6GiB"), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::size_t rank0 = r.output.find("rank 0 device 0: the recorded settings against the same (no "
                                          "--alloc-conf), within 6.00 GiB (--device-memory)");
  const std::size_t rank1 = r.output.find("rank 1 device 0:");
  ASSERT_NE(rank0, std::string::npos) << r.output;
  ASSERT_NE(rank1, std::string::npos) << r.output;
  EXPECT_LT(rank0, rank1);
  EXPECT_NE(r.output.find("as recorded: does not fit: entry 2193, a request of 998.05 MiB", rank1), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("least headroom as configured: rank 0, short by 944.00 MiB\n"), std::string::npos)
      << r.output;
}

TEST(Whatif, WhatIsNotBuiltOrDoesNotApplyIsAUsageError) {
  TempDir dir;
  const auto gc = run_command(cli("whatif " + kH200 + " --alloc-conf garbage_collection_threshold:0.6"), dir.path());
  EXPECT_EQ(gc.exit_code, 2);
  EXPECT_NE(gc.output.find("oomflight error: --alloc-conf: garbage_collection_threshold is not modelled yet"),
            std::string::npos)
      << gc.output;
  const auto typo = run_command(cli("whatif " + kH200 + " --alloc-conf max_splt_size_mb:512"), dir.path());
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_NE(typo.output.find("'max_splt_size_mb' is not an option the model reads"), std::string::npos)
      << typo.output;
  const auto both = run_command(cli("whatif --fidelity --device-memory 8GiB " + kH200), dir.path());
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.output.find("--fidelity replays with the recorded settings"), std::string::npos) << both.output;
  const auto size = run_command(cli("whatif --device-memory 8x " + kH200), dir.path());
  EXPECT_EQ(size.exit_code, 2);
  EXPECT_NE(size.output.find("--device-memory: '8x'"), std::string::npos) << size.output;
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
