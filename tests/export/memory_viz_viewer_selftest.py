#!/usr/bin/python3
"""Proves that memory_viz_viewer.py (PyTorch's MemoryViz.js in headless Chromium) can fail, and fails for the
right reason.

- control: the project's own snapshot, the real PyTorch snapshots of SNAPSHOT_DIR (when there), and the own
  snapshot's state with its trace emptied (a rank frozen before its first traced event exports that) pass it (exit
  0, a count line for each pickle and view);
- planted bad exports, made from the smallest real snapshot into a temporary folder, all given to one run of the
  test together with an unmodified copy of that snapshot: the run must exit 1, print a FAILED line naming each
  planted pickle for the reason planted, and none naming the unmodified copy:
  (a) truncated.pickle: the pickle's bytes cut in half; MemoryViz.js's unpickler throws while loading;
  (b) free-outside-segments.pickle: a valid pickle whose trace ends with a free_completed of a block at an address
      outside every segment, with no alloc before it. The timelines take it as a block that predates the trace
      and draw it; Allocator State History throws when an earlier entry is selected: replaying the trace backwards
      puts the block back, and MemoryView.draw finds no segment for it (`b.segment` is null);
  (c) empty.pickle: a valid snapshot with no segment and an empty trace for device 0. MemoryViz.js throws nothing
      there but draws nothing: no allocation polygon in the timelines (only the empty "summarized" one), no entry
      and no rect in Allocator State History. The test must call that a failure.

The control is the project's own snapshot (examples/pytorch/snapshots), and PyTorch's shared ones when they are
beside the checkout. Without PyTorch's viewer it exits 77, which ctest reports as skipped, naming what is missing.

Usage: memory_viz_viewer_selftest.py VIEWER_DIR SNAPSHOT_DIR
"""
import glob
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from fixtures import OWN_SNAPSHOT, need  # noqa: E402  (tests/support)

VIEWER_TEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "memory_viz_viewer.py")
VIEWS = ["Active Memory Timeline", "Active Cached Segment Timeline", "Allocator State History"]


def run_viewer_test(viewer, *paths):
    r = subprocess.run([sys.executable, VIEWER_TEST, viewer, *paths], capture_output=True, text=True,
                       errors="replace", timeout=600)
    return r.returncode, r.stdout + r.stderr


