#!/usr/bin/env bash
# Runs the benchmarks whose numbers docs/performance.md records. Usage: bench/run.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$build/bench/oomflight_record_bench" --benchmark_min_time=0.5
mpirun --oversubscribe -np 4 "$build/bench/oomflight_dump_bench" 100000 5 10 sleep
mpirun --oversubscribe -np 4 "$build/bench/oomflight_dump_bench" 100000 5 0 spin
