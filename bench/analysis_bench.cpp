// The collectives analysis (analyze_collectives, and every verdict's sentences) on hostile rows, from 10^3 to 10^6
// (issue 30: 200,000 starts on 200,000 communicators were killed at 60 s; 100k starts plus 100k ends whose starts
// never came took 54 s). Two shapes, each beside a floor in the same run: sorting the same rows by (rank,
// communicator, operation, sequence number), an O(n log n) pass that any pairing of them must at least match.
//   distinct: one rank enters n operations, each on a communicator of its own (n verdicts);
//   orphans:  one rank has n/2 ends whose starts never came, then n/2 starts, on one communicator.
// Per-row time that stays flat from 10^3 to 10^6 is near-linear growth; a quadratic analysis multiplies it by 1,000.
//   oomflight_analysis_bench [google-benchmark flags]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "oomflight/analysis/collectives.hpp"

namespace {

using namespace oomflight;
constexpr std::uint64_t kWorld = 0x6f6f6d776f726c64ull;

Archive hostile(std::size_t n, bool orphans) {
  Archive a;
  a.header.kind = "oom";
  a.header.world_size = 2;
  for (int r = 0; r < 2; ++r) {
    RankRow row;
    row.rank = r;
    row.is_origin = r == 1 ? 1 : 0;
    a.ranks.push_back(row);
    CommunicatorRow c;
    c.rank = r;
    c.comm_rank = r;
    c.comm_size = 2;
    c.comm_id = kWorld;
    set_fixed_string(c.name, "world");
    a.communicators.push_back(c);
  }
  a.collectives.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    CollectiveRow r;
    r.rank = 0;
    r.op = CollectiveOp::allreduce;
    r.t_ns = static_cast<std::int64_t>(i + 1);
    if (orphans) {
      r.comm_id = kWorld;
      r.seq = i;
      r.phase = i < n / 2 ? CollectivePhase::end : CollectivePhase::start;
    } else {
      r.comm_id = i + 1;
    }
    a.collectives.push_back(r);
  }
  return a;
}

void analysis(benchmark::State& state, bool orphans) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const Archive a = hostile(n, orphans);
  std::size_t sentences = 0;
  for (auto _ : state) {
    const CollectiveAnalysis c = analyze_collectives(a);
    for (const CommunicatorVerdict& v : c.communicators) sentences += describe_verdict(a, c, v).size();
    benchmark::DoNotOptimize(sentences);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.counters["ns_per_row"] = benchmark::Counter(static_cast<double>(state.iterations() * n),
                                                    benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// The floor: a copy of the rows sorted by the key the pairing matches on.
void sort_floor(benchmark::State& state, bool orphans) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const Archive a = hostile(n, orphans);
  for (auto _ : state) {
    std::vector<CollectiveRow> rows = a.collectives;
    std::sort(rows.begin(), rows.end(), [](const CollectiveRow& x, const CollectiveRow& y) {
      return std::tie(x.rank, x.comm_id, x.op, x.seq) < std::tie(y.rank, y.comm_id, y.op, y.seq);
    });
    benchmark::DoNotOptimize(rows.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.counters["ns_per_row"] = benchmark::Counter(static_cast<double>(state.iterations() * n),
                                                    benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void DistinctCommunicators(benchmark::State& s) { analysis(s, false); }
void DistinctCommunicatorsSortFloor(benchmark::State& s) { sort_floor(s, false); }
void OrphanEnds(benchmark::State& s) { analysis(s, true); }
void OrphanEndsSortFloor(benchmark::State& s) { sort_floor(s, true); }

BENCHMARK(DistinctCommunicators)->RangeMultiplier(10)->Range(1000, 1000000)->Unit(benchmark::kMillisecond);
BENCHMARK(DistinctCommunicatorsSortFloor)->RangeMultiplier(10)->Range(1000, 1000000)->Unit(benchmark::kMillisecond);
BENCHMARK(OrphanEnds)->RangeMultiplier(10)->Range(1000, 1000000)->Unit(benchmark::kMillisecond);
BENCHMARK(OrphanEndsSortFloor)->RangeMultiplier(10)->Range(1000, 1000000)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
