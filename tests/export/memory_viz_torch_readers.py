"""PyTorch's own readers of memory snapshots, torch/cuda/_memory_viz.py (the module behind `python -m
torch.cuda._memory_viz`), on memory_viz pickles: run by the real-torch environment's Python.

For each pickle:
- segsum: runs its two accounting asserts (blocks fill each segment) and reports the pickle's total reserved;
- memory and segments (with the flame-graph formatter replaced by the identity, so that no flamegraph.pl is
  downloaded): every block is accounted for, the byte counts sum to the reserved bytes;
- trace: "N entries" for every device with a trace;
- trace_plot and segment_plot: the page embeds the snapshot, which unpickles to the same dict;
- compare of the segments with themselves: nothing only before or only after.

Usage: memory_viz_torch_readers.py PICKLE [PICKLE ...]
"""
import base64
import contextlib
import io
import json
import pickle
import re
import sys

import torch.cuda._memory_viz as mv


def identity(lines):
    return lines


def check(path):
    with open(path, "rb") as f:
        data = pickle.load(f)
    reserved = sum(s["total_size"] for s in data["segments"])
    problems = []
    summary = mv.segsum(data)
    if f"total_reserved: {mv.Bytes(reserved)}" not in summary:
        problems.append(f"segsum does not report {reserved} bytes reserved")
    for name in ("memory", "segments"):
        lines = getattr(mv, name)(data, format_flamegraph=identity)
        total = sum(int(line.rsplit(" ", 1)[1]) for line in lines.splitlines() if line)
        if total != reserved:
            problems.append(f"{name}: its lines sum to {total} bytes, not the {reserved} reserved")
    text = mv.trace(data)
    for device, entries in enumerate(data["device_traces"]):
        if entries and f"Device {device} ----------------\n{len(entries)} entries" not in text:
            problems.append(f"trace: no '{len(entries)} entries' for device {device}")
    for name in ("trace_plot", "segment_plot"):
        page = getattr(mv, name)(data)
        payload = json.loads(re.search(r"const local_files = (.*)\n", page).group(1))[0]["base64"]
        if pickle.loads(base64.b64decode(payload)) != data:
            problems.append(f"{name}: the page's snapshot is not the pickle's")
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        diff = mv.compare(data["segments"], data["segments"], format_flamegraph=identity)
    if diff or "only_before = []" not in printed.getvalue():
        problems.append("compare of the segments with themselves found differences")
    return problems, reserved


def main():
    failed = 0
    for path in sys.argv[1:]:
        try:
            problems, reserved = check(path)
        except Exception as e:  # any exception of PyTorch's readers is a failure of the export
            problems, reserved = [f"{type(e).__name__}: {e}"], 0
        for p in problems:
            print(f"memory_viz_torch_readers: FAILED: {path}: {p}")
        failed += bool(problems)
        if not problems:
            print(f"{path}: segsum, memory, segments, trace, trace_plot, segment_plot, compare: ok ({reserved} bytes "
                  "reserved)")
    if failed:
        sys.exit(1)
    print(f"memory_viz_torch_readers: {len(sys.argv) - 1} pickles read by torch.cuda._memory_viz")


if __name__ == "__main__":
    main()
