// The replay job: the step loop, the simulated device wired to oomflight's C API, the all-reduce and the dump.
#include "oomflight/sim/replay_job.hpp"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <optional>
#include <vector>

#include "oomflight/analysis/what_if.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/format/torch_snapshot.hpp"
#include "oomflight/oomflight.h"
#include "oomflight/record/stack_table.hpp"
#include "oomflight/sim/simulated_device.hpp"

namespace oomflight::sim {
namespace {

// Forwards the simulated device's events and gauges to oomflight, translating the decoder's stack ids into the
// ids oomflight_intern_stack gave.
class CApiSink final : public EventSink {
 public:
  CApiSink(std::vector<std::int32_t> stack_ids, int device) : stack_ids_(std::move(stack_ids)), device_(device) {}
  void event(Action action, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
             std::int32_t stack_id) override {
    const bool known = stack_id >= 0 && static_cast<std::size_t>(stack_id) < stack_ids_.size();
    oomflight_record(static_cast<int>(action) | (predating_ ? OOMFLIGHT_RECORD_PREDATES_HISTORY : 0), device_, addr,
                     size, stream, known ? stack_ids_[static_cast<std::size_t>(stack_id)] : -1);
  }
  /// While set, events stand for the allocator state that predates the trace (the start state).
  void set_predating(bool predating) { predating_ = predating; }
  void memory(const MemoryStats& s) override {
    oomflight_memory m = OOMFLIGHT_MEMORY_INIT;
    m.allocated_bytes = s.allocated_bytes;
    m.reserved_bytes = s.reserved_bytes;
    m.peak_allocated_bytes = s.peak_allocated_bytes;
    m.peak_reserved_bytes = s.peak_reserved_bytes;
    m.device_capacity_bytes = s.device_capacity_bytes;
    m.device_free_bytes = s.device_free_bytes;
    oomflight_set_memory(device_, &m);
  }
  /// The C API's stack id for a decoder stack id (-1 for none or unknown).
  std::int32_t stack_id(std::int32_t decoder_id) const {
    const bool known = decoder_id >= 0 && static_cast<std::size_t>(decoder_id) < stack_ids_.size();
    return known ? stack_ids_[static_cast<std::size_t>(decoder_id)] : -1;
  }

 private:
  std::vector<std::int32_t> stack_ids_;
  int device_;
  bool predating_ = false;
};

// Interns every stack the snapshot decoder found through the C API; returns the new id of each old one.
std::vector<std::int32_t> intern_through_c_api(const StackTableCopy& table) {
  std::vector<std::int32_t> ids;
  ids.reserve(table.stacks.size());
  std::vector<oomflight_frame> frames;
  for (const auto& stack : table.stacks) {
    frames.clear();
    for (std::uint32_t i = 0; i < stack.frame_count; ++i) {
      const auto& f = table.frames[table.stack_frames[stack.frame_offset + i]];
      frames.push_back({table.strings[f.function].c_str(), table.strings[f.file].c_str(), f.line});
    }
    std::int32_t id = -1;
    if (oomflight_intern_stack(frames.data(), frames.size(), &id) != OOMFLIGHT_OK) {
      throw std::runtime_error(oomflight_last_error());
    }
    ids.push_back(id);
  }
  return ids;
}

// The device to replay: the one asked for, else the only one whose trace has entries. A snapshot of several
// devices needs the choice: replaying one silently would show the others as empty.
int choose_device(const TorchSnapshot& snapshot, int asked, const std::string& path) {
  if (asked >= 0) return asked;
  std::vector<int> with_trace;
  for (std::size_t d = 0; d < snapshot.device_traces.size(); ++d) {
    if (!snapshot.device_traces[d].empty()) with_trace.push_back(static_cast<int>(d));
  }
  if (with_trace.size() > 1) {
    throw std::invalid_argument(fmt::format("{} holds traces of devices {}: choose one with --device", path,
                                            fmt::join(with_trace, ", ")));
  }
  return with_trace.empty() ? 0 : with_trace.front();
}

// Sleeps so that each trace entry is served at its own time_us offset from the start of the step's trace: the
// recorded times are then the trace's, not the simulator's (which serves a step in a few milliseconds).
class Pacer {
 public:
  void restart() { first_us_ = -1; }
  void operator()(std::int64_t time_us) {
    if (first_us_ < 0) {
      first_us_ = time_us;
      start_ = std::chrono::steady_clock::now();
      return;
    }
    if (time_us > first_us_) std::this_thread::sleep_until(start_ + std::chrono::microseconds(time_us - first_us_));
  }

