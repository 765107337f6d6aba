// What a scheduled snapshot costs the training thread: the time from the batch mark that ends a window to the
// call's return (the rank freezes its history and hands it to the watcher; the archive is written off the
// training thread once every rank has reached the window's end), side by side with an ordinary batch mark.
//   mpirun -np 4 oomflight_snapshot_bench [EVENTS_PER_BATCH=100000] [WINDOWS=10] [BATCH_MS=100]
// The ring holds 100,000 events (OOMFLIGHT_MAX_ENTRIES), full before the first window; windows are every 2nd
// batch (OOMFLIGHT_SKIP_BATCHES=1, OOMFLIGHT_SNAPSHOT_EVERY=2ba: batches 1-2, 3-4, ...). Each batch records its
// events, then sleeps BATCH_MS as a GPU step would, leaving the cores to the watcher. Rank 0 prints medians
// over every rank's marks. The anchor: PyTorch's torch.cuda.memory._snapshot() of 100,000 entries takes about
// 0.7 s, in the training thread, and writes one rank.
#include <mpi.h>
#include <oomflight/oomflight.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace {

double seconds_of_mark(std::int64_t batch) {
  const auto start = std::chrono::steady_clock::now();
  oomflight_mark_batch(batch);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int events = argc > 1 ? std::atoi(argv[1]) : 100000;
  const int windows = argc > 2 ? std::atoi(argv[2]) : 10;
  const int batch_ms = argc > 3 ? std::atoi(argv[3]) : 100;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const auto folder = std::filesystem::temp_directory_path() / "oomflight-snapshot-bench";
  setenv("OOMFLIGHT_FOLDER", folder.c_str(), 0);
  setenv("OOMFLIGHT_MAX_ENTRIES", "100000", 0);
  setenv("OOMFLIGHT_RUN_NAME", "snapshot-bench", 0);
  setenv("OOMFLIGHT_OVERWRITE", "1", 0);
  setenv("OOMFLIGHT_SKIP_BATCHES", "1", 0);
  setenv("OOMFLIGHT_SNAPSHOT_EVERY", "2ba", 0);
  if (oomflight_init() != OOMFLIGHT_OK) {
    std::fprintf(stderr, "oomflight_init: %s\n", oomflight_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const auto batch_of_work = [&](std::int64_t batch) {
    for (int i = 0; i < events; ++i) {
      const auto addr = 0x7f0000000000ull + 512ull * static_cast<unsigned>(i % 1000) + (static_cast<unsigned>(batch) << 24);
      oomflight_record(i % 2 ? OOMFLIGHT_FREE_COMPLETED : OOMFLIGHT_ALLOC, 0, addr, 512, 0, -1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(batch_ms));
  };
  oomflight_mark_batch(0);
  batch_of_work(0);
  std::vector<double> closing, ordinary;
  for (int w = 0; w < windows; ++w) {
    const std::int64_t first = 1 + 2 * w;
    // Marks of `first` (window w starts; closes w - 1 for w > 0) and `first + 1` (inside the window).
    const double opening = seconds_of_mark(first);
    if (w > 0) closing.push_back(opening);
    batch_of_work(first);
    ordinary.push_back(seconds_of_mark(first + 1));
    batch_of_work(first + 1);
    MPI_Barrier(MPI_COMM_WORLD);  // ranks stay in step, as a data-parallel job's all-reduce keeps them
  }
  const auto gather = [&](const std::vector<double>& mine) {
    std::vector<double> all(mine.size() * static_cast<std::size_t>(size));
    MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(), static_cast<int>(mine.size()),
               MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return all;
  };
  const auto all_closing = gather(closing);
  const auto all_ordinary = gather(ordinary);
  oomflight_shutdown();
  if (rank == 0) {
    std::size_t archives = 0;
    for (const auto& e : std::filesystem::directory_iterator(folder / "")) archives += e.path().extension() == ".h5";
    std::printf("batch mark that ends a snapshot window (freeze of %d events, handed to the watcher): median %.3f ms "
                "(%zu marks on %d ranks); an ordinary batch mark: median %.4f ms; %zu snapshot archives written\n",
                100000, median(all_closing) * 1e3, all_closing.size(), size, median(all_ordinary) * 1e3, archives);
    std::filesystem::remove_all(folder);
  }
  MPI_Finalize();
  return 0;
}
