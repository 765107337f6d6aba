// `oomflight replay --alloc-conf`: the simulated device with the allocator model's decisions (plugins/sim,
// allocator_replay.hpp) on this project's H200 step, as a user runs it: a device where the recorded decisions run out
// of memory and max_split_size_mb:256 fits, the archive of a configured replay (what it says it ran under, and the
// model's own decisions replayed again, entry for entry), several steps, and the options it refuses.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <regex>
#include <string>

#include "test_support.hpp"

namespace oomflight {
namespace {

using test::run_command;
using test::TempDir;

using test::cli;

const std::string kH200 = std::string(OOMFLIGHT_SOURCE_DIR) + "/examples/pytorch/snapshots/h200-transformer-lm-step1.pickle";

// The line of `output` that starts (after spaces) with `prefix`, without them.
std::string line_with(const std::string& output, const std::string& prefix) {
  const std::size_t at = output.find(prefix);
  return at == std::string::npos ? std::string() : output.substr(at, output.find('\n', at) - at);
}

TEST(ReplayAllocConf, MaxSplitSizeFitsADeviceWhereTheRecordedDecisionsRunOutOfMemory) {
  // 6.6 GiB: the recorded run reserved 6.93 GiB at its peak, and its cached 1000 MiB blocks split for small requests
  // leave the logits' 998 MiB nowhere to go; with max_split_size_mb:256 they are not split, and the step fits.
  TempDir recorded, configured;
  const auto fails = run_command(cli("replay " + kH200 + " --device-memory 6.6GiB"), recorded.path());
  EXPECT_EQ(fails.exit_code, 1) << fails.output;
  EXPECT_NE(fails.output.find("Tried to allocate 1000.00 MiB"), std::string::npos) << fails.output;
  EXPECT_EQ(test::files_with_suffix(recorded.path(), ".h5").size(), 1u);

  const auto fits =
      run_command(cli("replay " + kH200 + " --device-memory 6.6GiB --alloc-conf max_split_size_mb:256"),
                  configured.path());
  EXPECT_EQ(fits.exit_code, 0) << fits.output;
  EXPECT_NE(fits.output.find("replayed 1 step(s)"), std::string::npos) << fits.output;
  EXPECT_NE(fits.output.find("of 6.60 GiB"), std::string::npos) << fits.output;
  EXPECT_TRUE(test::files_with_suffix(configured.path(), ".h5").empty()) << fits.output;

  // whatif, on the trace, says the same of both (the same replay drives both).
  const auto w = run_command(cli("whatif " + kH200 + " --device-memory 6.6GiB --alloc-conf max_split_size_mb:256"),
                             recorded.path());
  EXPECT_NE(w.output.find("as recorded: does not fit"), std::string::npos) << w.output;
  EXPECT_NE(w.output.find("as configured: fits"), std::string::npos) << w.output;
}

TEST(ReplayAllocConf, ItsArchiveSaysWhatItRanUnderAndTheModelReproducesItsOwnDecisions) {
  TempDir dir;
  const auto r =
      run_command(cli("replay " + kH200 + " --device-memory 6GiB --alloc-conf max_split_size_mb:256"), dir.path());
  ASSERT_EQ(r.exit_code, 1) << r.output;
  const auto files = test::files_with_suffix(dir.path(), ".h5");
  ASSERT_EQ(files.size(), 1u) << r.output;
  const std::string archive = files[0].string();

  const auto report = run_command(cli("report " + archive), dir.path());
  EXPECT_NE(report.output.find("allocator_settings.PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:256"), std::string::npos)
      << report.output;
  EXPECT_NE(report.output.find("allocator_settings.max_split_size=268435456"), std::string::npos) << report.output;

  // Replayed under the settings the archive records, the model places every allocation where it placed it, and
  // reserves and releases every segment as it did: its decisions are a function of the program's requests.
  const auto fidelity = run_command(cli("whatif " + archive + " --fidelity"), dir.path());
  EXPECT_EQ(fidelity.exit_code, 0) << fidelity.output;
  std::smatch m;
  const std::string line = line_with(fidelity.output, "rank 0 device 0: fidelity:");
  ASSERT_TRUE(std::regex_search(line, m, std::regex(R"((\d+) of (\d+) allocations .* (\d+) of (\d+) segment)")))
      << fidelity.output;
  EXPECT_EQ(m[1], m[2]) << line;
  EXPECT_EQ(m[3], m[4]) << line;
  EXPECT_GT(std::stoi(m[2]), 900) << line;
  EXPECT_GT(std::stoi(m[4]), 60) << line;

  // Its "as recorded" is the configured replay of the trace: the same request fails with the same reserved bytes
  // after the same release (the entry's number is the archive's trace's, not the snapshot's).
  const auto of_archive = run_command(cli("whatif " + archive), dir.path());
  const auto of_trace =
      run_command(cli("whatif " + kH200 + " --device-memory 6GiB --alloc-conf max_split_size_mb:256"), dir.path());
  const std::string a = line_with(of_archive.output, "as recorded: does not fit");
  const std::string t = line_with(of_trace.output, "as configured: does not fit");
  ASSERT_FALSE(a.empty()) << of_archive.output;
  ASSERT_FALSE(t.empty()) << of_trace.output;
  EXPECT_EQ(a.substr(a.find("a request of")), t.substr(t.find("a request of")));
}

TEST(ReplayAllocConf, StepAfterStepTheModelsCacheReachesTheSamePeakReserved) {
  // Between steps the blocks of the step are freed and those that predate it allocated again, through the model:
  // its cache carries over, as a real allocator's does, and every step reserves at its peak what the first did.
  TempDir one, three;
  const auto a = run_command(
      cli("replay " + kH200 + " --device-memory 8GiB --alloc-conf max_split_size_mb:256"), one.path());
  const auto b = run_command(
      cli("replay " + kH200 + " --device-memory 8GiB --steps 3 --alloc-conf max_split_size_mb:256"), three.path());
  EXPECT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(b.exit_code, 0) << b.output;
  std::smatch ma, mb;
  const std::regex peak(R"(peak reserved ([0-9.]+ [KMG]iB) of 8.00 GiB, peak allocated ([0-9.]+ [KMG]iB))");
  ASSERT_TRUE(std::regex_search(a.output, ma, peak)) << a.output;
  ASSERT_TRUE(std::regex_search(b.output, mb, peak)) << b.output;
  EXPECT_NE(b.output.find("replayed 3 step(s)"), std::string::npos) << b.output;
  EXPECT_EQ(ma[1], mb[1]);  // reserved: the cache the first step built serves the next ones
  // Allocated may not be the first step's to the byte: the blocks that predate the trace are placed again by the
  // model, and one may take a cached block it does not split (at or above max_split_size, up to 20 MiB larger than
  // asked), which counts whole, as torch counts it.
  EXPECT_EQ(ma[2], "6.30 GiB");
  EXPECT_EQ(mb[2], "6.31 GiB");
}

TEST(ReplayAllocConf, AFailedRequestThatFitsAsConfiguredIsFreedWithItsStep) {
  // A trace that ends in torch's oom entry (the 6 GiB replay's archive, exported back to a snapshot): on 8 GiB with
  // max_split_size_mb:256 the failed 998 MiB request fits, and the rewind between steps frees it with the step's
  // other blocks. It was kept once a step before (7.28 GiB allocated at the third step: out of memory).
  TempDir dir;
  ASSERT_EQ(run_command(cli("replay " + kH200 + " --device-memory 6GiB"), dir.path()).exit_code, 1);
  const auto archives = test::files_with_suffix(dir.path(), ".h5");
  ASSERT_EQ(archives.size(), 1u);
  ASSERT_EQ(run_command(cli("export " + archives[0].string() + " --format memory_viz -o mv"), dir.path()).exit_code, 0);
  const auto pickles = test::files_with_suffix(dir.path() / "mv", ".pickle");
  ASSERT_EQ(pickles.size(), 1u);
  const std::string replay =
      "replay " + pickles[0].string() + " --device-memory 8GiB --alloc-conf max_split_size_mb:256";
  const auto one = run_command(cli(replay), dir.path());
  const auto three = run_command(cli(replay + " --steps 3"), dir.path());
  EXPECT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(three.exit_code, 0) << three.output;
  const std::regex peak(R"(peak reserved ([0-9.]+ [KMG]iB) of 8.00 GiB)");
  std::smatch a, b;
  ASSERT_TRUE(std::regex_search(one.output, a, peak)) << one.output;
  ASSERT_TRUE(std::regex_search(three.output, b, peak)) << three.output;
  EXPECT_EQ(a[1], b[1]);
}

TEST(ReplayAllocConf, OptionsItCannotReplayAreNamedBeforeTheTraceIsRead) {
  TempDir dir;
  const auto expandable =
      run_command(cli("replay missing.pickle --device-memory 6GiB --alloc-conf expandable_segments:True"), dir.path());
  EXPECT_NE(expandable.exit_code, 0);
  EXPECT_NE(expandable.output.find("--alloc-conf: expandable_segments:True is not replayed on the simulated device"),
            std::string::npos)
      << expandable.output;
  const auto async =
      run_command(cli("replay missing.pickle --device-memory 6GiB --alloc-conf backend:cudaMallocAsync"), dir.path());
  EXPECT_NE(async.exit_code, 0);
  EXPECT_NE(async.output.find("backend:cudaMallocAsync is not PyTorch's caching allocator"), std::string::npos)
      << async.output;
  const auto unknown = run_command(cli("replay missing.pickle --device-memory 6GiB --alloc-conf max_split:9"),
                                   dir.path());
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.output.find("'max_split' is not an option the model reads"), std::string::npos)
      << unknown.output;
  EXPECT_EQ(unknown.output.find("missing.pickle"), std::string::npos) << unknown.output;  // never got that far
}

}  // namespace
}  // namespace oomflight
