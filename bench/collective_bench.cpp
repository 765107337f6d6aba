// Nanoseconds per collective recorded, side by side with its floor (one CLOCK_MONOTONIC read), in one run:
// - oomflight_record_collective, a start and an end (what any source pays per operation);
// - the NCCL profiler plugin as NCCL calls it (dlopen of libnccl-profiler-oomflight.so, ncclProfiler_v5's
//   function pointers): a collective's startEvent + stopEvent with no kernel channels (two records), and a whole
//   collective as NCCL 2.28 reports it with the plugin's mask: start, two kernel channels (start,
//   recordEventState, stop) and stop (a start and a device end);
// - the same start + stop in a process where oomflight is not initialised (the plugin stays loaded and quiet).
// One thread: NCCL calls a communicator's events from the user's thread and its proxy thread, one each.
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cstdio>

#include "clock_floor.hpp"
#include "oomflight/oomflight.h"
#include "profiler_abi.hpp"

namespace nccl = oomflight::nccl;

namespace {

// oomflight initialised (or not) for a benchmark; single process (no mpirun): no MPI call.
bool set_initialised(benchmark::State& state, bool wanted) {
  int rank = 0;
  const bool now = oomflight_rank(&rank, nullptr) == OOMFLIGHT_OK;
  if (now == wanted) return true;
  const int rc = wanted ? oomflight_init() : oomflight_shutdown();
  if (rc != OOMFLIGHT_OK) state.SkipWithError(oomflight_last_error());
  return rc == OOMFLIGHT_OK;
}

// The plugin as NCCL 2.28 opens it, with one communicator's context.
struct Plugin {
  void* lib = nullptr;
  const nccl::ProfilerV5* p = nullptr;
  void* ctx = nullptr;

  explicit Plugin(benchmark::State& state) {
    lib = dlopen(OOMFLIGHT_NCCL_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) p = static_cast<const nccl::ProfilerV5*>(dlsym(lib, "ncclProfiler_v5"));
    int mask = 0;
    if (p == nullptr || p->init(&ctx, 0x1234abcd, &mask, "bench", 1, 2, 0, nullptr) != nccl::kSuccess) {
      state.SkipWithError("cannot load " OOMFLIGHT_NCCL_PLUGIN);
      p = nullptr;
    }
  }
  ~Plugin() {
    if (p != nullptr) p->finalize(ctx);
    if (lib != nullptr) dlclose(lib);
  }
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;
};

nccl::EventDescrV5 allreduce(int channels) {
  nccl::EventDescrV5 d{};
  d.type = nccl::kColl;
  d.coll.func = "AllReduce";
  d.coll.datatype = "ncclFloat32";
  d.coll.count = 1u << 20;
  d.coll.nChannels = static_cast<std::uint8_t>(channels);
  return d;
}

void BM_RecordCollectivePair(benchmark::State& state) {
  if (!set_initialised(state, true)) return;
  oomflight_collective r = OOMFLIGHT_COLLECTIVE_INIT;
  r.op = OOMFLIGHT_COLL_ALLREDUCE;
  r.comm_id = 0x1234abcd;
  r.count = 1u << 20;
  r.datatype = OOMFLIGHT_DTYPE_FLOAT32;
  for (auto _ : state) {
    r.phase = OOMFLIGHT_COLL_START;
    benchmark::DoNotOptimize(oomflight_record_collective(&r));
    r.phase = OOMFLIGHT_COLL_END;
    r.flags = OOMFLIGHT_COLL_DEVICE_COMPLETION;
    benchmark::DoNotOptimize(oomflight_record_collective(&r));
    ++r.seq;
    r.flags = 0;
  }
  state.SetItemsProcessed(state.iterations());
}

// startEvent + stopEvent of one collective; state.range(0): 1 with oomflight initialised, 0 without.
void BM_PluginStartStop(benchmark::State& state) {
  if (!set_initialised(state, state.range(0) != 0)) return;
  Plugin plugin(state);
  if (plugin.p == nullptr) return;
  nccl::EventDescrV5 d = allreduce(0);
  for (auto _ : state) {
    void* handle = nullptr;
    plugin.p->startEvent(plugin.ctx, &handle, &d);
    if (handle != nullptr) plugin.p->stopEvent(handle);
    ++d.coll.seqNumber;
  }
  state.SetItemsProcessed(state.iterations());
}

// A collective on two channels as NCCL reports it: 8 calls, a start and a device end recorded.
void BM_PluginCollectiveWithChannels(benchmark::State& state) {
  if (!set_initialised(state, true)) return;
  Plugin plugin(state);
  if (plugin.p == nullptr) return;
  nccl::EventDescrV5 d = allreduce(2);
  nccl::EventDescrV5 ch[2] = {};
  nccl::EventStateArgs args{};
  for (auto _ : state) {
    void* handle = nullptr;
    void* channel[2] = {};
    plugin.p->startEvent(plugin.ctx, &handle, &d);
    for (int c = 0; c < 2; ++c) {
      ch[c].type = nccl::kKernelCh;
      ch[c].parentObj = handle;
      ch[c].kernelCh.channelId = static_cast<std::uint8_t>(c);
      plugin.p->startEvent(plugin.ctx, &channel[c], &ch[c]);
    }
    for (void* c : channel) {
      plugin.p->recordEventState(c, nccl::kKernelChStop, &args);
      plugin.p->stopEvent(c);
    }
    plugin.p->stopEvent(handle);
    ++d.coll.seqNumber;
  }
  state.SetItemsProcessed(state.iterations());
}

}  // namespace

BENCHMARK(BM_ClockGettime)->UseRealTime();
BENCHMARK(BM_RecordCollectivePair)->UseRealTime();
BENCHMARK(BM_PluginStartStop)->Arg(1)->UseRealTime();
BENCHMARK(BM_PluginCollectiveWithChannels)->UseRealTime();
BENCHMARK(BM_PluginStartStop)->Arg(0)->UseRealTime();

BENCHMARK_MAIN();
