#!/usr/bin/env bash
# oomflight's snapshot reading against Python's C pickle.load of the same files, in one run (issue 9's target:
# no slower). Usage: bench/decode_vs_python.sh [BUILD_DIR] [SNAPSHOT_DIR]
set -euo pipefail
build=${1:-build}
dir=${2:-$(dirname "$0")/../../shared/data/torch-snapshots}
"$build/bench/oomflight_decode_bench" "$dir" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true |
  grep median
/usr/bin/python3 - "$dir" <<'PY'
import pickle, statistics, sys, time
for name in ("cnn-train-eor.pickle", "transformer-lm-forward-mixed-ctx128.pickle",
             "transformer-lm-fullstep-ctx128.pickle"):
    data = open(f"{sys.argv[1]}/{name}", "rb").read()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        pickle.loads(data)
        times.append(time.perf_counter() - t)
    print(f"python pickle.loads/{name}_median {statistics.median(times) * 1e3:.2f} ms")
PY
