// Test driver: an MPI program with known per-rank event counts that triggers dumps on chosen ranks.
//   oomflight_trigger_driver EVENTS ORIGINS [STALL_RANK]
// Rank r records EVENTS + 10 r alloc events (size 1000 + r) in batch 0. Origins (comma-separated ranks) record an
// oom event (size 4096 (r + 1)) before a barrier and trigger after it, so that their failures are simultaneous.
// STALL_RANK stops itself with SIGSTOP after the barrier: a wedged rank. Non-origins then block in a barrier,
// as training ranks block in a collective. Origins exit 1 after the dump, like a failed training script.
#include <mpi.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>

#include "oomflight/session.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s EVENTS ORIGINS [STALL_RANK]\n", argv[0]);
    return 2;
  }
  const int events = std::atoi(argv[1]);
  std::set<int> origins;
  std::stringstream list(argv[2]);
  for (std::string item; std::getline(list, item, ',');) origins.insert(std::stoi(item));
  const int stall = argc > 3 ? std::atoi(argv[3]) : -1;

  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  oomflight::Session session(oomflight::Config::from_environment(), MPI_COMM_WORLD);
  const int rank = session.identity().rank;
  auto& recorder = session.recorder();
  const oomflight::FrameRef frames[] = {{"train_step", "driver.py", rank + 1}};
  const auto stack = recorder.intern_stack(frames);
  recorder.mark_batch(0);
  for (int i = 0; i < events + 10 * rank; ++i) {
    recorder.record(oomflight::Action::alloc, 0, 0x1000u * static_cast<unsigned>(i + 1), 1000u + rank, 0, stack);
  }
  recorder.set_memory({1000ull * 1000, 2000ull * 1000, 1500ull * 1000, 2500ull * 1000, 4000ull * 1000, 0});
  const bool origin = origins.count(rank) > 0;
  const std::uint64_t requested = 4096ull * static_cast<unsigned>(rank + 1);
  if (origin) recorder.record(oomflight::Action::oom, 0, 77, requested, 0);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == stall) raise(SIGSTOP);
  if (origin) {
    const auto result = session.trigger({"driver: out of memory on rank " + std::to_string(rank), requested, 77});
    std::printf("rank %d: dump status %d path %s\n", rank, static_cast<int>(result.status), result.path.c_str());
    std::fflush(stdout);
    session.shutdown();
    return 1;
  }
  if (!origins.empty()) MPI_Barrier(MPI_COMM_WORLD);  // never completes: an origin has failed
  session.shutdown();
  MPI_Finalize();
  return 0;
}