 private:
  std::int64_t first_us_ = -1;
  std::chrono::steady_clock::time_point start_;
};

// Loops the trace; returns the failure if the device ran out of memory.
std::optional<OutOfMemory> run_steps(SimulatedDevice& device, EventSink& sink, int steps, bool mpi, Pacer* pacer,
                                     int capacity_step, std::uint64_t capacity_then, std::chrono::milliseconds delay,
                                     std::uint64_t leak, std::int32_t leak_stack) {
  for (int step = 0; step < steps; ++step) {
    oomflight_mark_batch(step);
    if (delay.count() > 0) std::this_thread::sleep_for(delay);  // a straggler's slow input pipeline
    if (pacer) pacer->restart();
    if (step == capacity_step && capacity_step > 0) device.set_capacity(capacity_then);
    std::optional<OutOfMemory> oom = step > 0 ? device.rewind(sink) : std::nullopt;
    if (!oom) oom = device.replay(sink);
    if (!oom && leak != 0) oom = device.hold(leak, leak_stack, sink);  // what this rank keeps of the step
    if (oom) return oom;
    if (mpi) {  // the gradient all-reduce: a rank that failed never arrives, so the others block here
      double grad = 1.0, sum = 0.0;
      // Recorded as any source records its collectives: the start before the call, the end once it returned (a
      // blocking MPI call returns when the operation is done). The rank's n-th all-reduce is sequence number n.
      struct oomflight_collective c = OOMFLIGHT_COLLECTIVE_INIT;
      c.op = OOMFLIGHT_COLL_ALLREDUCE;
      c.comm_id = oomflight_world_communicator();
      c.seq = static_cast<std::uint64_t>(step);
      c.count = 1;
      c.datatype = OOMFLIGHT_DTYPE_FLOAT64;
      oomflight_record_collective(&c);
      MPI_Allreduce(&grad, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      c.phase = OOMFLIGHT_COLL_END;
      oomflight_record_collective(&c);
    }
  }
  return std::nullopt;
}

}  // namespace

int run_replay_job(const ReplayOptions& o) {
  const bool mpi = oomflight_launched_by_mpi() != 0;
  if (mpi) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  }
  // A rank that cannot start must not leave the others waiting in a collective: abort the job.
  auto cannot_start = [mpi](const std::string& message) {
    oomflight_log(OOMFLIGHT_LOG_ERROR, message.c_str());
    if (mpi) MPI_Abort(MPI_COMM_WORLD, kReplayCannotStart);
    return kReplayCannotStart;
  };
  if (oomflight_init() != OOMFLIGHT_OK) return cannot_start(oomflight_last_error());
  int rank = 0;
  oomflight_rank(&rank, nullptr);
  const auto custom = o.rank_device_memory_bytes.find(rank);
  const std::uint64_t rank_capacity =
      custom != o.rank_device_memory_bytes.end() ? custom->second : o.device_memory_bytes;
  const std::uint64_t capacity = o.rank_memory_from_step > 0 ? o.device_memory_bytes : rank_capacity;

