// The exports of one rank's history of N events (default 100,000, a full default ring): the memory_viz pickle
// (the end state rebuilt, then written), the Perfetto JSON, the folded stacks, and the HTML page (with the
// analysis it needs). The history is synthetic but shaped like a PyTorch trace: segments of 20 MiB, blocks of
// 4 KiB to 4 MiB allocated and freed in a rolling window, 50 stacks of 30 frames. The peer, in
// bench/export_vs_python.sh: Python's pickle.dumps of the same snapshot dict (what _dump_snapshot() does after
// _snapshot(); PyTorch's own _snapshot() of 100k entries takes ~0.7 s on top, issue 9).
//   oomflight_export_bench [--events=N] [--write-pickle=PATH] [google-benchmark flags]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "oomflight/analysis/growth.hpp"
#include "oomflight/analysis/post_mortem.hpp"
#include "oomflight/export/folded.hpp"
#include "oomflight/export/html_report.hpp"
#include "oomflight/export/memory_viz.hpp"
#include "oomflight/export/perfetto.hpp"
#include "oomflight/format/archive_reader.hpp"

namespace {

std::size_t g_events = 100000;

// One rank, `n` events: segment_alloc every 64th alloc, a rolling window of 256 live blocks.
oomflight::Archive synthetic(std::size_t n) {
  using namespace oomflight;
  Archive a;
  a.header.kind = "oom";
  a.header.run_name = "bench";
  a.header.world_size = 1;
  a.header.ranks_present = {0};
  a.header.origin_ranks = {0};
  for (int s = 0; s < 50; ++s) {
    a.stacks.push_back(StackRow{static_cast<std::uint64_t>(a.stack_frames.size()), 30, 0});
    for (int f = 0; f < 30; ++f) {
      a.stack_frames.push_back(static_cast<std::uint32_t>(a.frames.size()));
      a.frames.push_back(FrameRow{static_cast<std::uint32_t>(a.strings.size()),
                                  static_cast<std::uint32_t>(a.strings.size() + 1), f + 1});
      a.strings.push_back("function_" + std::to_string(s) + "_" + std::to_string(f));
      a.strings.push_back("/home/user/project/model/layer_" + std::to_string(f) + ".py");
    }
  }
  std::vector<std::uint64_t> live;
  std::uint64_t segment = 0x7f0000000000, offset = 0;
  const std::uint64_t kSegment = 20u << 20;
  std::int64_t t = 1'000'000'000;
  std::uint64_t allocated = 0, reserved = 0;
  for (std::size_t i = 0; a.events.size() < n; ++i) {
    const std::uint64_t size = 4096u << (i % 11);
    if (offset + size > kSegment || i == 0) {
      segment += 1u << 30;
      offset = 0;
      a.events.push_back(Event{t++, segment, kSegment, 7, 0, kNoStack, 0, Action::segment_alloc, 0});
      reserved += kSegment;
    }
    const std::uint64_t addr = segment + offset;
    offset += size;
    a.events.push_back(Event{t++, addr, size, 7, 0, static_cast<std::int32_t>(i % 50), 0, Action::alloc, 0});
    allocated += size;
    live.push_back(addr);
    if (live.size() > 256) {
      const std::uint64_t old = live.front();
      live.erase(live.begin());
      a.events.push_back(Event{t++, old, 0, 7, 0, kNoStack, 0, Action::free_requested, 0});
      a.events.push_back(Event{t++, old, 0, 7, 0, kNoStack, 0, Action::free_completed, 0});
    }
  }
  a.events.resize(n);
  RankRow row;
  row.is_origin = 1;
  row.event_count = a.events.size();
  row.stack_count = a.stacks.size();
  row.frame_count = a.frames.size();
  row.string_count = a.strings.size();
  row.allocated_bytes = allocated;
  row.reserved_bytes = reserved;
  row.freeze_t_ns = t;
  a.ranks.push_back(row);
  return a;
}

const oomflight::Archive& archive() {
  static const oomflight::Archive a = synthetic(g_events);
  return a;
}

// The same history cut into 100 batches of 1,000 events: what the report's growing call sites walk (growth.hpp).
const oomflight::Archive& batched() {
  static const oomflight::Archive a = [] {
    oomflight::Archive b = archive();
    for (std::size_t i = 0; i < b.events.size(); ++i) b.events[i].batch = static_cast<std::int64_t>(i / 1000);
    return b;
  }();
  return a;
}

void BM_MemoryViz(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(oomflight::render_memory_viz(archive(), archive().ranks[0]));
  state.counters["events"] = static_cast<double>(g_events);
}
void BM_Perfetto(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(oomflight::render_perfetto(archive()));
}
void BM_Folded(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(oomflight::render_folded(archive()));
}
void BM_HtmlWithAnalysis(benchmark::State& state) {
  for (auto _ : state) {
    const auto pm = oomflight::analyze(archive(), 10);
    benchmark::DoNotOptimize(oomflight::render_html_report(archive(), pm, 6));
  }
}
void BM_GrowingCallSites(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(oomflight::growing_call_sites(batched(), batched().ranks[0], 10));
}
BENCHMARK(BM_MemoryViz)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Perfetto)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Folded)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_HtmlWithAnalysis)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GrowingCallSites)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  std::string write_pickle;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--events=", 9) == 0) {
      g_events = std::stoul(argv[i] + 9);
    } else if (std::strncmp(argv[i], "--write-pickle=", 15) == 0) {
      write_pickle = argv[i] + 15;
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (!write_pickle.empty()) {  // for the Python peer: the same snapshot, written once
    std::ofstream(write_pickle, std::ios::binary) << oomflight::render_memory_viz(archive(), archive().ranks[0]);
    return 0;
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
