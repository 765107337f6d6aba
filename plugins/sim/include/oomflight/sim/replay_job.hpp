// The replay job: a stand-in for a data-parallel training job, for demos and tests. Each rank replays a real
// PyTorch memory trace on a simulated device, one loop per batch, and joins an MPI_Allreduce on MPI_COMM_WORLD
// after each loop, as gradient all-reduce does. A rank that runs out of memory asks oomflight for the
// coordinated dump and fails, while the others wait in the collective, as real ranks wait in NCCL.
//
// It reaches oomflight only through the C API (oomflight/oomflight.h), as every plugin does: the simulated
// device's events, stacks and gauges go through oomflight_record, oomflight_intern_stack and oomflight_set_memory.
#pragma once

#include <cstdint>
#include <chrono>
#include <map>
#include <optional>
#include <string>

namespace oomflight::sim {

struct ReplayOptions {
  std::string trace;                                     ///< a torch.cuda.memory._dump_snapshot() pickle
  std::uint64_t device_memory_bytes = 0;                 ///< every rank's simulated device capacity, bytes
  std::map<int, std::uint64_t> rank_device_memory_bytes; ///< capacities for single ranks, bytes
  /// Stragglers: a rank here sleeps this long at the start of every step (a slow input pipeline), so that the
  /// others finish the step first and wait for it in the all-reduce.
  std::map<int, std::chrono::milliseconds> rank_delay;
  int steps = 1;                                         ///< loops of the trace, one batch each (>= 1)
  /// A leak: a rank here holds this many bytes more after each step, from a call site of its own
  /// (SimulatedDevice::hold), so that it runs out of memory after a number of steps.
  std::map<int, std::uint64_t> rank_leak_bytes;
  /// The step from which rank_device_memory_bytes apply; before it every rank has device_memory_bytes (0: from the
  /// start). A rank then runs out of memory later in the job, after snapshots and batches of its own.
  int rank_memory_from_step = 0;
  bool pace = false;  ///< serve each trace entry at its time_us offset from the step's start (the trace's own timing)
  int device = -1;  ///< the trace's device to replay; -1: the only device with a non-empty trace (several: an error)
  /// PYTORCH_CUDA_ALLOC_CONF options applied over the trace's own settings (parse_alloc_conf): the allocator's
  /// decisions are then the model's (SimulatedDevice's `modelled`). Empty: the trace's decisions, as recorded.
  std::optional<std::string> alloc_conf;
};

/// Exit codes of run_replay_job, as a training script's would be.
enum ReplayExit : int {
  kReplayFits = 0,         ///< every step fitted
  kReplayOutOfMemory = 1,  ///< this rank ran out of memory (after the dump), like an uncaught OutOfMemoryError
  kReplayCannotStart = 2,  ///< bad settings or an unreadable trace (under mpirun the job is aborted)
};

/// Runs the job in this process (one rank under mpirun, or a single process without it). Initialises MPI with
/// MPI_THREAD_MULTIPLE when an MPI launcher started the process, and oomflight through oomflight_init().
/// Prints the simulated job's own output (its progress on stdout, its OutOfMemoryError on stderr); oomflight's
/// messages go through its log. Returns a ReplayExit. Call once per process, from the main thread.
int run_replay_job(const ReplayOptions& options);

}  // namespace oomflight::sim