  std::optional<TorchSnapshot> snapshot;
  std::optional<SimulatedDevice> device;
  std::optional<CApiSink> sink;
  int device_id = o.device;
  std::int32_t leak_stack = kNoStack;
  try {
    StackTable stacks;
    snapshot.emplace(read_torch_snapshot(o.trace, stacks));
    if (o.rank_leak_bytes.contains(rank)) {
      // The call site the leak's blocks are allocated from, as a Python frame would name it.
      const FrameRef frames[] = {{"keep_activations_for_logging", "oomflight replay --rank-leak", 1}};
      leak_stack = stacks.intern(frames);
    }
    device_id = choose_device(*snapshot, o.device, o.trace);
    std::optional<AllocatorSettings> modelled;
    if (o.alloc_conf) modelled = parse_alloc_conf(*o.alloc_conf, allocator_settings_of(*snapshot));
    device.emplace(*snapshot, capacity, device_id, modelled);
    sink.emplace(intern_through_c_api(stacks.copy()), device_id);
  } catch (const std::exception& e) {
    return cannot_start(e.what());
  }
  // The allocator's settings of the run that wrote the trace, as the job's metadata (a real job's
  // PYTORCH_CUDA_ALLOC_CONF is in its environment instead).
  for (const auto& [key, value] : snapshot->allocator_settings) {
    oomflight_set_metadata(("allocator_settings." + key).c_str(), value.c_str());
  }
  if (o.alloc_conf) {
    // What this replay ran under instead, in the snapshot's own words: the archive's settings are the replay's.
    for (const auto& [key, value] :
         allocator_settings_entries(parse_alloc_conf(*o.alloc_conf, allocator_settings_of(*snapshot)))) {
      oomflight_set_metadata(("allocator_settings." + key).c_str(), value.c_str());
    }
    oomflight_set_metadata("allocator_settings.PYTORCH_CUDA_ALLOC_CONF", o.alloc_conf->c_str());
  }
  // The blocks and segments that predate the trace are recorded first, before batch 0 (batch -1), so that the
  // archive holds the whole allocator state and not only what the trace touched. They are flagged as predating the
  // history: the trace's own entries start after them, as in the snapshot.
  sink->set_predating(true);
  device->emit_start_state(*sink);
  sink->set_predating(false);
  if (device->start_released_bytes() != 0) {
    const std::string note = fmt::format("released {} of cached segments at the trace's start to fit {}",
                                         format_bytes(device->start_released_bytes()), format_bytes(capacity));
    oomflight_log(OOMFLIGHT_LOG_INFO, note.c_str());
  }
  // Start together, as data-parallel jobs do after broadcasting the initial parameters.
  if (mpi) MPI_Barrier(MPI_COMM_WORLD);
  Pacer pacer;
  if (o.pace) device->set_pacer([&pacer](std::int64_t time_us) { pacer(time_us); });
  const auto oom =
      run_steps(*device, *sink, o.steps, mpi, o.pace ? &pacer : nullptr, o.rank_memory_from_step, rank_capacity,
                o.rank_delay.contains(rank) ? o.rank_delay.at(rank) : std::chrono::milliseconds(0),
                o.rank_leak_bytes.contains(rank) ? o.rank_leak_bytes.at(rank) : 0, leak_stack);
  if (oom) {
    if (oomflight_is_oom("torch.OutOfMemoryError", oom->message.c_str())) {
      // The simulated allocator already recorded its oom event; ask for the dump with PyTorch's figures.
      oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
      request.kind = OOMFLIGHT_DUMP_OOM;
      request.reason = oom->message.c_str();
      request.requested_bytes = oom->requested_bytes;
      request.device_free_bytes = oom->device_free_bytes;
      request.device = device_id;
      // The allocator's state at the failure, as PyTorch's snapshot would give it, goes with the request.
      const SimulatedDevice::State state = device->state();
      std::vector<oomflight_segment_state> segments;
      for (const auto& seg : state.segments) segments.push_back({seg.address, seg.size, seg.stream, device_id, 0});
      std::vector<oomflight_block_state> blocks;
      for (const auto& b : state.blocks) {
        blocks.push_back({b.address, b.block_bytes, b.requested, sink->stack_id(b.stack_id), b.pending_free ? 1 : 0});
      }
      request.segments = segments.data();
      request.segment_count = segments.size();
      request.blocks = blocks.data();
      request.block_count = blocks.size();
      oomflight_request_dump(&request, nullptr);
    }
    // The job's own error, last, as Python prints an uncaught exception; the archive is closed by now.
    std::fprintf(stderr, "torch.OutOfMemoryError: %s\n", oom->message.c_str());
    std::fflush(stderr);
    // Like a training script whose exception escapes: exit non-zero without MPI_Finalize, and mpirun tears the
    // job down. The session ends as that exit ends it (the other ranks are told this one left), now rather than at
    // the exit, as the Python package does at an uncaught exception.
    oomflight_end(kReplayOutOfMemory);
    return kReplayOutOfMemory;
  }
  const auto stats = device->stats();
  const auto& anomalies = device->anomalies();
  const std::size_t mismatches =
      anomalies.alloc_outside_segments + anomalies.free_of_unknown_block + anomalies.free_of_unknown_segment;
  std::printf("rank %d: replayed %d step(s) of %s: peak reserved %s of %s, peak allocated %s%s\n", rank, o.steps,
              o.trace.c_str(), format_bytes(stats.peak_reserved_bytes).c_str(),
              format_bytes(stats.device_capacity_bytes).c_str(), format_bytes(stats.peak_allocated_bytes).c_str(),
              mismatches ? fmt::format(" ({} trace entries did not match the model)", mismatches).c_str() : "");
  std::fflush(stdout);
  oomflight_shutdown();
  if (mpi) MPI_Finalize();
  return kReplayFits;
}

}  // namespace oomflight::sim
