// oomflight_join_store: ranks that no MPI launcher started, joined through a store every rank reaches (the
// PyTorch package hands over the job's c10d store; python/tests/test_torch_run.py runs real torchrun jobs). Here the
// ranks are forked processes and the store is a folder of files (a set is a rename, an add a read-modify-write
// under flock): the protocol's rules (one archive of every rank, a rank that left is not waited for, the settings
// that must agree) checked without torch, in seconds.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "oomflight/format/archive_reader.hpp"
#include "oomflight/oomflight.h"
#include "test_support.hpp"

namespace oomflight {
namespace {

namespace fs = std::filesystem;

// Set in a rank that must die (SIGKILL) as it claims the merge of dump 0: a merging rank that dies mid-dump.
bool g_die_at_claim = false;

// Every request this process made of its store: what a test of the store's load counts.
std::atomic<long> g_requests{0};

// Called with each key this process sets (before the set), when a test gives it: what acts at one step of a dump.
void (*g_on_set)(const char* key) = nullptr;

// When set, every call to the store fails (a store whose server went away).
std::atomic<bool> g_store_down{false};

// How many times oomflight released a store of this process (oomflight_store.release), and whether it then called
// one again (it must not: the plugin's reference is gone).
std::atomic<int> g_releases{0};
std::atomic<int> g_calls_after_release{0};

// A store in a folder: one file per key ('/' in a key becomes '%').
struct FolderStore {
  fs::path dir;
  fs::path file(const char* key) const {
    std::string name = key;
    for (char& c : name) c = c == '/' ? '%' : c;
    return dir / name;
  }
  bool released = false;
  static int set(void* user, const char* key, const void* value, size_t size) {
    ++g_requests;
    if (g_store_down) return -1;
    if (static_cast<FolderStore*>(user)->released) ++g_calls_after_release;
    if (g_on_set != nullptr) g_on_set(key);
    const auto& s = *static_cast<FolderStore*>(user);
    const fs::path tmp = s.file(key).string() + ".tmp" + std::to_string(getpid());
    std::ofstream(tmp, std::ios::binary).write(static_cast<const char*>(value), static_cast<std::streamsize>(size));
    fs::rename(tmp, s.file(key));
    return 0;
  }
  static int get(void* user, const char* key, void* buffer, size_t capacity, size_t* size) {
    ++g_requests;
    if (g_store_down) return -1;
    if (static_cast<FolderStore*>(user)->released) ++g_calls_after_release;
    std::ifstream in(static_cast<FolderStore*>(user)->file(key), std::ios::binary);
    if (!in) return 0;
    const std::string value((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    *size = value.size();
    std::memcpy(buffer, value.data(), std::min(capacity, value.size()));
    return 1;
  }
  static int add(void* user, const char* key, int64_t delta, int64_t* value) {
    if (g_die_at_claim && std::strcmp(key, "d0/claim") == 0) raise(SIGKILL);
    if (g_store_down) {
      ++g_requests;
      return -1;
    }
    // One request, counted by the set below.
    const auto& s = *static_cast<FolderStore*>(user);
    const int lock = open((s.dir / "lock").c_str(), O_CREAT | O_RDWR, 0600);
    flock(lock, LOCK_EX);
    int64_t v = 0;
    std::ifstream(s.file(key)) >> v;
    v += delta;
    const std::string text = std::to_string(v);
    set(user, key, text.data(), text.size());
    close(lock);
    *value = v;
    return 0;
  }
  // Marks the release in the store's folder too (released.<pid>), so that a test sees releases that happen at the
  // session's end, after the rank's body.
  static void release(void* user) {
    auto& s = *static_cast<FolderStore*>(user);
    s.released = true;
    ++g_releases;
    std::ofstream(s.dir / ("released." + std::to_string(getpid()))) << g_calls_after_release.load();
  }
};

class StoreJoin : public ::testing::Test {
 protected:
  // Forks `world` ranks; each sets `env` (plus its own), starts oomflight, joins, records 100 events of its own and
  // runs `body(rank)`; its stderr goes to rank<R>.log. Returns the exit statuses.
  // Two ranks: rank 0 asks for a dump (`rank_0s_dump`) once rank 1 started, and rank 1 fails (`late_reason`) after
  // its history was frozen for that dump (fail_after_writing_dump_0, its marker `late`). Returns the exit statuses.
  std::vector<int> rank_1_fails_during_rank_0s_dump(const char* late_reason, const std::function<void()>& rank_0s_dump);

  std::vector<int> run_ranks(int world, const std::function<void(int)>& body,
                             const std::function<void(int)>& before_init = {}) {
    fs::create_directories(store_dir());
    std::vector<pid_t> pids;
    for (int rank = 0; rank < world; ++rank) {
      const pid_t pid = fork();
      if (pid == 0) {
        std::freopen(log_path(rank).c_str(), "w", stderr);
        setenv("OOMFLIGHT_FOLDER", (dir_.path() / "out").c_str(), 1);
        setenv("OOMFLIGHT_DUMP_TIMEOUT", "60s", 1);
        if (before_init) before_init(rank);
        if (oomflight_init() != OOMFLIGHT_OK) _exit(90);
        static FolderStore folder;
        folder.dir = store_dir();
        oomflight_store store{sizeof(oomflight_store), &folder, &FolderStore::set, &FolderStore::get,
                              &FolderStore::add, nullptr, &FolderStore::release};
        if (oomflight_join_store(&store, rank, world, rank) != OOMFLIGHT_OK) _exit(91);
        for (int i = 0; i < 100; ++i) {
          oomflight_record(OOMFLIGHT_ALLOC, 0, 0x1000000ull * (rank + 1) + 512ull * i, 512, 0, -1);
        }
        body(rank);
        std::fflush(stderr);
        _exit(oomflight_shutdown() == OOMFLIGHT_OK ? 0 : 92);
      }
      pids.push_back(pid);
    }
    std::vector<int> statuses;
    for (pid_t pid : pids) {
      int status = 0;
      waitpid(pid, &status, 0);
      statuses.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
    return statuses;
  }
  // 3 ranks: rank 2 runs `rank_two` and ends; rank 1 runs out of memory once `marker` (a key of the store) exists;
  // rank 0 ends after that dump.
  std::vector<int> oom_on_one_after(const fs::path& marker, const std::function<void()>& rank_two) {
    const fs::path done = dir_.path() / "done";
    return run_ranks(3, [&](int rank) {
      if (rank == 2) {
        rank_two();
      } else if (rank == 1) {
        wait_for(marker);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        oomflight_trigger_oom(0, "CUDA out of memory", 1, 1);
        std::ofstream(done) << "x";
      } else {
        wait_for(done);
      }
    });
  }
  // `world` ranks: rank `origin` runs out of memory `pause` after its join; the others wait until its dump returned.
  std::vector<int> oom_on(int world, int origin, std::chrono::milliseconds pause,
                          const std::function<void(int)>& before_init) {
    const fs::path done = dir_.path() / "done";
    return run_ranks(
        world,
        [&](int rank) {
          if (rank != origin) {
            wait_for(done);
            return;
          }
          std::this_thread::sleep_for(pause);
          oomflight_trigger_oom(0, "CUDA out of memory", 1, 1);
          std::ofstream(done) << "x";
        },
        before_init);
  }
  // 2 ranks: rank 1's allocator hook records an oom event at batch 3 (4 KiB asked, 1000 B free), then rank 0 runs
  // out of memory, and rank 1's failing thread asks for its dump with `reason` once `ask_when` returns; its status
  // and the path of its dump go to rank1-result (rank1_result()). Returns the ranks' exit statuses.
  std::vector<int> oom_event_on_one_then_oom_on_zero(const std::function<void()>& ask_when, const char* reason) {
    const fs::path oom1 = dir_.path() / "oom1";
    const fs::path result_file = dir_.path() / "rank1-result";
    return run_ranks(2, [&](int rank) {
      if (rank == 1) {
        oomflight_mark_batch(3);
        oomflight_record(OOMFLIGHT_OOM, 0, 1000, 4096, 0, -1);
        std::ofstream(oom1) << "x";
        ask_when();
        oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
        request.kind = OOMFLIGHT_DUMP_OOM;
        request.reason = reason;
        oomflight_dump_result result = OOMFLIGHT_DUMP_RESULT_INIT;
        const int rc = oomflight_request_dump(&request, &result);
        std::ofstream(result_file) << rc << "\n" << oomflight_last_dump_path();
      } else {
        wait_for(oom1);
        oomflight_trigger_oom(0, "CUDA out of memory (rank 0)", 1, 1);
        std::ofstream(dir_.path() / "done") << "x";
      }
      wait_for(result_file);
    });
  }
  std::pair<int, std::string> rank1_result() const {
    int rc = -1;
    std::string path;
    std::ifstream(dir_.path() / "rank1-result") >> rc >> path;
    return {rc, path};
  }
  fs::path store_dir() const { return dir_.path() / "store"; }
  std::string log_path(int rank) const { return (dir_.path() / ("rank" + std::to_string(rank) + ".log")).string(); }
  std::string log(int rank) const {
    std::ifstream in(log_path(rank));
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  // Waits (bounded) for a file of the store: what a rank's body waits on to act after another rank.
  static bool wait_for(const fs::path& path) {
    for (int i = 0; i < 6000 && !fs::exists(path); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return fs::exists(path);
  }
  // The one file the dump left (no rank-local file beside it), read.
  Archive the_only_file(int rank_with_the_log) const {
    const auto files = test::files_with_suffix(dir_.path() / "out", ".h5");
    EXPECT_EQ(files.size(), 1u) << log(rank_with_the_log);
    if (files.size() != 1) throw std::runtime_error("not one file");
    return read_archive(files[0].string());
  }
  test::TempDir dir_;
};

TEST_F(StoreJoin, ArgumentsAreCheckedAndAProcessWithoutASessionCannotJoin) {
  FolderStore folder{store_dir()};
  oomflight_store store{sizeof(oomflight_store), &folder, &FolderStore::set, &FolderStore::get, &FolderStore::add,
                        nullptr, &FolderStore::release};
  EXPECT_EQ(oomflight_join_store(&store, 0, 2, 0), OOMFLIGHT_ESTATE);
  EXPECT_NE(std::string(oomflight_last_error()).find("oomflight_init was not called"), std::string::npos);
  EXPECT_EQ(oomflight_join_store(nullptr, 0, 2, 0), OOMFLIGHT_EINVAL);
  EXPECT_EQ(oomflight_join_store(&store, 2, 2, 0), OOMFLIGHT_EINVAL);
  EXPECT_NE(std::string(oomflight_last_error()).find("rank 2 and local rank 0 of world size 2"), std::string::npos)
      << oomflight_last_error();
  oomflight_store small = store;
  small.struct_size = 8;
  EXPECT_EQ(oomflight_join_store(&small, 0, 2, 0), OOMFLIGHT_EINVAL);
  oomflight_store no_add = store;
  no_add.add = nullptr;
  EXPECT_EQ(oomflight_join_store(&no_add, 0, 2, 0), OOMFLIGHT_EINVAL);
}

// Every rank's watcher polls the one store the job has: in a job of 1,000 ranks each asks at most every 0.5 s
// (store_pacing.hpp: 2,000 requests a second for the whole job), not every OOMFLIGHT_POLL_INTERVAL (10 ms). Rank 0
// (hellos) and rank 1 (rank 0's verdict) of such a job, alone, idle for 2 s while they wait for the others.
TEST_F(StoreJoin, AnIdleRankOfALargeJobAsksTheStoreRarely) {
  fs::create_directories(store_dir());
  for (int rank : {0, 1}) {
    const pid_t pid = fork();
    if (pid == 0) {
      std::freopen(log_path(rank).c_str(), "w", stderr);
      setenv("OOMFLIGHT_FOLDER", (dir_.path() / "out").c_str(), 1);
      if (oomflight_init() != OOMFLIGHT_OK) _exit(90);
      FolderStore folder{store_dir()};
      oomflight_store store{sizeof(oomflight_store), &folder, &FolderStore::set, &FolderStore::get,
                            &FolderStore::add, nullptr, &FolderStore::release};
      if (oomflight_join_store(&store, rank, 1000, 0) != OOMFLIGHT_OK) _exit(91);
      const long before = g_requests.load();
      std::this_thread::sleep_for(std::chrono::seconds(2));
      const long idle = g_requests.load() - before;
      std::ofstream(dir_.path() / ("requests" + std::to_string(rank))) << idle;
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log(rank);
    long idle = -1;
    std::ifstream(dir_.path() / ("requests" + std::to_string(rank))) >> idle;
    EXPECT_GE(idle, 1) << "rank " << rank << " never looked";  // it does poll: 4 looks in 2 s
    EXPECT_LE(idle, 6) << "rank " << rank;  // a 10 ms poll made about 200 each
  }
}

// Rank 0 gathers the hellos and publishes the verdict: without it, another rank says so after two deadlines, and
// its OOM is still written (its own archive).
TEST_F(StoreJoin, WithoutRankZeroARankSaysSoAndDumpsAlone) {
  fs::create_directories(store_dir());
  const pid_t pid = fork();
  if (pid == 0) {
    std::freopen(log_path(1).c_str(), "w", stderr);
    setenv("OOMFLIGHT_FOLDER", (dir_.path() / "out1").c_str(), 1);
    setenv("OOMFLIGHT_DUMP_TIMEOUT", "1s", 1);
    if (oomflight_init() != OOMFLIGHT_OK) _exit(90);
    FolderStore folder{store_dir()};
    oomflight_store store{sizeof(oomflight_store), &folder, &FolderStore::set, &FolderStore::get, &FolderStore::add,
                          nullptr, &FolderStore::release};
    if (oomflight_join_store(&store, 1, 2, 1) != OOMFLIGHT_OK) _exit(91);
    oomflight_record(OOMFLIGHT_ALLOC, 0, 0x1000, 512, 0, -1);
    std::this_thread::sleep_for(std::chrono::milliseconds(2600));
    oomflight_trigger_oom(0, "CUDA out of memory", 1, 1);
    std::fflush(stderr);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log(1);
  EXPECT_NE(log(1).find("rank 0 did not publish the ranks' agreement within 2.000 s (2 x OOMFLIGHT_DUMP_TIMEOUT); no "
                        "dump is coordinated between ranks"),
            std::string::npos)
      << log(1);
  const auto files = test::files_with_suffix(dir_.path() / "out1", ".h5");
  ASSERT_EQ(files.size(), 1u) << log(1);
  const Archive a = read_archive(files[0].string());
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{1}));
  EXPECT_EQ(a.events.size(), 2u);  // its allocation and its OOM
}

// A rank that gave up waiting for rank 0's verdict (rank 0 joined more than two deadlines after it) still adopts
// it when it comes: it is in the dumps the others coordinate, not left out of them for the rest of the job.
TEST_F(StoreJoin, ARankThatGaveUpOnRankZeroAdoptsItsLateAgreement) {
  const auto statuses = oom_on(
      2, 0, std::chrono::milliseconds(500),
      [](int rank) {
        setenv("OOMFLIGHT_DUMP_TIMEOUT", "1s", 1);
        if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2600));  // rank 1 gives up at 2 s
      });
  EXPECT_EQ(statuses, (std::vector<int>{0, 0}));
  EXPECT_NE(log(1).find("rank 0 did not publish the ranks' agreement within 2.000 s"), std::string::npos) << log(1);
  EXPECT_NE(log(1).find("rank 0's agreement came after this rank's deadline; it holds from now on"),
            std::string::npos)
      << log(1);
  const Archive a = the_only_file(0);
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{0, 1})) << log(0) << log(1);
}

// Rank 1 of 3 runs out of memory: every rank's history is in one archive (origin 1, its reason), nothing else is left.
TEST_F(StoreJoin, AnOomOnOneRankGivesOneArchiveOfEveryRank) {
  const fs::path done = dir_.path() / "done";
  const auto statuses = run_ranks(3, [&](int rank) {
    if (rank == 1) {
      oomflight_trigger_oom(0, "CUDA out of memory. Tried to allocate 2.00 GiB", 2ull << 30, 1ull << 20);
      std::ofstream(done) << oomflight_last_dump_path();
    } else {
      wait_for(done);
    }
  });
  EXPECT_EQ(statuses, (std::vector<int>{0, 0, 0}));
  const Archive a = the_only_file(1);
  EXPECT_EQ(a.header.world_size, 3);
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{0, 1, 2}));
  EXPECT_EQ(a.header.origin_ranks, (std::vector<std::int32_t>{1}));
  EXPECT_EQ(a.header.reason, "rank 1: CUDA out of memory. Tried to allocate 2.00 GiB");
  ASSERT_EQ(a.ranks.size(), 3u);
  for (const RankRow& row : a.ranks) {
    const auto events = a.events_of(row);
    std::size_t mine = 0;
    for (const Event& e : events) mine += e.size == 512 && e.addr / 0x1000000ull == row.rank + 1u ? 1 : 0;
    EXPECT_EQ(mine, 100u) << "rank " << row.rank;
  }
  EXPECT_NE(log(1).find("archive " + a.path + " written by 3 of 3 ranks in "), std::string::npos) << log(1);
}

// Watchers that look at the store every 3 s: the origin rings the doorbells of its node's ranks (the job's store
// told each rank its peers' at the agreement), so they look at once, as MPI's watchers do with a trigger (issue 40,
// item 7). Their logs say how each one saw the cause. A look of the pace's own may coincide with the cause (a
// millisecond in 3 s): at least one of the two is asserted woken by the ring.
TEST_F(StoreJoin, ACauseWakesTheWatchersOfItsNodeAtOnce) {
  const fs::path done = dir_.path() / "done";
  const auto statuses = run_ranks(
      3,
      [&](int rank) {
        if (rank == 1) {
          oomflight_trigger_oom(0, "CUDA out of memory", 1, 1);
          std::ofstream(done) << "x";
        } else {
          wait_for(done);
        }
      },
      [](int) {
        setenv("OOMFLIGHT_POLL_INTERVAL", "3s", 1);
        setenv("OOMFLIGHT_LOG_LEVEL", "debug", 1);
      });
  EXPECT_EQ(statuses, (std::vector<int>{0, 0, 0}));
  int rung = 0;
  for (const int rank : {0, 2}) {
    const bool at_once = log(rank).find("dump 0's cause from rank 1 seen at once (a rank of this node rang)") !=
                         std::string::npos;
    const bool at_a_look = log(rank).find("dump 0's cause from rank 1 seen at a look") != std::string::npos;
    EXPECT_NE(at_once, at_a_look) << "rank " << rank << " says how it saw the cause, once\n" << log(rank);
    rung += at_once ? 1 : 0;
  }
  EXPECT_GE(rung, 1) << log(0) << log(2);
  const Archive a = the_only_file(1);
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{0, 1, 2}));
}

