#!/usr/bin/env bash
# The demo: 4 MPI ranks replay a real PyTorch training step (a transformer LM: forward, backward, AdamW) that this
# project's own example recorded on an NVIDIA H200 (examples/pytorch/snapshots: committed, nothing beside the clone
# is needed). The step needs 6.93 GiB reserved; rank 2's simulated GPU has 6 GiB, the others 8 GiB. Rank 2 runs out
# of memory, every rank writes into one archive, the job dies as a real one would, and `oomflight report` reads it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
trace=$root/examples/pytorch/snapshots/h200-transformer-lm-step1.pickle
oomflight=$root/build/bin/oomflight
if [ ! -f "$trace" ]; then
  echo "demo: FAILED: no PyTorch snapshot at $trace (it is committed: is this a whole checkout?)" >&2
  exit 1
fi
if [ ! -x "$oomflight" ]; then
  echo "demo: FAILED: $oomflight is not built (run scripts/bootstrap.sh)" >&2
  exit 1
fi
work=$root/build/demo
rm -rf "$work" && mkdir -p "$work" && cd "$work"
# Open MPI refuses to run as root without these two, and to start more ranks than cores without --oversubscribe.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "demo: mpirun --oversubscribe -np 4 oomflight run --run-name demo -- oomflight replay $(basename "$trace")" \
     "--device-memory 8GiB --rank-device-memory 2=6GiB --steps 2 --pace --rank-delay 2=1s --rank-delay 3=1500ms"
set +e
mpirun --oversubscribe -np 4 "$oomflight" run --run-name demo -- \
  "$oomflight" replay "$trace" --device-memory 8GiB --rank-device-memory 2=6GiB --steps 2 --pace \
  --rank-delay 2=1s --rank-delay 3=1500ms 2>&1 | tee job.log
status=${PIPESTATUS[0]}
set -e
if [ "$status" -eq 0 ]; then
  echo "demo: FAILED: the job should have died of rank 2's out-of-memory error" >&2
  exit 1
fi
# The job must have died of the out-of-memory error, reported by oomflight and by the job itself, not of
# anything else.
if ! grep -q "oomflight\[rank 2\] info: rank 2 out of memory at batch 0" job.log ||
   ! grep -q "^torch.OutOfMemoryError: CUDA out of memory" job.log; then
  echo "demo: FAILED: mpirun exited with status $status, but not of rank 2's out-of-memory error (see above)" >&2
  exit 1
fi
echo "demo: mpirun exited with status $status: rank 2's out-of-memory error ended the job, as intended"

mapfile -t archives < <(find demo -name '*.h5')
if [ "${#archives[@]}" -ne 1 ]; then
  echo "demo: FAILED: expected exactly one archive, found ${#archives[@]}: ${archives[*]}" >&2
  exit 1
fi
echo "demo: $oomflight report ${archives[0]}"
"$oomflight" report "${archives[0]}" --top 5 --frames 3 | tee report.txt
# Ranks 0 and 1 finished batch 0 a second before rank 2 (a straggler) ran out of memory in it: they wait in the
# all-reduce it never entered. Rank 3, slower still, was computing batch 0.
if ! grep -q "ranks 0, 1 wait in allreduce #0 on the world communicator (4 ranks; 8 B), which rank 2 never entered: it ran out of memory in batch 0" report.txt; then
  echo "demo: FAILED: the report does not name the ranks waiting in the all-reduce that rank 2 never entered" >&2
  exit 1
fi
echo "demo: h5ls ${archives[0]}"
h5ls "${archives[0]}"
# The same archive for the tools people already use: a page to open in a browser, PyTorch snapshots for
# pytorch.org/memory_viz, one Perfetto timeline of the four ranks.
echo "demo: $oomflight report ${archives[0]} --html report.html"
"$oomflight" report "${archives[0]}" --html report.html > /dev/null
echo "demo: $oomflight export ${archives[0]} --format memory_viz -o memory_viz"
"$oomflight" export "${archives[0]}" --format memory_viz -o memory_viz
echo "demo: $oomflight export ${archives[0]} --format perfetto -o demo.perfetto.json"
"$oomflight" export "${archives[0]}" --format perfetto -o demo.perfetto.json
echo "demo: open $work/report.html in a browser, drop a pickle of $work/memory_viz on pytorch.org/memory_viz," \
     "and $work/demo.perfetto.json on ui.perfetto.dev"
