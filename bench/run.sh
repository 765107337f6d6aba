#!/usr/bin/env bash
# Runs the benchmarks whose numbers docs/performance.md records. Usage: bench/run.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# 1- and 2-thread runs interleaved at random, 12 repetitions each: this shared VM drifts by 30% within a minute,
# so a ratio is only meaningful between runs taken in the same minutes.
"$build/bench/oomflight_record_bench" --benchmark_min_time=0.2 --benchmark_repetitions=12 \
  --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
# The NCCL profiler plugin per collective, when it is built (NCCL's header found).
if [[ -x "$build/bench/oomflight_collective_bench" ]]; then
  "$build/bench/oomflight_collective_bench" --benchmark_min_time=0.2 --benchmark_repetitions=12 \
    --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
fi
# The collectives analysis on hostile rows, 10^3 to 10^6, beside a sort of the same rows (issue 30).
"$build/bench/oomflight_analysis_bench" --benchmark_min_time=0.2
"$build/bench/oomflight_allocator_model_bench" --benchmark_min_time=0.3
mpirun --oversubscribe -np 4 "$build/bench/oomflight_dump_bench" 100000 5 10 sleep
mpirun --oversubscribe -np 4 "$build/bench/oomflight_dump_bench" 100000 5 0 spin
mpirun --oversubscribe -np 4 "$build/bench/oomflight_snapshot_bench" 100000 10 100
"$(dirname "$0")/snapshot_pressure.sh" "$build"
"$(dirname "$0")/decode_vs_python.sh" "$build"
"$(dirname "$0")/export_vs_python.sh" "$build"
# The PyTorch tracker with Python contexts against torch's own history, when the torch test environment and the
# extension built by the python.torch_install test exist (scripts/python_envs.sh).
torch_python=$(ls -d "$HOME"/.cache/oomflight/venv-torch-*/bin/python 2>/dev/null | head -1 || true)
if [[ -n "$torch_python" && -d "$build/torch-site" ]]; then
  PYTHONPATH="$build/torch-site" OOMFLIGHT_LIBRARY="$build/core/liboomflight.so" \
    "$torch_python" "$(dirname "$0")/torch_tracker_bench.py"
fi