// Ranks of a data-parallel job run out of memory at the same step: a rank whose oom event is in its history when
// another rank's cause arrives is an origin of that dump too (as under MPI), and its failing thread, asking after,
// gets that archive rather than a second one.
TEST_F(StoreJoin, ARankWhoseOomCameBeforeTheCauseIsAnOriginOfTheSameArchive) {
  const auto statuses = oom_event_on_one_then_oom_on_zero([&] { wait_for(dir_.path() / "done"); },
                                                          "torch.OutOfMemoryError on rank 1");
  EXPECT_EQ(statuses, (std::vector<int>{0, 0}));
  const Archive a = the_only_file(0);
  EXPECT_EQ(a.header.origin_ranks, (std::vector<std::int32_t>{0, 1})) << log(1);
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{0, 1}));
  EXPECT_NE(a.header.reason.find("rank 0: CUDA out of memory (rank 0)"), std::string::npos) << a.header.reason;
  EXPECT_NE(a.header.reason.find("rank 1: out of memory at batch 3: tried to allocate 4.00 KiB with 1000 B free"),
            std::string::npos)
      << a.header.reason;
  EXPECT_EQ(rank1_result(), std::make_pair(int{OOMFLIGHT_OK}, a.path)) << log(1);  // the same archive: it holds its failure
  // The one summary line (rank 0's: the cause's origin) names every origin the archive names.
  EXPECT_NE(log(0).find("ranks 0, 1 out of memory at batch -1 (requested 1 B, 1 B free); archive " + a.path +
                        " written by 2 of 2 ranks"),
            std::string::npos)
      << log(0);
  EXPECT_TRUE(log(1).find("rank 1 reports, after the dump that holds its failure: torch.OutOfMemoryError") !=
                  std::string::npos ||
              log(1).find("rank 1 reports, in the dump under way: torch.OutOfMemoryError") != std::string::npos)
      << log(1);
}

