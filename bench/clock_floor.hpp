// The floor the hot-path benchmarks are read against, in each of their runs: one clock_gettime(CLOCK_MONOTONIC).
#ifndef OOMFLIGHT_BENCH_CLOCK_FLOOR_HPP
#define OOMFLIGHT_BENCH_CLOCK_FLOOR_HPP

#include <benchmark/benchmark.h>

#include <ctime>

inline void BM_ClockGettime(benchmark::State& state) {
  timespec ts{};
  for (auto _ : state) {
    clock_gettime(CLOCK_MONOTONIC, &ts);
    benchmark::DoNotOptimize(ts);
  }
  state.SetItemsProcessed(state.iterations());
}

#endif  // OOMFLIGHT_BENCH_CLOCK_FLOOR_HPP
