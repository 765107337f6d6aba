// Seconds for a whole coordinated dump of R ranks x N events into one archive, and the watcher thread's idle CPU.
//   mpirun -np 4 oomflight_dump_bench [EVENTS_PER_RANK=100000] [REPEATS=5] [IDLE_SECONDS=10] [WAIT=sleep|spin]
//                                     [POLL_US=200]
// Each rank records EVENTS events through the C API (50 distinct stacks of 30 frames, like a PyTorch trace).
// Then, REPEATS times, rank 0 asks for a dump (kind signal) while the other ranks wait for it, as training ranks
// wait in a collective: the time from the request until every rank has passed a barrier after it is the whole
// dump (freeze, triggers, agreement, collective write, close) as a job sees it; rank 0 prints the median and the
// slowest. WAIT says how the others wait: `sleep` polls an MPI_Ibarrier every POLL_US us (ranks of a PyTorch job wait
// in NCCL, off MPI, leaving the CPU and MPI's progress engine to the watcher), `spin` blocks in MPI_Barrier (the
// replay's ranks wait in MPI_Allreduce, which busy-polls the same progress engine the watcher needs).
// Each dump is followed by its two floors, so that all three meet the same disk (it is shared and noisy here): every
// rank pwrite()s its share of the archive's bytes into one file at its offset and fsyncs it; then one process
// writes them all in 1 MiB writes and fsyncs, as `dd bs=1M conv=fsync` does. Rank 0 prints the medians and the
// median of each round's ratio.
// Then every rank holds its idle session for IDLE_SECONDS and rank 0 prints the CPU time it cost (getrusage: all
// threads). Settings come from the environment (OOMFLIGHT_POLL_INTERVAL, ...); the bench sets only the folder
// (a temporary one), the ring size, overwriting and the run name, unless they are set.
#include <mpi.h>
#include <oomflight/oomflight.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