// The same, with the failing thread's request coming while the dump is under way (on a GPU the allocator's hook
// records the oom event, then the error reaches Python's excepthook): the archive says the job's own words for
// rank 1, as over MPI (its watcher waits up to 200 ms for the request and writes its file again), not the event's.
TEST_F(StoreJoin, AnOriginThroughItsOomEventTakesItsFailingThreadsWords) {
  const auto statuses = oom_event_on_one_then_oom_on_zero(
      [&] {
        wait_for(store_dir() / "d0%cause");  // rank 0's dump has begun: this rank's watcher is on its way
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      },
      "torch.OutOfMemoryError: CUDA out of memory on rank 1");
  EXPECT_EQ(statuses, (std::vector<int>{0, 0}));
  const Archive a = the_only_file(1);
  EXPECT_EQ(a.header.origin_ranks, (std::vector<std::int32_t>{0, 1})) << log(1);
  EXPECT_NE(a.header.reason.find("rank 1: torch.OutOfMemoryError: CUDA out of memory on rank 1"), std::string::npos)
      << a.header.reason << log(1);
  EXPECT_EQ(a.header.reason.find("rank 1: out of memory at batch 3"), std::string::npos) << a.header.reason;
  EXPECT_EQ(rank1_result(), std::make_pair(int{OOMFLIGHT_OK}, a.path)) << log(1);
}

