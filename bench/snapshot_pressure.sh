#!/usr/bin/env bash
# Snapshots under pressure, side by side with their floor, on 4 ranks of the unpaced replay (batches of about
# 15 ms, shorter than a snapshot's write): per-rank peak RSS and the job's wall time, for
#   1. no snapshots (the floor);
#   2. a window every batch for 600 batches (OOMFLIGHT_SNAPSHOT_EVERY=1ba): the bound on waiting windows;
# and the time an out-of-memory error takes to end the job (rank 2 fails in batch 3), without and with snapshots
# every batch. Usage: bench/snapshot_pressure.sh [BUILD_DIR] [SNAPSHOT_DIR]. docs/performance.md records the figures.
set -euo pipefail
build=$(realpath "${1:-build}")
snapshots=$(realpath "${2:-../shared/data/torch-snapshots}")
trace="$snapshots/transformer-lm-fullstep-ctx128.pickle"
cli="$build/bin/oomflight"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Each rank runs under a Python parent that writes its children's peak RSS (KiB) to peak.RANK.
peak='import os, resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); open("peak." + os.environ["OMPI_COMM_WORLD_RANK"], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); sys.exit(r.returncode)'
run() {  # NAME STEPS [mpirun -x ...]
  local name=$1 steps=$2
  shift 2
  mkdir -p "$work/$name" && cd "$work/$name"
  local start end
  start=$(date +%s.%N)
  mpirun --oversubscribe -np 4 -x OOMFLIGHT_MAX_DUMPS=3 "$@" python3 -c "$peak" "$cli" run --run-name "$name" -- \
    "$cli" replay "$trace" --device-memory 64GiB --steps "$steps" > out.txt 2>&1
  end=$(date +%s.%N)
  local written skipped
  written=$(grep -c "written by 4 ranks" out.txt || true)
  skipped=$({ grep -o "([0-9]* earlier window" out.txt || true; } | tr -d '(' | awk '{s += $1} END {print s + 0}')
  skipped=$((skipped + $({ grep -o "the last [0-9]* snapshot" out.txt || true; } | awk '{s += $3} END {print s + 0}')))
  printf '%-28s wall %6.2f s   peak RSS per rank (MiB): %s   archives %s, windows skipped %s\n' "$name" \
    "$(echo "$end - $start" | bc)" "$(for r in 0 1 2 3; do echo -n "$(( $(cat peak.$r) / 1024 )) "; done)" \
    "$written" "$skipped"
}
oom() {  # NAME [mpirun -x ...]: rank 2 fails in batch 3; the job's wall time
  local name=$1
  shift
  mkdir -p "$work/$name" && cd "$work/$name"
  local start end
  start=$(date +%s.%N)
  mpirun --oversubscribe -np 4 "$@" "$cli" run --run-name "$name" -- "$cli" replay "$trace" --device-memory 64GiB \
    --rank-device-memory 2=40GiB --rank-memory-from-step 3 --steps 6 > out.txt 2>&1 || true
  end=$(date +%s.%N)
  printf '%-28s wall %6.2f s   %s\n' "$name" "$(echo "$end - $start" | bc)" "$(ls "$name/oomflight" | tr '\n' ' ')"
}
run floor-no-snapshots 600
run snapshot-every-batch 600 -x OOMFLIGHT_SKIP_BATCHES=0 -x OOMFLIGHT_SNAPSHOT_EVERY=1ba
for i in 1 2 3; do
  oom "oom-without-snapshots-$i"
  oom "oom-snapshots-every-batch-$i" -x OOMFLIGHT_SKIP_BATCHES=0 -x OOMFLIGHT_SNAPSHOT_EVERY=1ba
done
