// `oomflight replay TRACE.pickle --device-memory SIZE [--steps N]`: a stand-in for a data-parallel training
// job. Each rank replays a real PyTorch memory trace on a simulated device, one loop per batch, and joins an
// MPI_Allreduce on MPI_COMM_WORLD after each loop, as gradient all-reduce does; a rank that runs out of memory
// triggers the coordinated dump and exits non-zero, while the others wait in the collective, as real ranks
// wait in NCCL.
#include <fmt/format.h>
#include <mpi.h>

#include <cstdlib>
#include <optional>

#include "commands.hpp"
#include "oomflight/logging.hpp"
#include "oomflight/oom_classifier.hpp"
#include "oomflight/session.hpp"
#include "oomflight/sim/simulated_device.hpp"
#include "oomflight/torch_snapshot.hpp"
#include "oomflight/units.hpp"

namespace oomflight::cli {
namespace {

struct ReplayOptions {
  std::string trace;
  std::string device_memory;
  std::vector<std::string> rank_device_memory;
  int steps = 1;
};

// Forwards the simulated device's events into the recorder.
class RecorderSink final : public sim::EventSink {
 public:
  explicit RecorderSink(Recorder& r) : recorder_(r) {}
  void event(Action action, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
             std::int32_t stack_id) override {
    recorder_.record(action, 0, addr, size, stream, stack_id);
  }
  void memory(const MemoryStats& stats) override { recorder_.set_memory(stats); }

 private:
  Recorder& recorder_;
};

// --device-memory, or this rank's --rank-device-memory R=SIZE.
std::uint64_t capacity_for(const ReplayOptions& o, int rank) {
  std::uint64_t bytes = parse_bytes(o.device_memory);
  for (const auto& spec : o.rank_device_memory) {
    const auto eq = spec.find('=');
    if (eq == std::string::npos) {
      throw std::invalid_argument(fmt::format("--rank-device-memory '{}': expected RANK=SIZE, e.g. 2=40GiB", spec));
    }
    int r = -1;
    try {
      r = std::stoi(spec.substr(0, eq));
    } catch (const std::exception&) {
      throw std::invalid_argument(fmt::format("--rank-device-memory '{}': '{}' is not a rank", spec, spec.substr(0, eq)));
    }
    if (r == rank) bytes = parse_bytes(spec.substr(eq + 1));
  }
  return bytes;
}

// Loops the trace; returns the failure if the device ran out of memory.
std::optional<sim::OutOfMemory> run_steps(Session& session, sim::SimulatedDevice& device, int steps, bool mpi) {
  RecorderSink sink(session.recorder());
  for (int step = 0; step < steps; ++step) {
    session.recorder().mark_batch(step);
    std::optional<sim::OutOfMemory> oom = step > 0 ? device.rewind(sink) : std::nullopt;
    if (!oom) oom = device.replay(sink);
    if (oom) return oom;
    if (mpi) {  // the gradient all-reduce: a rank that failed never arrives, so the others block here
      double grad = 1.0, sum = 0.0;
      MPI_Allreduce(&grad, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
  }
  return std::nullopt;
}

int replay(const ReplayOptions& o) {
  const bool mpi = launched_by_mpi();
  if (mpi) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  }
  // A rank that cannot start must not leave the others waiting in a collective: abort the job.
  auto fatal = [mpi](const std::string& message) {
    fmt::print(stderr, "oomflight: error: {}\n", message);
    if (mpi) MPI_Abort(MPI_COMM_WORLD, 2);
    return 2;
  };
  std::optional<Session> session;
  try {
    session.emplace(Config::from_environment(), mpi ? MPI_COMM_WORLD : MPI_COMM_NULL);
  } catch (const std::exception& e) {
    return fatal(e.what());
  }
  const int rank = session->identity().rank;
  std::optional<TorchSnapshot> snapshot;
  std::optional<sim::SimulatedDevice> device;
  try {
    snapshot.emplace(read_torch_snapshot(o.trace, session->recorder().stacks()));
    device.emplace(*snapshot, capacity_for(o, rank));
  } catch (const std::exception& e) {
    return fatal(fmt::format("rank {}: {}", rank, e.what()));
  }
  // Start together, as data-parallel jobs do after broadcasting the initial parameters.
  if (mpi) MPI_Barrier(MPI_COMM_WORLD);
  const auto oom = run_steps(*session, *device, o.steps, mpi);
  if (oom) {
    const std::string type = "torch.OutOfMemoryError";
    if (classify_oom(type, oom->message) != OomKind::none) {
      session->trigger({oom->message, oom->requested_bytes, oom->device_free_bytes});
    }
    fmt::print(stderr, "rank {}: {}: {}\n", rank, type, oom->message);
    session->shutdown();
    // Like a training script whose exception escapes: exit non-zero without MPI_Finalize, and mpirun tears
    // the job down. The archive is closed by now.
    return 1;
  }
  const auto stats = device->stats();
  const auto& anomalies = device->anomalies();
  fmt::print("rank {}: replayed {} step(s) of {}: peak reserved {} of {}, peak allocated {}{}\n", rank, o.steps,
             o.trace, format_bytes(stats.peak_reserved_bytes), format_bytes(stats.device_capacity_bytes),
             format_bytes(stats.peak_allocated_bytes),
             anomalies.alloc_outside_segments + anomalies.free_of_unknown_block + anomalies.free_of_unknown_segment
                 ? fmt::format(" ({} trace entries did not match the model)",
                               anomalies.alloc_outside_segments + anomalies.free_of_unknown_block +
                                   anomalies.free_of_unknown_segment)
                 : "");
  session->shutdown();
  session.reset();
  if (mpi) MPI_Finalize();
  return 0;
}

}  // namespace

Command add_replay(CLI::App& app) {
  auto* sub = app.add_subcommand("replay", "Replay a PyTorch memory snapshot's trace on a simulated device");
  auto o = std::make_shared<ReplayOptions>();
  sub->add_option("trace", o->trace, "A torch.cuda.memory._dump_snapshot() pickle")->required();
  sub->add_option("--device-memory", o->device_memory, "Simulated device capacity, e.g. 40GiB")->required();
  sub->add_option("--rank-device-memory", o->rank_device_memory,
                  "Capacity for one rank, RANK=SIZE (repeatable), e.g. 2=40GiB");
  sub->add_option("--steps", o->steps, "Loops of the trace, one batch each")->check(CLI::PositiveNumber)
      ->capture_default_str();
  return {sub, [o] { return replay(*o); }};
}

}  // namespace oomflight::cli
