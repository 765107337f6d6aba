// Seconds to dump R ranks x N events collectively into one archive, and the watcher thread's idle CPU.
//   mpirun -np 4 oomflight_dump_bench [EVENTS_PER_RANK=100000] [REPEATS=5] [IDLE_SECONDS=10]
// Each rank records EVENTS events (50 distinct stacks of 30 frames, like a PyTorch trace), then the ranks
// write the archive REPEATS times (freeze + agreement-free collective write, timed between barriers); rank 0
// prints the median and the slowest. Then every rank holds an idle session for IDLE_SECONDS and rank 0 prints
// the process CPU time it cost (getrusage: all threads).
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "oomflight/archive_writer.hpp"
#include "oomflight/dump_files.hpp"
#include "oomflight/session.hpp"

namespace {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

void fill(oomflight::Recorder& recorder, int events) {
  std::vector<std::string> names;
  for (int f = 0; f < 30; ++f) names.push_back("torch::module::function_number_" + std::to_string(f));
  std::vector<std::int32_t> stacks;
  for (int s = 0; s < 50; ++s) {
    std::vector<oomflight::FrameRef> frames;
    for (int f = 0; f < 30; ++f) frames.push_back({names[static_cast<std::size_t>(f)], "model.py", s * 100 + f});
    stacks.push_back(recorder.intern_stack(frames));
  }
  for (int i = 0; i < events; ++i) {
    recorder.record(oomflight::Action::alloc, 0, 0x7f0000000000ull + 512ull * i, 512, 0,
                    stacks[static_cast<std::size_t>(i % 50)]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int events = argc > 1 ? std::atoi(argv[1]) : 100000;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const int idle = argc > 3 ? std::atoi(argv[3]) : 10;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  oomflight::Recorder recorder(static_cast<std::size_t>(events));
  fill(recorder, events);
  const std::string path = (std::filesystem::temp_directory_path() / "oomflight-dump-bench.h5").string();
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    const auto h = recorder.freeze();
    oomflight::RankIdentity id;
    id.rank = rank;
    id.world_size = size;
    id.run_name = "bench";
    const auto row = oomflight::make_rank_row(id, h, rank == 0, {"bench", 0, 0});
    std::vector<std::int32_t> present(static_cast<std::size_t>(size));
    for (int i = 0; i < size; ++i) present[static_cast<std::size_t>(i)] = i;
    const auto header = oomflight::make_header(id, "bench", {0}, present);
    oomflight::write_archive(path, header, {row, &h.ring.events, &h.stacks}, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    seconds.push_back(MPI_Wtime() - start);
  }
  std::sort(seconds.begin(), seconds.end());
  if (rank == 0) {
    std::printf("dump of %d ranks x %d events: median %.3f s, slowest %.3f s (%d repeats), file %.1f MiB\n", size,
                events, seconds[seconds.size() / 2], seconds.back(), repeats,
                static_cast<double>(std::filesystem::file_size(path)) / 1048576.0);
    std::filesystem::remove(path);
  }
  if (idle > 0) {
    oomflight::Session session(oomflight::Config::from_environment(), MPI_COMM_WORLD);
    const double cpu0 = cpu_seconds();
    std::this_thread::sleep_for(std::chrono::seconds(idle));
    const double cpu = cpu_seconds() - cpu0;
    double total = 0;
    MPI_Reduce(&cpu, &total, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("idle watcher: %.4f CPU s per rank over %d s (%.3f%% of one core)\n", total / size, idle,
                  100.0 * total / size / idle);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Finalize();
  return 0;
}