void fill(int events) {
  std::vector<std::string> names;
  for (int f = 0; f < 30; ++f) names.push_back("torch::module::function_number_" + std::to_string(f));
  std::vector<std::int32_t> stacks;
  for (int s = 0; s < 50; ++s) {
    std::vector<oomflight_frame> frames;
    for (int f = 0; f < 30; ++f) frames.push_back({names[static_cast<std::size_t>(f)].c_str(), "model.py", s * 100 + f});
    std::int32_t id = -1;
    oomflight_intern_stack(frames.data(), frames.size(), &id);
    stacks.push_back(id);
  }
  oomflight_mark_batch(0);
  for (int i = 0; i < events; ++i) {
    oomflight_record(OOMFLIGHT_ALLOC, 0, 0x7f0000000000ull + 512ull * static_cast<unsigned>(i), 512, 0,
                     stacks[static_cast<std::size_t>(i % 50)]);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The others wait as training ranks wait for a collective: `sleep` polls an MPI_Ibarrier, `spin` blocks in
// MPI_Barrier (see the top of this file).
void wait_for_every_rank(bool spin, int poll_us) {
  if (spin) {
    MPI_Barrier(MPI_COMM_WORLD);
    return;
  }
  MPI_Request barrier;
  MPI_Ibarrier(MPI_COMM_WORLD, &barrier);
  for (int done = 0; !done;) {
    MPI_Test(&barrier, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(poll_us));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int events = argc > 1 ? std::atoi(argv[1]) : 100000;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const int idle = argc > 3 ? std::atoi(argv[3]) : 10;
  const bool spin = argc > 4 && std::string(argv[4]) == "spin";
  // How often a sleeping rank looks at its barrier. 200 us is a rank's reaction time, but 64 ranks on 2 cores
  // waking 5,000 times a second take most of the cores from the dump they wait for (2.4 CPU s per dump).
  const int poll_us = argc > 5 ? std::atoi(argv[5]) : 200;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const auto folder = std::filesystem::temp_directory_path() / "oomflight-dump-bench";
  setenv("OOMFLIGHT_FOLDER", folder.c_str(), 0);
  setenv("OOMFLIGHT_MAX_ENTRIES", std::to_string(events).c_str(), 0);
  setenv("OOMFLIGHT_OVERWRITE", "1", 0);
  setenv("OOMFLIGHT_RUN_NAME", "dump-bench", 0);
  if (oomflight_init() != OOMFLIGHT_OK) {
    std::fprintf(stderr, "oomflight_init: %s\n", oomflight_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  fill(events);

  // Rounds of three, so that the dump and its floors meet the same disk: the dump, then the same bytes written as
  // plainly as the machine allows by every rank in parallel, then by one process as dd writes them.
  std::vector<double> seconds, parallel_floor, dd_floor, to_parallel, to_dd;
  std::string path;
  std::uint64_t bytes = 0;
  std::vector<char> data;
  const std::string floor_path = (folder / "floor.bin").string();
  for (int r = 0; r < repeats; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    if (rank == 0) {
      oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
      request.kind = OOMFLIGHT_DUMP_SIGNAL;
      request.reason = "dump bench";
      if (oomflight_request_dump(&request, nullptr) != OOMFLIGHT_OK) {
        std::fprintf(stderr, "dump failed: %s\n", oomflight_last_error());
      }
      path = oomflight_last_dump_path();
    }
    wait_for_every_rank(spin, poll_us);
    seconds.push_back(MPI_Wtime() - start);
    if (r == 0) {
      std::error_code ec;
      if (rank == 0) bytes = std::filesystem::file_size(path, ec);
      MPI_Bcast(&bytes, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
      data.assign(std::max<std::uint64_t>(bytes / static_cast<std::uint64_t>(size), 1u << 20), 'x');
    }
    // A dump names a new file: removing the previous one is not part of the next (the floors' files go too).
    if (rank == 0 && r + 1 < repeats) std::filesystem::remove(path);
    if (bytes == 0) continue;

    // Every rank pwrite()s its share of the bytes into one file at its offset, and fsyncs.
    const std::uint64_t share = bytes / static_cast<std::uint64_t>(size);
    MPI_Barrier(MPI_COMM_WORLD);
    start = MPI_Wtime();
    const int fd = ::open(floor_path.c_str(), O_WRONLY | O_CREAT, 0644);
    bool ok = fd >= 0 && ::pwrite(fd, data.data(), share, static_cast<off_t>(share * static_cast<unsigned>(rank))) ==
                             static_cast<ssize_t>(share);
    ok = ok && ::fsync(fd) == 0;
    if (fd >= 0) ::close(fd);
    if (!ok) std::fprintf(stderr, "floor: write failed on rank %d\n", rank);
    wait_for_every_rank(spin, poll_us);
    parallel_floor.push_back(MPI_Wtime() - start);
    if (rank == 0) std::filesystem::remove(floor_path);

    // One process writes all of them in 1 MiB writes and fsyncs: `dd if=/dev/zero bs=1M conv=fsync`.
    MPI_Barrier(MPI_COMM_WORLD);
    start = MPI_Wtime();
    if (rank == 0) {
      const int dd = ::open(floor_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      bool written = dd >= 0;
      for (std::uint64_t at = 0; written && at < bytes; at += 1u << 20) {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(1u << 20, bytes - at));
        written = ::write(dd, data.data(), n) == static_cast<ssize_t>(n);
      }
      written = written && ::fsync(dd) == 0;
      if (dd >= 0) ::close(dd);
      if (!written) std::fprintf(stderr, "dd floor: write failed\n");
    }
    wait_for_every_rank(spin, poll_us);
    dd_floor.push_back(MPI_Wtime() - start);
    if (rank == 0) std::filesystem::remove(floor_path);
    to_parallel.push_back(seconds.back() / parallel_floor.back());
    to_dd.push_back(seconds.back() / dd_floor.back());
  }
  if (rank == 0 && !seconds.empty()) {
    std::printf("whole dump of %d ranks x %d events, others waiting (%s): median %.3f s, slowest %.3f s (%d repeats), "
                "archive %.1f MiB\n",
                size, events, spin ? "spin" : "sleep", median(seconds), *std::max_element(seconds.begin(), seconds.end()),
                repeats, static_cast<double>(bytes) / 1048576.0);
  }
  if (rank == 0 && !to_dd.empty()) {
    std::printf("floor, every rank pwrite()s and fsyncs its share into one file: median %.3f s; the dump is %.1f x it "
                "(median of the rounds' ratios)\n",
                median(parallel_floor), median(to_parallel));
    std::printf("floor, one process writes it all in 1 MiB writes and fsyncs, as dd: median %.3f s; the dump is %.1f x "
                "it (median of the rounds' ratios)\n",
                median(dd_floor), median(to_dd));
  }
  {
    // Each rank's peak resident memory (the process: MPI, HDF5, the ring, the dump's copies), for the memory per
    // rank that docs/scale.md carries to 16,384 ranks.
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    const double mib = static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
    std::vector<double> all(static_cast<std::size_t>(size));
    MPI_Gather(&mib, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("peak resident memory per rank: median %.1f MiB, largest %.1f MiB (rank %d)\n", median(all),
                  *std::max_element(all.begin(), all.end()),
                  static_cast<int>(std::max_element(all.begin(), all.end()) - all.begin()));
    }
  }
  if (idle > 0) {
    const double cpu0 = cpu_seconds();
    std::this_thread::sleep_for(std::chrono::seconds(idle));
    const double cpu = cpu_seconds() - cpu0;
    double total = 0;
    MPI_Reduce(&cpu, &total, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("idle watcher: %.4f CPU s per rank over %d s (%.3f%% of one core)\n", total / size, idle,
                  100.0 * total / size / idle);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  oomflight_shutdown();
  if (rank == 0) std::filesystem::remove_all(folder);
  MPI_Finalize();
  return 0;
}