// In rank 1's process: once its watcher is about to say its file of dump 0 is written (after its freeze for it), its
// own failure comes (`reason`), and the watcher goes on once the failing thread is in it (its request waits for the
// dump). The failing thread writes the path of the dump that answered it to `marker`.
const char* g_late_reason = "";
void fail_after_writing_dump_0(const char* reason, const fs::path& marker) {
  g_late_reason = reason;
  setenv("TEST_LATE_MARKER", marker.c_str(), 1);
  g_on_set = [](const char* key) {
    if (std::strcmp(key, "d0/file/1") != 0) return;
    static std::atomic<bool> failing{false};
    std::thread([] {
      failing = true;
      oomflight_trigger_oom(0, g_late_reason, 2048, 7);
      std::ofstream(std::getenv("TEST_LATE_MARKER")) << oomflight_last_dump_path();
    }).detach();
    while (!failing) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  };
}

std::vector<int> StoreJoin::rank_1_fails_during_rank_0s_dump(const char* late_reason,
                                                             const std::function<void()>& rank_0s_dump) {
  const fs::path started = dir_.path() / "started";
  const fs::path late = dir_.path() / "late";
  return run_ranks(
      2,
      [&](int rank) {
        if (rank == 0) {
          wait_for(started);
          rank_0s_dump();
        }
        wait_for(late);  // rank 1's own dump is over: both ranks answered it
      },
      [&](int rank) {
        if (rank != 1) return;
        std::ofstream(started) << "x";
        fail_after_writing_dump_0(late_reason, late);
      });
}

// A rank whose own out-of-memory error comes after its history was frozen for another rank's dump, while that dump
// is under way: it says so as it ends that dump (dN/late), the dump's origin stays, and the dump of its own that
// follows names both and replaces the first archive: one archive, as over MPI (the joint dump; issue 40's table).
TEST_F(StoreJoin, AnOomDuringAnotherRanksDumpGivesOneJointArchive) {
  const fs::path late = dir_.path() / "late";
  const auto statuses = rank_1_fails_during_rank_0s_dump("CUDA out of memory (rank 1, late)", [&] {
    oomflight_trigger_oom(0, "CUDA out of memory (rank 0)", 1, 1);
    std::ofstream(dir_.path() / "rank0-result") << oomflight_last_dump_path();
  });
  EXPECT_EQ(statuses, (std::vector<int>{0, 0}));
  const Archive a = the_only_file(1);
  EXPECT_EQ(a.header.origin_ranks, (std::vector<std::int32_t>{0, 1})) << log(0) << log(1);
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(a.header.dump_number, 1);
  EXPECT_NE(a.header.reason.find("rank 0: CUDA out of memory (rank 0)"), std::string::npos) << a.header.reason;
  EXPECT_NE(a.header.reason.find("rank 1: CUDA out of memory (rank 1, late)"), std::string::npos) << a.header.reason;
  int origins = 0;
  for (const RankRow& row : a.ranks) origins += row.is_origin ? 1 : 0;
  EXPECT_EQ(origins, 2);
  // Both failing threads got the joint archive (the first one's name), and each rank said its part.
  std::string path0, path1;
  std::ifstream(dir_.path() / "rank0-result") >> path0;
  std::ifstream(late) >> path1;
  EXPECT_EQ(path0, a.path) << log(0);
  EXPECT_EQ(path1, a.path) << log(1);
  EXPECT_NE(log(0).find("rank 1 ran out of memory during this dump: staying for its dump, which names this rank "
                        "too"),
            std::string::npos)
      << log(0);
  EXPECT_NE(log(1).find("rank 1's failure came after its history was frozen for the dump under way; a dump of its "
                        "own follows"),
            std::string::npos)
      << log(1);
  EXPECT_NE(log(1).find("rank 1's dump names the last dump's origin too and replaces " + a.path), std::string::npos)
      << log(1);
  EXPECT_NE(log(1).find("ranks 0, 1 out of memory at batch"), std::string::npos) << log(1);
}

