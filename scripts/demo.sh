#!/usr/bin/env bash
# The demo: 4 MPI ranks replay a real PyTorch training step (transformer LM, forward + backward + optimizer).
# Rank 2's simulated GPU has 40 GiB, the others 64 GiB; the step needs ~57 GiB. Rank 2 runs out of memory, every
# rank writes into one archive, the job dies as a real one would, and `oomflight report` reads the archive.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
snapshots=${OOMFLIGHT_SNAPSHOTS:-$root/../shared/data/torch-snapshots}
oomflight=$root/build/bin/oomflight
work=$root/build/demo
rm -rf "$work" && mkdir -p "$work" && cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "demo: mpirun -np 4 oomflight run --run-name demo -- oomflight replay transformer-lm-fullstep-ctx128.pickle" \
     "--device-memory 64GiB --rank-device-memory 2=40GiB --steps 2"
set +e
mpirun --oversubscribe -np 4 "$oomflight" run --run-name demo -- \
  "$oomflight" replay "$snapshots/transformer-lm-fullstep-ctx128.pickle" \
  --device-memory 64GiB --rank-device-memory 2=40GiB --steps 2
status=$?
set -e
if [ "$status" -eq 0 ]; then
  echo "demo: FAILED: the job should have died of rank 2's out-of-memory error" >&2
  exit 1
fi
echo "demo: mpirun exited with status $status: rank 2's out-of-memory error ended the job, as intended"

mapfile -t archives < <(find demo -name '*.h5')
if [ "${#archives[@]}" -ne 1 ]; then
  echo "demo: FAILED: expected exactly one archive, found ${#archives[@]}: ${archives[*]}" >&2
  exit 1
fi
echo "demo: $oomflight report ${archives[0]}"
"$oomflight" report "${archives[0]}" --top 5 --frames 3
echo "demo: h5ls ${archives[0]}"
h5ls "${archives[0]}"
