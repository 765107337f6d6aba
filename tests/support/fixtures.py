"""The data the Python test scripts share, and how a script says that what it needs is not here.

- The project's own snapshot (committed in examples/pytorch/snapshots, so every clone has it): a transformer LM's
  training step that examples/pytorch/train.py recorded on an NVIDIA H200, 3,600 trace entries, 6.93 GiB reserved at
  its peak. With the demo's capacities (every rank 8 GiB, the origin 6 GiB) the origin runs out of memory on the
  step's 998 MiB logits block (torch's message: "Tried to allocate 1000.00 MiB").
- Third-party material beside the checkout, which a plain clone does not have: PyTorch's own snapshots
  (../shared/data/torch-snapshots) and PyTorch's own viewer (../shared/viewers/memory_viz). A script that needs one
  calls `need()`, which prints what is missing and where to put it and exits SKIP: ctest reports the test as
  skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt), never as passed.

Import from a script in tests/<folder>/: sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support")).
"""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWN_SNAPSHOT = str(ROOT / "examples" / "pytorch" / "snapshots" / "h200-transformer-lm-step1.pickle")
DEVICE_MEMORY = "8GiB"  # every rank's simulated device: the whole step fits
SMALL_DEVICE_MEMORY = "6GiB"  # the origin's: out of memory in the step
OOM_MESSAGE = "CUDA out of memory. Tried to allocate 1000.00 MiB"  # and as torch's message states it (rounded)
SKIP = 77  # ctest's SKIP_RETURN_CODE for these scripts

WHERE = {
    "torch-snapshots": "put PyTorch's snapshots in ../shared/data/torch-snapshots beside the checkout",
    "memory_viz": "put PyTorch's MemoryViz.js with its local d3 copies in ../shared/viewers/memory_viz beside the "
                  "checkout",
}


def need(path: str, what: str, where: str) -> None:
    """Exits SKIP with one line naming `what` is missing at `path` and how to provide it (`where`: a key of WHERE)
    when `path` does not exist; returns otherwise."""
    if path and os.path.exists(path):
        return
    print(f"SKIPPED: {os.path.basename(sys.argv[0])} needs {what}, which is not at {path or '(no path given)'}: "
          f"{WHERE[where]}", flush=True)
    sys.exit(SKIP)
