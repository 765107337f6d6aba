// Archive round trip (one rank, POSIX I/O) and the reader's errors.
#include <gtest/gtest.h>

#include <hdf5.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "oomflight/format/archive_reader.hpp"
#include "oomflight/format/archive_writer.hpp"
#include "test_support.hpp"

namespace oomflight {
namespace {

struct Fixture {
  std::vector<Event> events;
  StackTableCopy stacks;
  RankRow row;
  ArchiveHeader header;
};

Fixture make_fixture() {
  Fixture f;
  StackTable table;
  const FrameRef a[] = {{"alloc_fn", "model.py", 12}, {"main", "train.py", 3}};
  const FrameRef b[] = {{"other", "model.py", 40}};
  const auto sa = table.intern(a);
  const auto sb = table.intern(b);
  EXPECT_EQ(table.intern(a), sa);  // interned once
  f.stacks = table.copy();
  for (int i = 0; i < 5; ++i) {
    Event e;
    e.t_ns = 1000 + i;
    e.addr = 0x7f0000000000ull + static_cast<std::uint64_t>(i) * 512;
    e.size = 512;
    e.batch = 3;
    e.stack_id = i % 2 ? sb : sa;
    e.action = i == 4 ? Action::oom : Action::alloc;
    f.events.push_back(e);
  }
  f.row.rank = 0;
  f.row.batch = 3;
  f.row.allocated_bytes = 2048;
  f.row.is_origin = 1;
  f.row.oom_requested_bytes = 512;
  set_fixed_string(f.row.host, "node01");
  set_fixed_string(f.row.reason, "CUDA out of memory");
  f.header.producer = "oomflight test";
  f.header.run_name = "unit";
  f.header.kind = "oom";
  f.header.created_at_utc = "2026-11-21T00:00:00Z";
  f.header.reason = "rank 0: CUDA out of memory";
  f.header.origin_ranks = {0};
  f.header.world_size = 1;
  f.header.ranks_present = {0};
  return f;
}

// The fixture's one rank as the writer takes it (no batches, context or allocator state).
RankDump dump_of(const Fixture& f) {
  return RankDump{.row = f.row, .events = f.events, .stacks = &f.stacks, .batches = {}, .context = {},
                  .state_segments = {}, .state_blocks = {}, .collectives = {}, .communicators = {}};
}

TEST(Archive, RoundTripsOneRank) {
  test::TempDir dir;
  const auto path = (dir.path() / "a.h5").string();
  const Fixture f = make_fixture();
  write_archive(path, f.header, dump_of(f));
  const Archive a = read_archive(path);
  EXPECT_EQ(a.header.schema_version, 1);
  EXPECT_EQ(a.header.run_name, "unit");
  EXPECT_EQ(a.header.reason, "rank 0: CUDA out of memory");
  EXPECT_EQ(a.header.origin_ranks, std::vector<std::int32_t>{0});
  ASSERT_EQ(a.ranks.size(), 1u);
  EXPECT_EQ(a.ranks[0].event_count, 5u);
  EXPECT_EQ(fixed_string(a.ranks[0].host), "node01");
  EXPECT_EQ(fixed_string(a.ranks[0].reason), "CUDA out of memory");
  ASSERT_EQ(a.events.size(), 5u);
  EXPECT_EQ(a.events[4].action, Action::oom);
  EXPECT_EQ(a.events[2].addr, 0x7f0000000000ull + 1024);
  const auto frames = a.stack(a.events[0].stack_id);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(a.string(frames[0]->function), "alloc_fn");
  EXPECT_EQ(a.string(frames[1]->file), "train.py");
  EXPECT_EQ(frames[1]->line, 3);
}

std::string read_error(const std::string& path) {
  try {
    read_archive(path);
  } catch (const ArchiveError& e) {
    return e.what();
  }
  return "";
}

// A taken name is never replaced (issue 30: two jobs of one run name in one folder took each other's names): the
// next free name says whose the file is. The job id goes to the root attribute and back.
TEST(Archive, ATakenNameIsNeverReplacedAndTheNextSaysWhoseItIs) {
  test::TempDir dir;
  const auto at = [&](const char* name) { return (dir.path() / name).string(); };
  Fixture f = make_fixture();
  f.header.job_id = "aaaaaaaaaaaa";
  EXPECT_EQ(write_archive(at("x.h5"), f.header, dump_of(f)), at("x.h5"));
  EXPECT_EQ(read_archive_header(at("x.h5")).job_id, "aaaaaaaaaaaa");
  EXPECT_EQ(write_archive(at("x.h5"), f.header, dump_of(f)), at("x-1.h5")) << "this job's own: a counter";
  Fixture other = make_fixture();
  other.header.job_id = "bbbbbbbbbbbb";
  other.header.reason = "rank 0: the other job";
  EXPECT_EQ(write_archive(at("x.h5"), other.header, dump_of(other)), at("x.bbbbbbbbbbbb.h5")) << "another job's";
  EXPECT_EQ(write_archive(at("x.h5"), other.header, dump_of(other)), at("x.bbbbbbbbbbbb-1.h5"));
  EXPECT_EQ(read_archive_header(at("x.h5")).reason, "rank 0: CUDA out of memory") << "the first file is intact";
  std::ofstream(at("y.h5")) << "not an archive";
  EXPECT_EQ(write_archive(at("y.h5"), f.header, dump_of(f)), at("y.aaaaaaaaaaaa.h5")) << "a foreign file";
  // OOMFLIGHT_OVERWRITE=1: replaced, as asked.
  EXPECT_EQ(write_archive(at("x.h5"), other.header, dump_of(other), Durability::verified, Naming::replace), at("x.h5"));
  EXPECT_EQ(read_archive_header(at("x.h5")).job_id, "bbbbbbbbbbbb");
  // No job id (an older writer, a merge): the counter alone.
  Fixture plain = make_fixture();
  EXPECT_EQ(write_archive(at("y.h5"), plain.header, dump_of(plain)), at("y-1.h5"));
  EXPECT_TRUE(read_archive_header(at("y-1.h5")).job_id.empty());
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().string().find(".partial"), std::string::npos) << e.path();
  }
}

