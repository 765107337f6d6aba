// The allocator model's replay (replay_fidelity, allocator_model.hpp) against its peer in the same run: the strict
// reader's parse and decode of the same trace as a pickle (what `oomflight whatif` reads first). Issue 41's goal:
// the replay costs less than the decode; 100,000 events in under 20 ms.
// The trace is made by the model itself playing the allocator (a training step's shape: activations allocated,
// then freed in reverse, over a few weights that stay), so every event is one the replay must judge and does.
//   oomflight_allocator_model_bench [google-benchmark flags]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "oomflight/analysis/allocator_model.hpp"
#include "oomflight/analysis/what_if.hpp"
#include "oomflight/format/pickle.hpp"
#include "oomflight/format/torch_snapshot.hpp"
#include "oomflight/format/torch_snapshot_writer.hpp"

namespace {

using namespace oomflight;

TorchSnapshot make_trace(std::size_t events) {
  TorchSnapshot s;
  s.device_traces.emplace_back();
  auto& t = s.device_traces[0];
  t.reserve(events + 64);
  AllocatorModel model;
  std::mt19937_64 rng(41);
  std::uint64_t next_segment = 0x7f0000000000;
  std::vector<std::uint64_t> live;
  const auto alloc = [&](std::uint64_t size) {
    auto at = model.place(size, 0);
    if (!at) {
      const std::uint64_t rounded = model.round_size(size);
      const std::uint64_t seg = AllocatorModel::segment_size(rounded);
      model.add_segment(next_segment, seg, 0, AllocatorModel::small_pool(rounded));
      t.push_back(TraceEntry{Action::segment_alloc, next_segment, seg, 0, -1, kNoStack});
      at = next_segment;
      next_segment += seg + (2ull << 20);
    }
    model.allocate(*at, size, 0);
    t.push_back(TraceEntry{Action::alloc, *at, size, 0, -1, kNoStack});
    live.push_back(*at);
  };
  for (int w = 0; w < 16; ++w) alloc((64ull << 20) + 4096 * w);  // the weights
  const std::size_t kept = live.size();
  while (t.size() < events) {
    const int depth = 20 + static_cast<int>(rng() % 40);
    for (int i = 0; i < depth && t.size() < events; ++i) {
      const std::uint64_t size = (rng() % 4 == 0) ? 512 + rng() % (1u << 20) : (1u << 20) + rng() % (48u << 20);
      alloc(size);
    }
    while (live.size() > kept && t.size() + 2 <= events) {
      const std::uint64_t a = live.back();
      live.pop_back();
      t.push_back(TraceEntry{Action::free_requested, a, 0, 0, -1, kNoStack});
      t.push_back(TraceEntry{Action::free_completed, a, 0, 0, -1, kNoStack});
      model.free(a);
    }
  }
  return s;
}

struct NoFrames final : SnapshotFrameSource {
  std::span<const std::uint32_t> stack(std::int32_t) const override { return {}; }
  FrameRef frame(std::uint32_t) const override { return {}; }
};

void BM_Replay(benchmark::State& state) {
  const TorchSnapshot s = make_trace(static_cast<std::size_t>(state.range(0)));
  std::size_t matched = 0;
  for (auto _ : state) {
    const AllocatorFidelity f = replay_fidelity(s, 0, {});
    matched = f.allocations_matched;
    benchmark::DoNotOptimize(matched);
    if (f.allocations_matched != f.allocations) state.SkipWithError("the replay parted from its own trace");
  }
  state.counters["events"] = static_cast<double>(s.device_traces[0].size());
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * s.device_traces[0].size()));
}

// The what-if replay (what_if.hpp) of the same trace with another max_split_size_mb: the model decides every segment.
void BM_WhatIf(benchmark::State& state) {
  const TorchSnapshot s = make_trace(static_cast<std::size_t>(state.range(0)));
  const AllocatorSettings settings = parse_alloc_conf("max_split_size_mb:32");
  for (auto _ : state) {
    const WhatIfOutcome o = replay_what_if(s, 0, settings, 0);
    benchmark::DoNotOptimize(o.peak_reserved);
    if (!o.fits) state.SkipWithError("a replay without a capacity cannot fail");
  }
  state.counters["events"] = static_cast<double>(s.device_traces[0].size());
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * s.device_traces[0].size()));
}

void BM_ParseAndDecode(benchmark::State& state) {
  const TorchSnapshot s = make_trace(static_cast<std::size_t>(state.range(0)));
  const std::string bytes = write_torch_snapshot(s, NoFrames());
  for (auto _ : state) {
    StackTable stacks;
    benchmark::DoNotOptimize(decode_torch_snapshot(pickle::Document::parse(bytes), stacks));
  }
  state.counters["events"] = static_cast<double>(s.device_traces[0].size());
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * s.device_traces[0].size()));
}

BENCHMARK(BM_Replay)->Arg(10'000)->Arg(100'000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_WhatIf)->Arg(10'000)->Arg(100'000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ParseAndDecode)->Arg(10'000)->Arg(100'000)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
