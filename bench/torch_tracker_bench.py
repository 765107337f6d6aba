"""The PyTorch tracker per allocator event, with and without a Python context, side by side with what torch itself
pays per allocation when it records memory history, and the freeze's symbolisation of 100,000 contexts against
torch's own symbolize of the same contexts: all in one process, on the CPU (no device needed).

    PYTHONPATH=build/torch-site OOMFLIGHT_LIBRARY=build/core/liboomflight.so \\
        <torch venv>/bin/python bench/torch_tracker_bench.py [EVENTS] [DEPTH] [RUNS]

EVENTS contexts per run (default 100000, the default OOMFLIGHT_MAX_ENTRIES), gathered DEPTH Python frames deep
(default 20, a training step's usual depth); RUNS runs (default 3), each row's median and range printed. Then
oomflight's own capture of the stack (the default call sites since issue 32) against torch's gather of the same
frames and a clock read, at 5, 20 and 60 frames. Figures: docs/performance.md."""
import statistics
import sys

import torch

import oomflight
import oomflight._extension as ext
import oomflight.torch as ot

EVENTS = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
DEPTH = int(sys.argv[2]) if len(sys.argv) > 2 else 20
RUNS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
CAPTURE_EVENTS = 20000

ROWS = [
    ("torch_gather_context_ns", "torch: gather the Python context (CapturedTraceback::gather), per allocation", "ns"),
    ("torch_trace_entry_ns", "torch: build a TraceEntry and store it in its trace ring under a mutex", "ns"),
    ("oomflight_tracker_ns", "oomflight: the trace callback, entry without torch's context (its own capture of the "
     "stack, the default)", "ns"),
    ("oomflight_tracker_with_context_ns", "oomflight: the trace callback, entry with a context (kept, deferred id)",
     "ns"),
    ("resolve_ms", "oomflight: resolve the deferred ids at the freeze (symbolise, intern)", "ms"),
    ("torch_symbolize_ms", "torch: symbolize the same contexts (what _snapshot pays for frames)", "ms"),
]


def at_depth(depth, fn):
    return fn() if depth <= 1 else at_depth(depth - 1, fn)


def main() -> int:
    oomflight.init(run_name="bench", folder="/tmp/oomflight-torch-bench", max_entries=EVENTS)
    m = ext.load(torch)
    why = m.attach(ot._function_addresses(), [(0, 0, 0, 80 << 30)], False, 0, "python")
    if why:
        print(f"cannot attach: {why}", file=sys.stderr)
        return 1
    runs = [at_depth(DEPTH, lambda: m._bench(EVENTS)) for _ in range(RUNS)]
    if not runs[0]:
        print("this liboomflight has no stack resolver (oomflight_set_stack_resolver)", file=sys.stderr)
        return 1
    print(f"torch {torch.__version__}, {EVENTS} events per run, contexts {DEPTH} Python frames deep, {RUNS} runs")
    for key, text, unit in ROWS:
        values = [r[key] for r in runs]
        print(f"| {text} | {statistics.median(values):.1f} {unit} ({min(values):.1f} - {max(values):.1f}) |")
    refused = sum(r["contexts_refused"] for r in runs)
    resolved = min(r["resolved"] for r in runs)
    print(f"contexts refused: {refused:.0f}; ids resolved per run: {resolved:.0f} of {EVENTS}")
    # oomflight's own capture of the stack (issue 32) against torch's gather of the same frames and a clock read,
    # at three depths, in this run: each depth's runs alternate the three (the extension's _bench_capture).
    print(f"\nthe allocating thread's Python stack, per event, {CAPTURE_EVENTS} events per run, {RUNS} runs "
          f"(frames read: {m.build_info()['python_frames']})")
    print("| frames | clock read | oomflight's capture | torch's gather (CapturedTraceback) | ours / torch's |")
    print("|---|---|---|---|---|")
    for depth in (5, 20, 60):
        # at_depth's frames and four more (the lambda, the list comprehension, main, the module): `depth` in all
        captures = [at_depth(depth - 4, lambda: m._bench_capture(CAPTURE_EVENTS)) for _ in range(RUNS)]
        frames = int(captures[0]["frames"])
        cells = []
        for key in ("clock_read_ns", "oomflight_capture_ns", "torch_gather_ns"):
            values = [c[key] for c in captures]
            cells.append(f"{statistics.median(values):.0f} ns ({min(values):.0f} - {max(values):.0f})")
        ratio = statistics.median(c["oomflight_capture_ns"] / c["torch_gather_ns"] for c in captures)
        print(f"| {frames} | {' | '.join(cells)} | {ratio:.2f} |")
    oomflight.shutdown()
    return 0 if refused == 0 and resolved == EVENTS else 1


if __name__ == "__main__":
    sys.exit(main())
