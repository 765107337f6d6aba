"""Every memory_viz export the test suite makes, in PyTorch's own viewer (MemoryViz.js in headless Chromium,
through tests/export/memory_viz_viewer.py), with PyTorch's own snapshots as the control:

- the three shared snapshots themselves (the control: what PyTorch wrote must pass, or the check is wrong);
- the export of their import (3 ranks), and of that archive after `merge`;
- the export of the replay's 4-rank OOM archive (the demo's job on the project's own snapshot: rank 2 runs out of
  memory in batch 0, the others are frozen where they were; rank 2's segments are its /state_segments rows, the
  others' are rebuilt);
- the export of a scheduled snapshot archive (4 ranks, one window of one batch).

Each pickle is shown in the viewer's three views, and in Allocator State History the first, a middle and the last
entry are selected. Any page error, or a view whose drawing does not match what the pickle holds, fails the test.
Then PyTorch's own Python readers (torch.cuda._memory_viz: segsum, memory, segments, trace, trace_plot,
segment_plot, compare) read every pickle, in the real-torch environment (tests/export/memory_viz_torch_readers.py).

Needs PyTorch's viewer and snapshots beside the checkout (../shared): without them it exits 77, which ctest reports
as skipped, naming what is missing.

Usage: memory_viz_in_viewer.py OOMFLIGHT_CLI SNAPSHOT_DIR VIEWER_DIR TORCH_PYTHON
"""
import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from fixtures import DEVICE_MEMORY, OWN_SNAPSHOT, SMALL_DEVICE_MEMORY, need  # noqa: E402  (tests/support)

CLI, SNAPSHOTS, VIEWER = (os.path.abspath(a) for a in sys.argv[1:4])
TORCH_PYTHON = sys.argv[4] if len(sys.argv) > 4 else ""
HERE = os.path.dirname(os.path.abspath(__file__))
VIEWER_TEST = os.path.join(HERE, "memory_viz_viewer.py")
TORCH_READERS = os.path.join(HERE, "memory_viz_torch_readers.py")
CNN = os.path.join(SNAPSHOTS, "cnn-train-eor.pickle")
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("OOMFLIGHT_")},
       "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def fail(message):
    print(f"memory_viz_in_viewer: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def run(cmd, cwd, ok=True, timeout=300):
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=ENV, capture_output=True, text=True, errors="replace",
                       timeout=timeout)
    if ok and r.returncode != 0:
        fail(f"{' '.join(map(str, cmd))} exited {r.returncode}\n{(r.stdout + r.stderr)[-3000:]}")
    return r


def export(archive, out, cwd):
    """memory_viz export of `archive` into `out`; returns the pickles written."""
    run([CLI, "export", archive, "--format", "memory_viz", "-o", out], cwd)
    pickles = sorted(glob.glob(os.path.join(out, "*.pickle")))
    if not pickles:
        fail(f"export of {archive} wrote no pickle")
    return pickles


def one_archive(folder, pattern):
    found = glob.glob(os.path.join(folder, "**", pattern), recursive=True)
    if len(found) != 1:
        fail(f"expected one {pattern} under {folder}, found {found}")
    return found[0]


def main():
    need(os.path.join(VIEWER, "MemoryViz.js"), "PyTorch's viewer", "memory_viz")
    need(CNN, "PyTorch's own snapshots (the control)", "torch-snapshots")
    if not TORCH_PYTHON or not os.access(TORCH_PYTHON, os.X_OK):
        fail(f"no real-torch Python ({TORCH_PYTHON!r}): run scripts/bootstrap.sh (scripts/python_envs.sh makes it)")
    snapshots = sorted(glob.glob(os.path.join(SNAPSHOTS, "*.pickle")))
    if len(snapshots) < 3:
        fail(f"expected the shared PyTorch snapshots in {SNAPSHOTS}")
    work = tempfile.mkdtemp(prefix="oomflight-memory-viz-viewer-")
    groups = {"PyTorch's own snapshots (control)": snapshots + [OWN_SNAPSHOT]}

    imported = os.path.join(work, "imported.h5")
    run([CLI, "import", *snapshots, "-o", imported], work)
    groups["import of the shared snapshots"] = export(imported, os.path.join(work, "imported"), work)
    merged = os.path.join(work, "merged.h5")
    run([CLI, "merge", imported, "-o", merged], work)
    groups["the import after merge"] = export(merged, os.path.join(work, "merged"), work)

    demo = os.path.join(work, "demo")
    os.mkdir(demo)
    job = run(["mpirun", "--oversubscribe", "-np", "4", CLI, "run", "--run-name", "demo", "--", CLI, "replay",
               OWN_SNAPSHOT, "--device-memory", DEVICE_MEMORY, "--rank-device-memory", f"2={SMALL_DEVICE_MEMORY}",
               "--steps", "2", "--pace"], demo, ok=False)  # paced: every rank has events when rank 2 fails
    if job.returncode == 0:
        fail("the demo's job should have died of rank 2's out-of-memory error")
    groups["the replay's 4-rank OOM archive"] = export(one_archive(demo, "oom.*.h5"), os.path.join(work, "oom"), work)

    windows = os.path.join(work, "windows")
    os.mkdir(windows)
    run(["mpirun", "--oversubscribe", "-np", "4", "-x", "OOMFLIGHT_SKIP_BATCHES=1", "-x", "OOMFLIGHT_INTERVAL=1ba",
         CLI, "run", "--run-name", "w", "--", CLI, "replay", CNN, "--device-memory", "64GiB", "--steps", "3", "--pace"],
        windows)
    groups["a scheduled snapshot archive"] = export(one_archive(windows, "snapshot.*.h5"),
                                                    os.path.join(work, "snapshot"), work)

    pickles = [p for group in groups.values() for p in group]
    for name, group in groups.items():
        print(f"memory_viz_in_viewer: {name}: {len(group)} pickles")
    r = subprocess.run([sys.executable, VIEWER_TEST, VIEWER, *pickles], capture_output=True, text=True,
                       errors="replace", timeout=900)
    print(r.stdout, end="")
    print(r.stderr, end="", file=sys.stderr)
    if r.returncode != 0:
        fail(f"the viewer test failed (exit {r.returncode}) on {len(pickles)} pickles")
    if f"memory_viz_viewer: {len(pickles)} pickles, all views drawn, no page error" not in r.stdout:
        fail("the viewer test did not report every pickle drawn")
    r = subprocess.run([TORCH_PYTHON, TORCH_READERS, *pickles], capture_output=True, text=True, errors="replace",
                       timeout=600)
    print(r.stdout, end="")
    print(r.stderr, end="", file=sys.stderr)
    if r.returncode != 0:
        fail(f"PyTorch's torch.cuda._memory_viz refused some of the {len(pickles)} pickles (exit {r.returncode})")
    print(f"memory_viz_in_viewer: {len(pickles)} pickles shown in MemoryViz.js, every view drawn, no page error, and "
          "read by torch.cuda._memory_viz")


if __name__ == "__main__":
    main()
