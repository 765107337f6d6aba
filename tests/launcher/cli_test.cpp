// The `oomflight` command's conventions: exit codes (README "Exit codes"), --version, errors that name what was
// wrong in oomflight's log format, and the demo script's refusal to run without its snapshots.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "oomflight/version.h"
#include "test_support.hpp"

namespace oomflight {
namespace {

using test::run_command;
using test::TempDir;

using test::cli;

TEST(Cli, VersionAndHelpSucceed) {
  TempDir dir;
  const auto version = run_command(cli("--version"), dir.path());
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.output, "oomflight " OOMFLIGHT_VERSION_STRING "\n");
  const auto help = run_command(cli("--help"), dir.path());
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("replay"), std::string::npos) << help.output;
}

TEST(Cli, UsageErrorsExitTwoAndNameTheProblem) {
  TempDir dir;
  for (const char* args : {"", "bogus", "replay", "report", "replay t.pickle", "report a.h5 --top many",
                           "replay t.pickle --device-memory 1GiB --steps 0"}) {
    const auto r = run_command(cli(args), dir.path());
    EXPECT_EQ(r.exit_code, 2) << "oomflight " << args << "\n" << r.output;
  }
  const auto bad_rank = run_command(cli("replay t.pickle --device-memory 1GiB --rank-device-memory two=1GiB"),
                                    dir.path());
  EXPECT_EQ(bad_rank.exit_code, 2);
  EXPECT_NE(bad_rank.output.find("oomflight error: --rank-device-memory 'two=1GiB': expected RANK=SIZE"),
            std::string::npos)
      << bad_rank.output;
  for (const char* delay : {"2", "x=1s", "2=soon"}) {
    const auto bad_delay = run_command(
        cli((std::string("replay t.pickle --device-memory 1GiB --rank-delay ") + delay).c_str()), dir.path());
    EXPECT_EQ(bad_delay.exit_code, 2) << bad_delay.output;
    EXPECT_NE(bad_delay.output.find(std::string("oomflight error: --rank-delay '") + delay + "'"), std::string::npos)
        << bad_delay.output;
  }
  const auto bad_size = run_command(cli("replay t.pickle --device-memory lots"), dir.path());
  EXPECT_EQ(bad_size.exit_code, 2);
  EXPECT_NE(bad_size.output.find("--device-memory: "), std::string::npos) << bad_size.output;
  EXPECT_NE(bad_size.output.find("lots"), std::string::npos) << bad_size.output;
  const auto bad_setting = run_command("env OOMFLIGHT_DUMP_TIMEOUT=soon " + cli("run -- true"), dir.path());
  EXPECT_EQ(bad_setting.exit_code, 2);
  EXPECT_NE(bad_setting.output.find("oomflight error: OOMFLIGHT_DUMP_TIMEOUT='soon'"), std::string::npos)
      << bad_setting.output;
}

// Inputs that would destroy or mix data are refused with exit 2 and a message naming what is wrong; nothing is
// written over an input or an existing archive.
TEST(Cli, RefusesOutOfRangeNumbersAndOutputsThatWouldDestroyData) {
  TempDir dir;
  const std::string pickle = test::own_snapshot();
  const auto imported = run_command(cli(fmt::format("import {} -o a.h5", pickle)), dir.path());
  ASSERT_EQ(imported.exit_code, 0) << imported.output;
  const auto size = std::filesystem::file_size(dir.path() / "a.h5");
  const auto refused = [&](const std::string& args, const std::string& says) {
    const auto r = run_command(cli(args), dir.path());
    EXPECT_EQ(r.exit_code, 2) << "oomflight " << args << "\n" << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << "oomflight " << args << "\n" << r.output;
  };
  refused("report a.h5 --top -5", "--top");
  refused("report a.h5 --frames -1", "--frames");
  refused("report a.h5 --frames 99999999999999999999", "--frames");
  refused("export a.h5 --format folded -o a.h5", "the output a.h5 is the input a.h5");
  refused("export a.h5 --format perfetto -o ./a.h5", "is the input a.h5");
  refused(fmt::format("import {} -o a.h5", pickle), "a.h5 exists: give --force");
  refused(fmt::format("import {} -o b.h5 --ranks 2147483647", pickle), "--ranks");
  refused(fmt::format("import {} -o b.h5 --world-size 0", pickle), "--world-size");
  refused("import . -o b.h5", ". is a folder, not a snapshot pickle");
  refused("import a.h5 -o b.h5", "a.h5 is an HDF5 file (an oomflight archive?");
  refused("merge a.h5 -o a.h5", "is the input");
  EXPECT_EQ(std::filesystem::file_size(dir.path() / "a.h5"), size) << "an input was written over";
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "b.h5"));
  // Asked for, an existing archive is replaced.
  const auto forced = run_command(cli(fmt::format("import {} -o a.h5 --force --ranks 3", pickle)), dir.path());
  EXPECT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_NE(forced.output.find("ranks 3 (1 of 4)"), std::string::npos) << forced.output;
}

