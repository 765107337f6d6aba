// Test driver: an MPI program with known per-rank event counts that asks for dumps on chosen ranks, through the C
// API only (as a plugin would).
//   oomflight_trigger_driver EVENTS ORIGINS [STALL_RANK [KIND [THREAD_LEVEL [LATE_MS [SHUTDOWN_MS]]]]]
// Rank r interns one stack (train_step, driver.py, line r + 1), records EVENTS + 10 r alloc events of 1000 + r
// bytes with it in batch 0 and publishes device 0's gauges (1.0 MB allocated, 2.0 MB reserved, peaks 1.5 and
// 2.5 MB, 4.0 MB capacity). STALL_RANK (-1: none) stops itself with SIGSTOP after the barrier: a wedged rank.
// KIND oom (default): origins (comma-separated ranks) record an oom event (size 4096 (r + 1), 77 bytes free)
// before a barrier and ask for the dump after it, so that their failures are simultaneous; non-origins then
// block in a barrier, as training ranks block in a collective, and origins exit 1 after the dump, like a
// failed training script. KIND signal, snapshot or exit: origins ask for a dump of that kind and every rank
// goes on to a final barrier and exits 0: the job survives the dump. THREAD_LEVEL (multiple, the default, or
// single) is the level the driver initialises MPI with before oomflight_init; oomflight_init fails with the
// message on stderr and the driver exits 2 when it is too low. LATE_MS (0: off): every origin but the lowest asks
// that many milliseconds after the barrier, as a failing thread that is slow to reach its error handler, and
// the origins exit only after every rank has passed two more barriers (so that the late ones are not torn down
// by the first origin's exit); each origin prints its dump's path. SHUTDOWN_MS (KIND oom; absent: off): the
// non-origins end normally instead of blocking, calling oomflight_shutdown() that many milliseconds after the
// barrier (negative: the origins ask that many milliseconds after it instead), then MPI_Finalize: a dump that
// races the others' normal end. With TEST_DRIVER_NO_SHUTDOWN=1 in its environment, a rank that ends normally never
// calls oomflight_shutdown(): its own MPI_Finalize ends the session (MPI_COMM_SELF's attribute callback).
#include <mpi.h>
#include <oomflight/oomflight.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s EVENTS ORIGINS [STALL_RANK [KIND]]\n", argv[0]);
    return 2;
  }
  const int events = std::atoi(argv[1]);
  std::set<int> origins;
  std::stringstream list(argv[2]);
  for (std::string item; std::getline(list, item, ',');) origins.insert(std::stoi(item));
  const int stall = argc > 3 ? std::atoi(argv[3]) : -1;
  const std::string kind_name = argc > 4 ? argv[4] : "oom";
  int kind = -1;
  const char* kinds[OOMFLIGHT_DUMP_KIND_COUNT] = {"oom", "snapshot", "signal", "exit", "headroom"};
  for (int k = 0; k < OOMFLIGHT_DUMP_KIND_COUNT; ++k) {
    if (kind_name == kinds[k]) kind = k;
  }
  if (kind < 0) {
    std::fprintf(stderr, "unknown kind '%s'\n", kind_name.c_str());
    return 2;
  }

  const bool single = argc > 5 && std::strcmp(argv[5], "single") == 0;
  const int late_ms = argc > 6 ? std::atoi(argv[6]) : 0;
  const bool shutdown_race = argc > 7;
  const int shutdown_ms = shutdown_race ? std::atoi(argv[7]) : 0;
  const char* no_shutdown_variable = std::getenv("TEST_DRIVER_NO_SHUTDOWN");
  const bool no_shutdown = no_shutdown_variable != nullptr && std::strcmp(no_shutdown_variable, "1") == 0;
  int provided = 0;
  // the application owns MPI
  MPI_Init_thread(&argc, &argv, single ? MPI_THREAD_SINGLE : MPI_THREAD_MULTIPLE, &provided);
  if (const int rc = oomflight_init(); rc != OOMFLIGHT_OK) {
    std::fprintf(stderr, "oomflight_init: %d %s\n", rc, oomflight_last_error());
    MPI_Finalize();
    return 2;
  }
  int rank = 0;
  oomflight_rank(&rank, nullptr);
  const oomflight_frame frame = {"train_step", "driver.py", rank + 1};
  int32_t stack = -1;
  oomflight_intern_stack(&frame, 1, &stack);
  oomflight_mark_batch(0);
  for (int i = 0; i < events + 10 * rank; ++i) {
    oomflight_record(OOMFLIGHT_ALLOC, 0, 0x1000ull * static_cast<unsigned>(i + 1), 1000u + rank, 0, stack);
  }
  oomflight_memory gauges = OOMFLIGHT_MEMORY_INIT;
  gauges.allocated_bytes = 1000ull * 1000;
  gauges.reserved_bytes = 2000ull * 1000;
  gauges.peak_allocated_bytes = 1500ull * 1000;
  gauges.peak_reserved_bytes = 2500ull * 1000;
  gauges.device_capacity_bytes = 4000ull * 1000;
  oomflight_set_memory(0, &gauges);

  const bool origin = origins.count(rank) > 0;
  const bool oom = kind == OOMFLIGHT_DUMP_OOM;
  const std::uint64_t requested = oom ? 4096ull * static_cast<unsigned>(rank + 1) : 0;
  if (origin && oom) oomflight_record(OOMFLIGHT_OOM, 0, 77, requested, 0, -1);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == stall) raise(SIGSTOP);
  if (shutdown_race && !origin) {
    if (shutdown_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(shutdown_ms));
    const int rc = no_shutdown ? 0 : oomflight_shutdown();
    std::printf("rank %d: shut down rc %d\n", rank, rc);
    std::fflush(stdout);
    MPI_Finalize();
    return 0;
  }
  if (shutdown_race && shutdown_ms < 0) std::this_thread::sleep_for(std::chrono::milliseconds(-shutdown_ms));
  if (origin) {
    if (late_ms > 0 && rank != *origins.begin()) std::this_thread::sleep_for(std::chrono::milliseconds(late_ms));
    const std::string reason = "driver: " + (oom ? "out of memory" : kind_name + " dump") + " on rank " +
                               std::to_string(rank);
    oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
    request.kind = kind;
    request.reason = reason.c_str();
    request.requested_bytes = requested;
    request.device_free_bytes = oom ? 77 : 0;
    request.device = 0;
    oomflight_dump_result result = OOMFLIGHT_DUMP_RESULT_INIT;
    const int rc = oomflight_request_dump(&request, &result);
    std::printf("rank %d: dump rc %d status %d ranks %d path %s\n", rank, rc, result.status, result.ranks_written,
                oomflight_last_dump_path());
    std::fflush(stdout);
    if (oom && late_ms == 0) {
      oomflight_shutdown();
      return 1;
    }
  }
  if (oom && !origins.empty()) MPI_Barrier(MPI_COMM_WORLD);  // never completes (unless LATE_MS): an origin failed
  MPI_Barrier(MPI_COMM_WORLD);
  if (!no_shutdown) oomflight_shutdown();
  MPI_Finalize();
  if (no_shutdown) {
    // The session ended inside MPI_Finalize: nothing is left to end.
    std::printf("rank %d: after MPI_Finalize, oomflight_shutdown gives %d\n", rank, oomflight_shutdown());
    std::fflush(stdout);
  }
  return origin && oom ? 1 : 0;
}