def plant(base_path, work):
    """Writes the planted pickles; returns {path: (regexes that its FAILED lines, after the path, must each match
    one of, a regex none of them may match or None)}."""
    with open(base_path, "rb") as f:
        raw = f.read()
    snap = pickle.loads(raw)
    planted = {}

    path = os.path.join(work, "truncated.pickle")
    with open(path, "wb") as f:
        f.write(raw[: len(raw) // 2])
    planted[path] = ([r"Active Memory Timeline: load: add_local_files threw Error: UNKNOWN OPCODE"], None)

    device = 0
    trace = snap["device_traces"][device]
    top = max([s["address"] + s["total_size"] for s in snap["segments"]] + [e.get("addr", 0) for e in trace])
    outside = top + (1 << 30)
    assert not any(s["address"] <= outside < s["address"] + s["total_size"] for s in snap["segments"])
    trace.append({"action": "free_completed", "addr": outside, "size": 512, "stream": 0,
                  "time_us": trace[-1].get("time_us", 0) + 1,
                  "frames": [{"name": "planted", "filename": "memory_viz_viewer_selftest.py", "line": 1}]})
    path = os.path.join(work, "free-outside-segments.pickle")
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    planted[path] = ([r"Allocator State History: select entry 0: Uncaught TypeError: .*null.*MemoryViz\.js"],
                     r"Timeline")  # the timelines draw it as a block that predates the trace

    path = os.path.join(work, "empty.pickle")
    with open(path, "wb") as f:
        pickle.dump({"segments": [], "device_traces": [[]]}, f, protocol=4)
    planted[path] = ([r"Active Memory Timeline: draws no allocation polygon",
                      r"Active Cached Segment Timeline: draws no allocation polygon",
                      r"Allocator State History: lists no trace entry",
                      r"Allocator State History: draws no rect"],
                     r"Uncaught|threw")  # nothing throws: only the counts can fail it
    return planted


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        sys.exit(2)
    viewer, snapshots = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    need(os.path.join(viewer, "MemoryViz.js"), "PyTorch's viewer", "memory_viz")
    real = [OWN_SNAPSHOT] + sorted(glob.glob(os.path.join(snapshots, "*.pickle")))
    problems = []
    # Also in the control: the own snapshot's state with no trace entry, as the export of a rank frozen before its
    # first traced event is (a true history the viewer shows with nothing to select; it must pass).
    control_dir = tempfile.mkdtemp(prefix="memory-viz-viewer-control-")
    with open(OWN_SNAPSHOT, "rb") as f:
        traceless = pickle.load(f)
    traceless["device_traces"] = [[] for _ in traceless["device_traces"]]
    real.append(os.path.join(control_dir, "trace-less.pickle"))
    with open(real[-1], "wb") as f:
        pickle.dump(traceless, f, protocol=4)

    rc, out = run_viewer_test(viewer, *real)
    shutil.rmtree(control_dir, ignore_errors=True)
    print(out, end="")
    if rc != 0 or "all views drawn, no page error" not in out:
        problems.append(f"control: the real snapshots do not pass (exit {rc})")
    for path in real:
        for view in VIEWS:
            counted = "[1-9]"
            if path == real[-1] and view == "Allocator State History":
                counted = r"0 entries \(the pickle holds no trace entry\); its state drawn: [1-9]"
            if not re.search(rf"^{re.escape(os.path.basename(path))}: {view}: {counted}", out, re.M):
                problems.append(f"control: no count line for {os.path.basename(path)}: {view}")

    work = tempfile.mkdtemp(prefix="memory-viz-viewer-selftest-")
    try:
        base = min(real[:-1], key=os.path.getsize)  # a real snapshot (the trace-less control is gone)
        planted = plant(base, work)
        unmodified = os.path.join(work, "unmodified.pickle")
        shutil.copyfile(base, unmodified)
        rc, out = run_viewer_test(viewer, unmodified, *planted)
        print(out, end="")
        if rc != 1:
            problems.append(f"planted: the viewer test exited {rc}, expected 1")
        failed = [line for line in out.splitlines() if line.startswith("memory_viz_viewer: FAILED: ")]
        if any(line.startswith(f"memory_viz_viewer: FAILED: {unmodified}:") for line in failed):
            problems.append(f"planted: the unmodified copy of {os.path.basename(base)} was failed too")
        for path, (reasons, forbidden) in planted.items():
            prefix = f"memory_viz_viewer: FAILED: {path}: "
            mine = [line[len(prefix):] for line in failed if line.startswith(prefix)]
            if not mine:
                problems.append(f"planted: {os.path.basename(path)} passed the viewer test")
                continue
            for reason in reasons:
                if not any(re.match(reason, line) for line in mine):
                    problems.append(f"planted: {os.path.basename(path)}: no FAILED line for the planted reason "
                                    f"/{reason}/; its lines: {mine[:3]}")
            for line in mine:
                if forbidden and re.search(forbidden, line):
                    problems.append(f"planted: {os.path.basename(path)}: unexpected FAILED line: {line[:200]}")
            print(f"memory_viz_viewer_selftest: {os.path.basename(path)} fails as planted: "
                  f"{' | '.join(line[:150] for line in mine if any(re.match(r, line) for r in reasons))}")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for problem in problems:
        print(f"memory_viz_viewer_selftest: FAILED: {problem}")
    if problems:
        sys.exit(1)
    print(f"memory_viz_viewer_selftest: control passes ({len(real)} real snapshots), "
          f"all {len(planted)} planted exports fail the viewer test")


if __name__ == "__main__":
    main()
