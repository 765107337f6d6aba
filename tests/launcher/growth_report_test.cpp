// The report's trend and growing call sites (issue 42, items 2 and 3) on a real replay: this project's H200 step on
// 8 GiB, one rank keeping 256 MiB a step (`oomflight replay --rank-leak`) until it runs out of memory, and the same
// job whose device shrinks instead (nothing grows: no such section, and no rising trend).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <fstream>
#include <iterator>
#include <string>

#include "test_support.hpp"

namespace oomflight {
namespace {

using test::cli;
using test::run_command;
using test::TempDir;

const std::string kStep = std::string(OOMFLIGHT_SOURCE_DIR) + "/examples/pytorch/snapshots/h200-transformer-lm-step1.pickle";

// The report of the one archive a replay in `dir` wrote.
std::string report_of(const TempDir& dir) {
  const auto files = test::files_with_suffix(dir.path(), ".h5");
  EXPECT_EQ(files.size(), 1u);
  if (files.empty()) return "";
  return run_command(cli("report " + files[0].string()), dir.path()).output;
}

// The lines of `text` from the one starting with `heading` to the next empty one.
std::string section(const std::string& text, const std::string& heading) {
  const std::size_t at = text.find(heading);
  if (at == std::string::npos) return "";
  const std::size_t end = text.find("\n\n", at);
  return text.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

TEST(GrowthReport, ALeakIsNamedAtItsRateAndTheTrendSaysItsRankRunsOutOfRoom) {
  TempDir dir;
  const auto r =
      run_command(cli("replay " + kStep + " --device-memory 8GiB --steps 12 --rank-leak 0=256MiB"), dir.path());
  ASSERT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("out of memory at batch 5"), std::string::npos) << r.output;
  // The job said it was coming, once, at the end of its third batch (PeakForecast), before the failure.
  const std::size_t forecast = r.output.find(
      "oomflight[rank 0] warning: rank 0: peak reserved grows 256.00 MiB a batch over batches 0-2 (the peaks stray "
      "0 B from the line, root mean square); at this rate it reaches its 8.00 GiB capacity at batch ~4\n");
  EXPECT_NE(forecast, std::string::npos) << r.output;
  EXPECT_LT(forecast, r.output.find("out of memory at batch 5")) << r.output;
  EXPECT_EQ(r.output.find("peak reserved grows", r.output.find('\n', forecast)), std::string::npos) << r.output;
  const std::string report = report_of(dir);
  const std::string growing = section(report, "call sites whose live bytes grew batch after batch");
  EXPECT_NE(growing.find("  rank 0: +256.00 MiB a batch over batches 0-4 (the live bytes stray 0 B from the line, "
                         "root mean square), 256.00 MiB to 1.25 GiB\n"
                         "        keep_activations_for_logging (oomflight replay --rank-leak:1)"),
            std::string::npos)
      << report;
  // That site only: the step's own blocks are freed each step.
  EXPECT_EQ(growing.find("  rank 0: +", growing.find("rank-leak:1")), std::string::npos) << growing;
  const std::string trend = section(report, "trend of each rank's peak reserved");
  EXPECT_NE(trend.find("  rank 0: peak reserved grows "), std::string::npos) << report;
  EXPECT_NE(trend.find("over batches 0-4"), std::string::npos) << trend;
  EXPECT_NE(trend.find("8.00 GiB capacity"), std::string::npos) << trend;
  // The page says it in the same words, with the site's frames.
  const auto files = test::files_with_suffix(dir.path(), ".h5");
  ASSERT_EQ(files.size(), 1u);
  ASSERT_EQ(run_command(cli("report " + files[0].string() + " --html page.html"), dir.path()).exit_code, 0);
  std::ifstream in(dir.path() / "page.html");
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t at = page.find("<section id=\"growth\">");
  ASSERT_NE(at, std::string::npos);
  const std::string growth = page.substr(at, page.find("</section>", at) - at);
  EXPECT_NE(growth.find("+256.00 MiB a batch over batches 0-4 (the live bytes stray 0 B from the line, root mean "
                        "square), 256.00 MiB to 1.25 GiB"),
            std::string::npos)
      << growth;
  EXPECT_NE(growth.find("keep_activations_for_logging"), std::string::npos) << growth;
}

TEST(GrowthReport, AJobThatDoesNotGrowHasNoSuchSectionAndNoRisingTrend) {
  // (and no forecast while it runs)
  // Four steps on 8 GiB, then the device shrinks to 6 GiB (another process took memory): it fails at batch 4.
  TempDir dir;
  const auto r = run_command(cli("replay " + kStep + " --device-memory 8GiB --steps 6 --rank-device-memory 0=6GiB "
                                 "--rank-memory-from-step 4"),
                             dir.path());
  ASSERT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output.find("peak reserved grows"), std::string::npos) << r.output;
  const std::string report = report_of(dir);
  EXPECT_EQ(report.find("call sites whose live bytes grew"), std::string::npos) << report;
  EXPECT_NE(report.find("  rank 0: no rising trend in peak reserved over batches 0-3"), std::string::npos) << report;
}

}  // namespace
}  // namespace oomflight