// The same timing after a headroom dump (issue 42): rank 1's failure during rank 0's headroom dump is no part of it.
// Nobody stays for a joint dump; rank 1's oom dump follows, of its own, kind oom, naming rank 1 alone, and the
// headroom archive names rank 0 alone: two archives.
TEST_F(StoreJoin, AnOomDuringAHeadroomDumpGetsAnOomArchiveOfItsOwn) {
  const fs::path late = dir_.path() / "late";
  const auto statuses = rank_1_fails_during_rank_0s_dump("CUDA out of memory (rank 1, during the headroom dump)", [] {
    oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
    request.kind = OOMFLIGHT_DUMP_HEADROOM;
    request.reason = "device 0: reserved 7.25 GiB of its 8.00 GiB capacity, over OOMFLIGHT_HEADROOM_DUMP=90%";
    oomflight_dump_result result = OOMFLIGHT_DUMP_RESULT_INIT;
    (void)oomflight_request_dump(&request, &result);
  });
  EXPECT_EQ(statuses, (std::vector<int>{0, 0}));
  std::map<std::string, Archive> by_kind;
  for (const fs::path& f : test::files_with_suffix(dir_.path() / "out", ".h5")) {
    Archive a = read_archive(f.string());
    by_kind.emplace(a.header.kind, std::move(a));
  }
  ASSERT_EQ(by_kind.size(), 2u) << log(0) << log(1);
  ASSERT_TRUE(by_kind.count("headroom") && by_kind.count("oom")) << log(0) << log(1);
  EXPECT_EQ(by_kind["headroom"].header.origin_ranks, (std::vector<std::int32_t>{0})) << log(0) << log(1);
  EXPECT_EQ(by_kind["oom"].header.origin_ranks, (std::vector<std::int32_t>{1})) << log(0) << log(1);
  EXPECT_EQ(by_kind["oom"].header.ranks_present, (std::vector<std::int32_t>{0, 1}));
  EXPECT_NE(by_kind["oom"].header.reason.find("rank 1: CUDA out of memory (rank 1, during the headroom dump)"),
            std::string::npos)
      << by_kind["oom"].header.reason;
  std::string path1;
  std::ifstream(late) >> path1;
  EXPECT_EQ(path1, by_kind["oom"].path) << log(1);
  EXPECT_EQ(log(0).find("staying for"), std::string::npos) << log(0);
  EXPECT_NE(log(1).find("rank 1 ran out of memory during a headroom dump; a dump of its own follows"),
            std::string::npos)
      << log(1);
}

// A rank whose session ended on an error before the dump is not waited for (the deadline is 60 s): the archive
// names it.
TEST_F(StoreJoin, ARankThatLeftOnAnErrorIsNotWaitedFor) {
  const auto statuses = oom_on_one_after(store_dir() / "left%2", [] {  // as an uncaught exception ends it
    oomflight_end(1);
    std::fflush(stderr);
    _exit(0);
  });
  EXPECT_EQ(statuses, (std::vector<int>{0, 0, 0}));
  const Archive a = the_only_file(1);
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{0, 1}));
  EXPECT_NE(log(1).find("written by 2 of 3 ranks in "), std::string::npos) << log(1);
  EXPECT_NE(log(1).find(": rank 2 left the job before this dump (ended its oomflight session without the others)"),
            std::string::npos)
      << log(1);
}

// The settings that decide collectives must agree: every rank says which differ, and dumps alone.
TEST_F(StoreJoin, SettingsThatDifferAreNamedOnEveryRank) {
  const auto statuses = run_ranks(
      2, [&](int) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); },
      [](int rank) {
        if (rank == 1) setenv("OOMFLIGHT_SKIP_BATCHES", "2", 1);
      });
  EXPECT_EQ(statuses, (std::vector<int>{0, 0}));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(log(rank).find("OOMFLIGHT_SKIP_BATCHES differs between ranks: unset on rank 0; 2 on rank 1. These "
                             "settings must be the same on every rank of the job; no dump is coordinated"),
              std::string::npos)
        << log(rank);
  }
}

// A rank that ends normally keeps answering dumps until every rank has ended (the leave agreement): an OOM on
// another rank after its end still finds its history.
TEST_F(StoreJoin, ARankThatEndsNormallyStillAnswersUntilEveryRankEnds) {
  const auto statuses = oom_on_one_after(store_dir() / "ending", [] {});  // its normal end waits for the others
  EXPECT_EQ(statuses, (std::vector<int>{0, 0, 0}));
  const Archive a = the_only_file(1);
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{0, 1, 2})) << log(2);
  EXPECT_NE(log(1).find("written by 3 of 3 ranks in "), std::string::npos) << log(1);
}

// The merging rank dies as it claims the merge: after one more deadline the first waiter merges instead, and the
// dead rank's history (on disk before its claim) is in the archive too.
TEST_F(StoreJoin, WhenTheMergingRankDiesAWaiterMerges) {
  const auto statuses = oom_on(3, 1, std::chrono::milliseconds(200), [](int rank) {
    setenv("OOMFLIGHT_DUMP_TIMEOUT", "2s", 1);
    if (rank == 0) g_die_at_claim = true;
  });
  EXPECT_EQ(statuses, (std::vector<int>{128 + SIGKILL, 0, 0}));
  // The archive, and the dead rank's own file (only a rank removes its own: the others cannot know it is dead).
  std::vector<fs::path> archives, rank_files;
  for (const fs::path& f : test::files_with_suffix(dir_.path() / "out", ".h5")) {
    (f.filename().string().find(".rank") == std::string::npos ? archives : rank_files).push_back(f);
  }
  ASSERT_EQ(archives.size(), 1u) << log(1);
  EXPECT_EQ(rank_files.size(), 1u);
  const Archive a = read_archive(archives[0].string());
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{0, 1, 2}));
  EXPECT_NE((log(1) + log(2)).find("no rank merged the histories within the deadline; this rank merges them"),
            std::string::npos)
      << log(1) << log(2);
}

