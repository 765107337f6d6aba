// Nanoseconds to record one event, side by side with its floor (one CLOCK_MONOTONIC read): the ring alone, the
// recorder (clock read + ring), and the C API a plugin calls (the recorder behind a function call into
// liboomflight), with 1 and 2 threads.
#include <benchmark/benchmark.h>

#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "oomflight/oomflight.h"
#include "oomflight/record/recorder.hpp"
#include "clock_floor.hpp"
#include "linked_c_api.hpp"

namespace {

// The default bound (100,000 events: an 8 MiB slot array, beyond L2, so every event's slot is a cache miss)
// and a small one (2,048 events: 384 KiB, within L2). Side by side they separate what two threads cost each
// other (shared lines) from what they cost the memory system (stores to lines not in cache).
constexpr std::int64_t kDefaultEntries = 100000, kSmallEntries = 2048;

oomflight::Recorder& shared_recorder(std::int64_t entries = kDefaultEntries) {
  static oomflight::Recorder big(kDefaultEntries), small(kSmallEntries);
  return entries == kSmallEntries ? small : big;
}

oomflight::Ring& shared_ring(std::int64_t entries) {
  static oomflight::Ring big(kDefaultEntries), small(kSmallEntries);
  return entries == kSmallEntries ? small : big;
}

void BM_RingPush(benchmark::State& state) {
  oomflight::Event e;
  e.action = oomflight::Action::alloc;
  e.size = 512;
  oomflight::Ring& ring = shared_ring(state.range(0));
  for (auto _ : state) {
    e.addr += 512;
    e.t_ns += 1;
    benchmark::DoNotOptimize(ring.push(e));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RingPush)->Arg(kDefaultEntries)->Arg(kSmallEntries)->Threads(1)->Threads(2)->UseRealTime();

// The floor for two writers: each thread stores 64-byte records round-robin into its own private array of the
// ring's slot-array size. No line is shared, so whatever two threads lose here against one is the machine's
// (store bandwidth to lines not in cache, a shared L3, the hypervisor), not the ring's.
void BM_PrivateLineStores(benchmark::State& state) {
  struct alignas(64) Line {
    std::uint64_t words[8];
  };
  const std::size_t lines = oomflight::Ring(static_cast<std::size_t>(state.range(0))).slot_count();
  std::vector<Line> mine(lines);
  std::size_t i = 0;
  std::uint64_t n = 0;
  for (auto _ : state) {
    Line& l = mine[i];
    for (int w = 0; w < 8; ++w) l.words[w] = n + static_cast<std::uint64_t>(w);
    benchmark::ClobberMemory();
    i = (i + 1) & (lines - 1);
    ++n;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PrivateLineStores)->Arg(kDefaultEntries)->Arg(kSmallEntries)->Threads(1)->Threads(2)->UseRealTime();

void BM_RecorderRecord(benchmark::State& state) {
  std::uint64_t addr = 0;
  oomflight::Recorder& recorder = shared_recorder(state.range(0));
  for (auto _ : state) {
    addr += 512;
    benchmark::DoNotOptimize(recorder.record(oomflight::Action::alloc, 0, addr, 512, 7));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RecorderRecord)->Arg(kDefaultEntries)->Arg(kSmallEntries)->Threads(1)->Threads(2)->UseRealTime();

BENCHMARK(BM_ClockGettime)->Threads(1)->UseRealTime();

void BM_Rdtsc(benchmark::State& state) {
  const oomflight::EventClock clock(true);  // the TSC where it is invariant, else CLOCK_MONOTONIC
  state.SetLabel(clock.source() == oomflight::EventClock::Source::tsc ? "tsc" : "monotonic (no invariant TSC)");
  for (auto _ : state) benchmark::DoNotOptimize(clock.now());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Rdtsc)->Threads(1)->UseRealTime();

void BM_RecorderRecordMonotonic(benchmark::State& state) {
  static oomflight::Recorder recorder(100000, /*allow_tsc=*/false);  // the fallback's cost, side by side
  std::uint64_t addr = 0;
  for (auto _ : state) {
    addr += 512;
    benchmark::DoNotOptimize(recorder.record(oomflight::Action::alloc, 0, addr, 512, 7));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RecorderRecordMonotonic)->Threads(1)->UseRealTime();

void BM_CApiRecord(benchmark::State& state) {
  // A single process (no mpirun): oomflight_init makes no MPI call. Only the first thread initialises.
  static const int init = oomflight_init();
  if (init != OOMFLIGHT_OK) {
    state.SkipWithError(oomflight_last_error());
    return;
  }
  std::uint64_t addr = 0;
  for (auto _ : state) {
    addr += 512;
    benchmark::DoNotOptimize(oomflight_record(OOMFLIGHT_ALLOC, 0, addr, 512, 7, -1));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_CApiRecord)->Threads(1)->Threads(2)->UseRealTime();

// What the PyTorch plugin does per TraceEntry: map the action by name, oomflight_record, update and publish the
// device's gauges (oomflight_set_memory), all through the C API's function pointers.
struct StandInEntry {
  enum Action { ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP,
                SNAPSHOT, OOM };
  Action action_ = ALLOC;
  std::int8_t device_ = 0;
  std::size_t addr_ = 0;
  void* stream_ = nullptr;
  std::size_t size_ = 512;
};

void BM_TrackerToRing(benchmark::State& state) {
  static const int init = oomflight_init();
  if (init != OOMFLIGHT_OK && init != OOMFLIGHT_ESTATE) {
    state.SkipWithError(oomflight_last_error());
    return;
  }
  namespace tp = oomflight::torch_plugin;
  static tp::TraceTracker tracker(tp::linked_c_api());
  StandInEntry e;
  for (auto _ : state) {
    e.addr_ += 512;
    e.action_ = e.action_ == StandInEntry::ALLOC ? StandInEntry::FREE_REQUESTED : StandInEntry::ALLOC;
    tracker.on_entry(e);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_TrackerToRing)->Threads(1)->UseRealTime();

// The same path with OOMFLIGHT_HEADROOM_DUMP off and on, side by side (issue 42): allocations (reserved does not
// move, so the check ends at one compare) and segment events (reserved moves: the check compares against the
// threshold). The device is seeded with 80 GiB and 1 GiB reserved, far below 90%: no dump is taken. Each run starts
// a session of its own (oomflight_shutdown, then oomflight_init_settings).
void BM_TrackerHeadroom(benchmark::State& state) {
  const bool headroom = state.range(0) != 0, segments = state.range(1) != 0;
  (void)oomflight_shutdown();
  const char* names[] = {"OOMFLIGHT_HEADROOM_DUMP"};
  const char* values[] = {"0.9"};
  if (oomflight_init_settings(names, values, headroom ? 1 : 0) != OOMFLIGHT_OK) {
    state.SkipWithError(oomflight_last_error());
    return;
  }
  namespace tp = oomflight::torch_plugin;
  auto tracker = std::make_unique<tp::TraceTracker>(tp::linked_c_api());
  tracker->seed(0, 0, std::int64_t{1} << 30, std::uint64_t{80} << 30);
  StandInEntry e;
  const auto first = segments ? StandInEntry::SEGMENT_ALLOC : StandInEntry::ALLOC;
  const auto second = segments ? StandInEntry::SEGMENT_FREE : StandInEntry::FREE_REQUESTED;
  e.size_ = segments ? std::size_t{2} << 20 : 512;
  for (auto _ : state) {
    e.addr_ += 512;
    e.action_ = e.action_ == first ? second : first;
    tracker->on_entry(e);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(std::string("headroom ") + (headroom ? "0.9, " : "off, ") +
                 (segments ? "segment events" : "allocations"));
  (void)oomflight_shutdown();
}
BENCHMARK(BM_TrackerHeadroom)->Args({0, 0})->Args({1, 0})->Args({0, 1})->Args({1, 1})->UseRealTime();

// A batch's end as the session takes it (oomflight_mark_batch): the batch table's row, the snapshot schedule, and the
// running forecast's least-squares line over the last 64 batches (PeakForecast). Once per training step, against
// a step's own work of milliseconds at least.
void BM_CApiMarkBatch(benchmark::State& state) {
  (void)oomflight_shutdown();
  if (oomflight_init() != OOMFLIGHT_OK) {
    state.SkipWithError(oomflight_last_error());
    return;
  }
  oomflight_memory m = OOMFLIGHT_MEMORY_INIT;
  m.device_capacity_bytes = std::uint64_t{80} << 30;
  std::int64_t batch = 0;
  for (auto _ : state) {
    m.reserved_bytes = (std::uint64_t{1} << 30) + static_cast<std::uint64_t>(batch % 7) * (1u << 20);
    oomflight_set_memory(0, &m);
    benchmark::DoNotOptimize(oomflight_mark_batch(++batch));
  }
  state.SetItemsProcessed(state.iterations());
  (void)oomflight_shutdown();
}
BENCHMARK(BM_CApiMarkBatch)->UseRealTime();

void BM_Freeze100k(benchmark::State& state) {
  oomflight::Recorder recorder(100000);
  for (int i = 0; i < 100000; ++i) recorder.record(oomflight::Action::alloc, 0, 512u * i, 512, 0);
  for (auto _ : state) benchmark::DoNotOptimize(recorder.freeze());
}
BENCHMARK(BM_Freeze100k)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