// A job id goes into file names (a merge's partial file, the names of a taken series): a file's own value is taken
// only when it is what oomflight draws, 12 lower-case hex digits (the review of issue 30: "../" from a crafted file).
TEST(Archive, AJobIdThatIsNotTwelveHexDigitsReadsAsNone) {
  test::TempDir dir;
  const std::string path = (dir.path() / "x.h5").string();
  Fixture f = make_fixture();
  f.header.job_id = "0123456789ab";
  ASSERT_EQ(write_archive(path, f.header, dump_of(f)), path);
  EXPECT_EQ(read_archive_header(path).job_id, "0123456789ab");
  for (const std::string hostile : {"../../etc/x", "0123456789AB", "0123456789abc", ""}) {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    H5Adelete(file, "job_id");
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, hostile.empty() ? 1 : hostile.size());
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attribute = H5Acreate2(file, "job_id", type, space, H5P_DEFAULT, H5P_DEFAULT);
    std::string padded = hostile;
    padded.resize(hostile.empty() ? 1 : hostile.size(), '\0');
    H5Awrite(attribute, type, padded.data());
    H5Aclose(attribute);
    H5Sclose(space);
    H5Tclose(type);
    H5Fclose(file);
    EXPECT_EQ(read_archive_header(path).job_id, "") << hostile;
    EXPECT_EQ(read_archive(path).header.job_id, "") << hostile;
  }
}

TEST(Archive, ReaderErrorsNameTheProblem) {
  test::TempDir dir;
  EXPECT_NE(read_error((dir.path() / "missing.h5").string()).find("no such file"), std::string::npos);
  const auto text = (dir.path() / "text.h5").string();
  std::ofstream(text) << "not hdf5";
  EXPECT_NE(read_error(text).find("not an HDF5 file"), std::string::npos);
  const auto other = (dir.path() / "other.h5").string();
  H5Fclose(H5Fcreate(other.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  EXPECT_NE(read_error(other).find("not an oomflight archive"), std::string::npos);
  Fixture f = make_fixture();
  f.header.schema_version = 99;
  const auto newer = (dir.path() / "newer.h5").string();
  write_archive(newer, f.header, dump_of(f));
  EXPECT_NE(read_error(newer).find("schema 99"), std::string::npos);
}

TEST(Archive, AFileWithoutTheCompleteMarkIsAnIncompleteArchive) {
  test::TempDir dir;
  const Fixture f = make_fixture();
  const auto path = (dir.path() / "a.h5").string();
  write_archive(path, f.header, dump_of(f));
  EXPECT_FALSE(std::filesystem::exists(partial_archive_path(path)));  // renamed once verified
  {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    ASSERT_GE(H5Adelete(file, kCompleteAttribute), 0);  // as if the writer died before its last write
    H5Fclose(file);
  }
  EXPECT_NE(read_error(path).find("incomplete archive"), std::string::npos) << read_error(path);
  const auto partial = partial_archive_path((dir.path() / "b.h5").string());
  std::filesystem::copy_file(path, partial);
  EXPECT_NE(read_error(partial).find("a partial file"), std::string::npos) << read_error(partial);
}

TEST(Archive, UnwritablePathIsAnErrorNamingIt) {
  const Fixture f = make_fixture();
  try {
    write_archive("/proc/oomflight/a.h5", f.header, dump_of(f));
    FAIL();
  } catch (const ArchiveError& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/oomflight/a.h5"), std::string::npos);
  }
}

// Under `ulimit -f`, a write past the limit raises SIGXFSZ, which kills by default. In a child process (the limit
// and the signal are process-wide): 100,000 events (4.8 MB) under a 64 KiB limit must be an ArchiveError naming
// the limit, with no file left and the default action back afterwards; the child must not die of the signal.
TEST(Archive, AFileSizeLimitIsAWriteErrorNotADeath) {
  test::TempDir dir;
  const std::string path = (dir.path() / "big.h5").string();
  Fixture f = make_fixture();
  f.events.resize(100000, f.events.front());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const rlimit limit{64 * 1024, 64 * 1024};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(10);
    try {
      write_archive(path, f.header, dump_of(f));
      _exit(11);  // written in spite of the limit
    } catch (const ArchiveError& e) {
      if (std::string(e.what()).find("may not write files over 65536 bytes (RLIMIT_FSIZE") == std::string::npos) {
        _exit(12);
      }
    }
    if (access(path.c_str(), F_OK) == 0 || access(partial_archive_path(path).c_str(), F_OK) == 0) _exit(13);
    struct sigaction now {};
    sigaction(SIGXFSZ, nullptr, &now);
    _exit(now.sa_handler == SIG_DFL ? 0 : 14);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_FALSE(WIFSIGNALED(status)) << "the writer died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: setrlimit, 11: written, 12: message, 13: a file left, 14: action kept";
}

}  // namespace
}  // namespace oomflight