// SIGUSR1 to one rank: a signal dump of every rank into one archive, and the job goes on.
TEST_F(StoreJoin, SigusrOneToOneRankDumpsEveryRankAndTheJobGoesOn) {
  const fs::path done = dir_.path() / "done";
  const auto statuses = run_ranks(2, [&](int rank) {
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // past the agreement at start
      kill(getpid(), SIGUSR1);
      for (int i = 0; i < 6000 && test::files_with_suffix(dir_.path() / "out", ".h5").empty(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the rank-local files removed after the rename
      oomflight_record(OOMFLIGHT_ALLOC, 0, 1, 1, 0, -1);  // still recording
      std::ofstream(done) << "x";
    } else {
      wait_for(done);
    }
  });
  EXPECT_EQ(statuses, (std::vector<int>{0, 0}));
  const Archive a = the_only_file(1);
  EXPECT_EQ(a.header.kind, "signal");
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(a.header.origin_ranks, (std::vector<std::int32_t>{1}));
  EXPECT_EQ(a.header.reason, "rank 1: SIGUSR1 received");
}

// A snapshot schedule (skip 1 batch, record 2): every rank writes its window and goes on; the rank that completes
// the window merges the files into one snapshot archive of every rank, and no rank-local file is left.
TEST_F(StoreJoin, ASnapshotWindowIsOneArchiveOfEveryRank) {
  const fs::path done = dir_.path() / "done";
  const auto statuses = run_ranks(
      3,
      [&](int rank) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // past the agreement at start
        for (int batch = 1; batch <= 4; ++batch) {
          oomflight_mark_batch(batch);
          oomflight_record(OOMFLIGHT_ALLOC, 0, 0x9000000ull * (rank + 1) + batch, 64, 0, -1);
        }
      },
      [](int) {
        setenv("OOMFLIGHT_SKIP_BATCHES", "1", 1);
        setenv("OOMFLIGHT_INTERVAL", "2ba", 1);
      });
  EXPECT_EQ(statuses, (std::vector<int>{0, 0, 0}));
  const Archive a = the_only_file(0);
  EXPECT_EQ(a.header.kind, "snapshot");
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{0, 1, 2}));
  EXPECT_EQ(a.header.window_first_batch, 1);
  EXPECT_EQ(a.header.window_last_batch, 2);
  for (const RankRow& row : a.ranks) {
    std::vector<std::int64_t> batches;  // this rank's own events of the window: batches 1 and 2, not 3 or 4
    for (const Event& e : a.events_of(row)) {
      if (e.size == 64) batches.push_back(e.batch);
    }
    EXPECT_EQ(batches, (std::vector<std::int64_t>{1, 2})) << "rank " << row.rank;
  }
}

// A window that closes before the ranks' start-up agreement (right after the join) waits for it, within its bound,
// as a dump asked for then does (issue 40: each rank wrote its own file under its provisional run name).
TEST_F(StoreJoin, ASnapshotWindowThatClosesBeforeTheAgreementWaitsForIt) {
  const auto statuses = run_ranks(
      3,
      [&](int rank) {
        for (int batch = 0; batch <= 1; ++batch) {  // no pause after the join: the agreement is still to come
          oomflight_mark_batch(batch);               // batch 1 closes the window of batch 0
          oomflight_record(OOMFLIGHT_ALLOC, 0, 0x9000000ull * (rank + 1) + batch, 64, 0, -1);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the window's merge, on a watcher
      },
      [](int) {
        setenv("OOMFLIGHT_SKIP_BATCHES", "0", 1);
        setenv("OOMFLIGHT_INTERVAL", "1ba", 1);
      });
  EXPECT_EQ(statuses, (std::vector<int>{0, 0, 0}));
  const Archive a = the_only_file(0);
  EXPECT_EQ(a.header.kind, "snapshot");
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{0, 1, 2})) << log(0) << log(1);
  EXPECT_EQ(a.header.window_first_batch, 0);
  EXPECT_EQ(log(1).find("written by this rank alone"), std::string::npos) << log(1);
}

// A joined rank holds SIGTERM until a dump under way is written (torchrun stops every worker when one dies); a process
// it forks (a DataLoader worker) has no watcher to act on that, so it gets SIGTERM's default action back.
TEST_F(StoreJoin, SigtermIsHeldInTheRankAndDefaultInItsForkedChildren) {
  const auto statuses = run_ranks(2, [&](int rank) {
    struct sigaction mine {};
    sigaction(SIGTERM, nullptr, &mine);
    if (mine.sa_handler == SIG_DFL) _exit(80 + rank);  // the rank holds it
    const pid_t child = fork();
    if (child == 0) {
      struct sigaction theirs {};
      sigaction(SIGTERM, nullptr, &theirs);
      _exit(theirs.sa_handler == SIG_DFL ? 0 : 1);
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) _exit(85 + rank);
  });
  EXPECT_EQ(statuses, (std::vector<int>{0, 0}));
}

