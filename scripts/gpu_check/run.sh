#!/usr/bin/env bash
# The GPU check, on the GPU machine, from the checkout's root, after scripts/gpu_check/prepare.sh made gpu-check/
# here and it was carried there (device run with carry ["gpu-check"]):
#   scripts/gpu_check/run.sh OUT [CHECK...]   (check_gpu.py's names; all by default)
# In order: build the extension against that machine's torch (pip install --no-build-isolation of the extension
# alone, into a private folder), python -m oomflight.torch --check, then check_gpu.py's checks. Writes OUT/summary.json, the
# check's logs and the example's real snapshots (OUT/snapshots: one normal step, the capped rank's OOM).
set -uo pipefail
out=${1:?usage: run.sh OUT}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
[[ -f "$root/gpu-check/env.sh" ]] || { echo "run.sh: $root/gpu-check is missing: run scripts/gpu_check/prepare.sh here and carry it" >&2; exit 2; }
source "$root/gpu-check/env.sh"
site=$(mktemp -d /tmp/oomflight-site-XXXX)
echo "== build the extension against $(python3 -c 'import torch; print(torch.__version__)')"
# The extension alone (that machine has no MPI or HDF5 to build liboomflight with; the carried one is used), with
# the carried scikit-build-core (docs/install.md).
PYTHONPATH="$root/gpu-check/python${PYTHONPATH:+:$PYTHONPATH}" python3 -m pip install -q --no-index --no-deps \
  --no-build-isolation --config-settings=cmake.define.OOMFLIGHT_PYTHON_EXTENSION_ONLY=ON --target "$site" "$root/python" \
  > "$out/pip.log" 2>&1 || { tail -40 "$out/pip.log"; exit 1; }
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
echo "== python -m oomflight.torch --check"
python3 -m oomflight.torch --check 2>&1 | tee "$out/check.txt"
echo "== checks"
python3 "$root/scripts/gpu_check/check_gpu.py" "$out" "${@:2}" 2>&1 | tee "$out/checks.log"
exit "${PIPESTATUS[0]}"