TEST(Cli, RunExecsTheCommandOrSaysWhyNot) {
  TempDir dir;
  EXPECT_EQ(run_command(cli("run -- sh -c 'exit 7'"), dir.path()).exit_code, 7);  // the command's own status
  const auto missing = run_command(cli("run -- /nonexistent/train.py"), dir.path());
  EXPECT_EQ(missing.exit_code, 127);
  EXPECT_NE(missing.output.find("cannot run '/nonexistent/train.py'"), std::string::npos) << missing.output;
  std::ofstream(dir.path() / "not-executable.sh") << "echo hi\n";
  EXPECT_EQ(run_command(cli("run -- ./not-executable.sh"), dir.path()).exit_code, 126);
}

TEST(Report, ClearErrorsForMissingAndForeignFiles) {
  TempDir dir;
  const auto missing = run_command(fmt::format("{} report nothing.h5", OOMFLIGHT_CLI), dir.path());
  EXPECT_EQ(missing.exit_code, 1);  // a runtime failure, not a usage error
  EXPECT_NE(missing.output.find("nothing.h5: no such file"), std::string::npos) << missing.output;
  std::ofstream(dir.path() / "notes.txt") << "hello";
  const auto foreign = run_command(fmt::format("{} report notes.txt", OOMFLIGHT_CLI), dir.path());
  EXPECT_EQ(foreign.exit_code, 1);
  EXPECT_NE(foreign.output.find("not an HDF5 file"), std::string::npos) << foreign.output;
}

TEST(Report, AReaderOfItsOutputThatGoesAwayIsNotACrash) {
  // `oomflight report A.h5 | head -1`: the report dies of SIGPIPE in its reader process, which is not the HDF5
  // library crashing on a damaged file; it ends quietly, as any filter would.
  TempDir dir;
  const std::string snapshot = test::own_snapshot();
  ASSERT_EQ(run_command(cli(fmt::format("import {} -o a.h5", snapshot)), dir.path()).exit_code, 0);
  const auto whole = run_command(cli("report a.h5"), dir.path());
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  ASSERT_GT(std::count(whole.output.begin(), whole.output.end(), '\n'), 20) << whole.output;
  // A reader that is gone before the first line (a pipe whose read end is closed: deterministic, unlike `head`,
  // which may leave only after the whole report fit in the pipe's buffer).
  std::ofstream(dir.path() / "gone.py")
      << "import os, subprocess, sys\n"
         "r, w = os.pipe()\n"
         "os.close(r)\n"
         "p = subprocess.run(sys.argv[1:], stdout=w, stderr=subprocess.PIPE)\n"
         "print('status', p.returncode)\n"
         "print(p.stderr.decode())\n";
  const auto cut = run_command("python3 gone.py " + cli("report a.h5"), dir.path());
  EXPECT_NE(cut.output.find("status -13"), std::string::npos) << cut.output;  // ended by SIGPIPE, as filters do
  EXPECT_EQ(cut.output.find("crashed"), std::string::npos) << cut.output;
}

TEST(Report, ReadsAnArchiveThatAnotherProcessHoldsLocked) {
  // HDF5 (1.10.7 on) flock()s every file it opens, and refuses one that another process holds locked, as it
  // refuses every file on a file system without flock (Lustre without the mount option): oomflight opens its
  // files without HDF5's lock. Here a process holds an exclusive flock on the archive while report and export run.
  TempDir dir;
  const std::string snapshot = test::own_snapshot();
  ASSERT_EQ(run_command(cli(fmt::format("import {} -o a.h5", snapshot)), dir.path()).exit_code, 0);
  std::ofstream(dir.path() / "locked.py")
      << "import fcntl, subprocess, sys\n"
         "f = open('a.h5', 'rb')\n"
         "fcntl.flock(f, fcntl.LOCK_EX)\n"
         "sys.exit(subprocess.run(sys.argv[1:]).returncode)\n";
  const auto report = run_command("python3 locked.py " + cli("report a.h5"), dir.path());
  EXPECT_EQ(report.exit_code, 0) << report.output;
  EXPECT_NE(report.output.find("origin"), std::string::npos) << report.output;
  const auto merged = run_command("python3 locked.py " + cli("merge a.h5 -o b.h5"), dir.path());
  EXPECT_EQ(merged.exit_code, 0) << merged.output;
}

TEST(Demo, RefusesToRunWithoutItsSnapshotAndSaysWhere) {
  // The demo script alone, in a folder that is not a checkout: it names the committed snapshot it did not find.
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "scripts");
  std::filesystem::copy_file(std::filesystem::path(OOMFLIGHT_SOURCE_DIR) / "scripts/demo.sh",
                             dir.path() / "scripts/demo.sh");
  const auto r = run_command("bash scripts/demo.sh", dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("demo: FAILED: no PyTorch snapshot at " + dir.path().string() +
                          "/examples/pytorch/snapshots/h200-transformer-lm-step1.pickle"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace oomflight