// One dump per ending, as over MPI (issue 40): with OOMFLIGHT_DUMP_ON_EXIT, a SIGTERM to one rank is one exit
// archive of every rank; the launcher's SIGTERM to the others afterwards ends them with no second exit dump (before,
// each began one and waited the whole deadline for the rank that had ended without telling the store).
TEST_F(StoreJoin, ASigtermAfterTheExitDumpEndsARankWithNoSecondDump) {
  const fs::path out = dir_.path() / "out";
  const auto archive_written = [&] {
    for (int i = 0; i < 6000; ++i) {
      for (const auto& f : test::files_with_suffix(out, ".h5")) {
        if (f.filename().string().find(".rank") == std::string::npos) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  };
  const auto started = std::chrono::steady_clock::now();
  const auto statuses = run_ranks(
      3,
      [&](int rank) {
        if (rank == 0) {
          wait_for(store_dir() / "agreement");  // an exit dump of every rank needs the ranks' agreement
        } else if (!archive_written()) {
          _exit(70);
        }
        raise(SIGTERM);  // held: the watcher acts on it at its next poll
        std::this_thread::sleep_for(std::chrono::seconds(50));
        _exit(71);  // SIGTERM never ended the process
      },
      [](int) { setenv("OOMFLIGHT_DUMP_ON_EXIT", "1", 1); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(statuses, (std::vector<int>{128 + SIGTERM, 128 + SIGTERM, 128 + SIGTERM})) << log(0) << log(1);
  const Archive a = the_only_file(1);
  EXPECT_EQ(a.header.kind, "exit");
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{0, 1, 2}));
  EXPECT_EQ(a.header.origin_ranks, (std::vector<std::int32_t>{0}));
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_NE(log(rank).find("ending the process as SIGTERM would"), std::string::npos) << log(rank);
  }
  // Not a timing threshold: a second exit dump waited OOMFLIGHT_DUMP_TIMEOUT (60 s here) for rank 0.
  EXPECT_LT(seconds, 45.0) << log(1);
}

// A rank whose process ends without a word (os._exit, a signal) is seen to end by the ranks of its node, as over MPI
// (issue 40): the others' leave agreement does not wait for it, and a later dump names it in the MPI transport's
// words (before, every other rank waited the whole OOMFLIGHT_DUMP_TIMEOUT at its end: a torchrun job whose worker
// called os._exit(0) took 35 s instead of 6).
TEST_F(StoreJoin, ARankThatEndsWithoutAWordIsNotWaitedFor) {
  const auto started = std::chrono::steady_clock::now();
  const auto statuses = run_ranks(3, [&](int rank) {
    wait_for(store_dir() / "agreement");
    if (rank == 2) _exit(0);  // no oomflight_shutdown: nothing said
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(statuses, (std::vector<int>{0, 0, 0}));
  EXPECT_NE((log(0) + log(1)).find("rank 2 ended without a word (its process is gone: killed, os._exit or a crash)"),
            std::string::npos)
      << log(0) << log(1);
  // Not a timing threshold: the leave agreement waited OOMFLIGHT_DUMP_TIMEOUT (60 s here) for rank 2.
  EXPECT_LT(seconds, 40.0) << log(0);
}

TEST_F(StoreJoin, ADumpAfterARankEndedWithoutAWordNamesItAndDoesNotWait) {
  const auto started = std::chrono::steady_clock::now();
  const auto statuses = oom_on_one_after(store_dir() / "vanished%2", [] { _exit(0); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(statuses, (std::vector<int>{0, 0, 0}));
  const Archive a = the_only_file(1);
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{0, 1}));
  EXPECT_NE(log(1).find("written by 2 of 3 ranks in"), std::string::npos) << log(1);
  EXPECT_NE(log(1).find(": rank 2 ended without a word (its process is gone: killed, os._exit or a crash)"),
            std::string::npos)
      << log(1);
  EXPECT_LT(seconds, 40.0) << log(1);  // not a threshold: a wait for rank 2 takes the 60 s deadline
}

// A store that goes away (its server's host ended) is named once, with the store's words; the watcher's later looks
// back off and are counted, and the count is said at the end: never a line per poll (a 10 ms poll of a dead store and
// torch's warning for each failed request printed 5,623 lines in 20 s, issue 39).
TEST_F(StoreJoin, AStoreThatFailsIsNamedOnceAndItsLaterFailuresCounted) {
  const auto statuses = run_ranks(1, [&](int) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // past the agreement at start
    g_store_down = true;
    const long before = g_requests.load();
    std::this_thread::sleep_for(std::chrono::seconds(3));
    std::ofstream(dir_.path() / "requests") << g_requests.load() - before;
  });
  EXPECT_EQ(statuses, (std::vector<int>{0})) << log(0);
  const std::string text = log(0);
  std::size_t named = 0;
  for (std::size_t at = text.find("the job's store failed:"); at != std::string::npos;
       at = text.find("the job's store failed:", at + 1)) {
    ++named;
  }
  EXPECT_EQ(named, 1u) << text;
  EXPECT_NE(text.find("more looks at the job's store failed after the first"), std::string::npos) << text;
  long requests = -1;
  std::ifstream(dir_.path() / "requests") >> requests;
  EXPECT_GE(requests, 2);   // it does look again
  EXPECT_LE(requests, 12);  // backing off from 0.1 s: about 5 looks in 3 s, where a 10 ms poll made 300
}

// The files a store's folder holds whose names start with `prefix`.
std::vector<fs::path> files_named(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path());
  }
  return out;
}

