#!/usr/bin/env bash
# oomflight's exports of one rank's 100,000 events, then the peer in the same run: Python's C pickle.dumps of the
# same snapshot dict (what torch.cuda.memory._dump_snapshot() does once _snapshot() has built the dict; PyTorch's
# _snapshot() itself takes ~0.7 s for 100k entries). Usage: bench/export_vs_python.sh [BUILD_DIR] [EVENTS]
set -euo pipefail
build=${1:-build}
events=${2:-100000}
"$build/bench/oomflight_export_bench" --events="$events" --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true | grep median
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
"$build/bench/oomflight_export_bench" --events="$events" --write-pickle="$tmp"
/usr/bin/python3 - "$tmp" <<'PY'
import os, pickle, statistics, sys, time
data = pickle.load(open(sys.argv[1], "rb"))
times = []
for _ in range(5):
    t = time.perf_counter()
    out = pickle.dumps(data, protocol=4)
    times.append(time.perf_counter() - t)
entries = sum(len(t) for t in data["device_traces"])
print(f"python pickle.dumps of the same snapshot ({entries} entries, {len(out)} bytes; ours "
      f"{os.path.getsize(sys.argv[1])} bytes): median {statistics.median(times) * 1e3:.2f} ms")
PY