// torch's destroy_process_group: the job lets go of its store (issue 39). The rank that leaves releases it at once (no
// call in flight), is not waited for by another rank's dump, dumps alone meanwhile (a rank-local file that says so),
// and joins the job's next store, where an OOM again gives one archive of every rank. Each store is released once per
// rank and never called after.
TEST_F(StoreJoin, ARankThatLeavesItsStoreIsNotWaitedForAndJoinsTheNextOne) {
  const fs::path next_store = dir_.path() / "store-next";
  fs::create_directories(next_store);
  const fs::path left0 = dir_.path() / "left0", signalled = dir_.path() / "signalled", done = dir_.path() / "done";
  const auto statuses = run_ranks(2, [&](int rank) {
    oomflight_mark_batch(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // past the agreement at start
    if (rank == 0) {
      if (oomflight_leave_store("destroy_process_group") != OOMFLIGHT_OK) _exit(70);
      if (g_releases.load() != 1) _exit(71);  // no call was in flight: released at once
      if (oomflight_leave_store(nullptr) != OOMFLIGHT_ESTATE) _exit(72);
      oomflight_dump_request alone = OOMFLIGHT_DUMP_REQUEST_INIT;
      alone.kind = OOMFLIGHT_DUMP_SIGNAL;
      alone.reason = "between two stores";
      oomflight_request_dump(&alone, nullptr);
      std::ofstream(left0) << "x";
      wait_for(signalled);
    } else {
      wait_for(left0);
      const auto start = std::chrono::steady_clock::now();
      oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
      request.kind = OOMFLIGHT_DUMP_SIGNAL;
      request.reason = "after rank 0 left";
      oomflight_request_dump(&request, nullptr);
      std::ofstream(signalled) << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (oomflight_leave_store("destroy_process_group") != OOMFLIGHT_OK) _exit(70);
    }
    if (g_calls_after_release.load() != 0) _exit(74);
    static FolderStore next;
    next.dir = next_store;
    oomflight_store store{sizeof(oomflight_store), &next, &FolderStore::set, &FolderStore::get, &FolderStore::add,
                          nullptr, &FolderStore::release};
    if (oomflight_join_store(&store, rank, 2, rank) != OOMFLIGHT_OK) _exit(73);
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      oomflight_trigger_oom(0, "CUDA out of memory", 1, 1);
      std::ofstream(done) << "x";
    } else {
      wait_for(done);
    }
  });
  EXPECT_EQ(statuses, (std::vector<int>{0, 0})) << log(0) << log(1);
  double seconds = -1;
  std::ifstream(signalled) >> seconds;
  EXPECT_LT(seconds, 30.0) << "rank 1's dump waited for rank 0, which had left (the deadline is 60 s)\n" << log(1);
  std::map<std::string, Archive> files;
  for (const auto& f : test::files_with_suffix(dir_.path() / "out", ".h5")) {
    files.emplace(f.filename().string(), read_archive(f.string()));
  }
  ASSERT_EQ(files.size(), 3u) << log(0) << log(1);
  const Archive& alone = files.at("signal.0.rank0.h5");
  EXPECT_EQ(alone.header.ranks_present, (std::vector<std::int32_t>{0}));
  EXPECT_EQ(alone.header.world_size, 2);
  EXPECT_EQ(alone.header.reason, "rank 0: between two stores (written by this rank alone, after this rank left the "
                                 "job's store (destroy_process_group))");
  const Archive& without_rank_0 = files.at("signal.0.h5");
  EXPECT_EQ(without_rank_0.header.ranks_present, (std::vector<std::int32_t>{1}));
  const Archive& both = files.at("oom.0.h5");
  EXPECT_EQ(both.header.ranks_present, (std::vector<std::int32_t>{0, 1})) << log(0) << log(1);
  EXPECT_EQ(both.header.origin_ranks, (std::vector<std::int32_t>{1}));
  EXPECT_EQ(files_named(store_dir(), "released.").size(), 2u);  // each rank let go of the first store once
  EXPECT_EQ(files_named(next_store, "released.").size(), 2u);   // and of the second at its session's end
  for (const fs::path& marker : files_named(next_store, "released.")) {
    std::string calls_after;
    std::ifstream(marker) >> calls_after;
    EXPECT_EQ(calls_after, "0") << marker;
  }
}

// A plugin built against the 0.2.1 header passes the struct without `release`: it is taken, and never released
// (that plugin keeps its store until the process ends, as it expects).
TEST_F(StoreJoin, AStoreOfThe021HeaderIsTakenAndNeverReleased) {
  const auto statuses = run_ranks(1, [&](int) {});  // the harness's own store, released at the end
  EXPECT_EQ(statuses, (std::vector<int>{0}));
  EXPECT_EQ(files_named(store_dir(), "released.").size(), 1u);
  const fs::path old_store = dir_.path() / "store-021";
  fs::create_directories(old_store);
  const pid_t pid = fork();
  if (pid == 0) {
    std::freopen(log_path(5).c_str(), "w", stderr);
    setenv("OOMFLIGHT_FOLDER", (dir_.path() / "out").c_str(), 1);
    if (oomflight_init() != OOMFLIGHT_OK) _exit(90);
    FolderStore folder{old_store};
    oomflight_store store{OOMFLIGHT_STORE_SIZE_0_2_1, &folder, &FolderStore::set, &FolderStore::get,
                          &FolderStore::add, nullptr, &FolderStore::release};  // `release` beyond struct_size
    if (oomflight_join_store(&store, 0, 1, 0) != OOMFLIGHT_OK) _exit(91);
    _exit(oomflight_shutdown() == OOMFLIGHT_OK && g_releases.load() == 0 ? 0 : 92);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log(5);
  EXPECT_TRUE(files_named(old_store, "released.").empty());
}

// Before it reaches the job's store, a process that torchrun started (RANK, WORLD_SIZE, LOCAL_RANK) is that rank (issue
// 39: it claimed rank 0 of 1, and wrote an "archive" of the job): its log line and its rank-local file name it, and the
// file says it was written alone, before the store was reached.
TEST_F(StoreJoin, ALauncherNumberedRankIsThatRankBeforeItReachesTheStore) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::freopen(log_path(2).c_str(), "w", stderr);
    setenv("OOMFLIGHT_FOLDER", (dir_.path() / "out").c_str(), 1);
    setenv("RANK", "2", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("LOCAL_RANK", "2", 1);
    if (oomflight_init() != OOMFLIGHT_OK) _exit(90);
    int rank = -1, world = -1;
    oomflight_rank(&rank, &world);
    if (rank != 2 || world != 4) _exit(91);
    oomflight_mark_batch(0);
    oomflight_record(OOMFLIGHT_ALLOC, 0, 0x1000, 512, 0, -1);
    oomflight_trigger_oom(0, "CUDA out of memory. Tried to allocate 2.00 GiB", 2ull << 30, 1ull << 20);
    std::fflush(stderr);
    _exit(oomflight_shutdown() == OOMFLIGHT_OK ? 0 : 92);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log(2);
  const auto files = test::files_with_suffix(dir_.path() / "out", ".h5");
  ASSERT_EQ(files.size(), 1u) << log(2);
  EXPECT_EQ(files[0].filename(), "oom.0.rank2.h5");
  const Archive a = read_archive(files[0].string());
  EXPECT_EQ(a.header.world_size, 4);
  EXPECT_EQ(a.header.ranks_present, (std::vector<std::int32_t>{2}));
  EXPECT_EQ(a.header.origin_ranks, (std::vector<std::int32_t>{2}));
  EXPECT_EQ(a.header.reason, "rank 2: CUDA out of memory. Tried to allocate 2.00 GiB (written by this rank alone, "
                             "before this rank reached the job's store)");
  ASSERT_EQ(a.ranks.size(), 1u);
  EXPECT_EQ(a.ranks[0].local_rank, 2);
  EXPECT_NE(log(2).find("oomflight[rank 2] error: rank 2 out of memory at batch 0 (requested 2.00 GiB, 1.00 MiB "
                        "free)"),
            std::string::npos)
      << log(2);
  EXPECT_NE(log(2).find("by this rank alone, before this rank reached the job's store"), std::string::npos) << log(2);
}

}  // namespace
}  // namespace oomflight
