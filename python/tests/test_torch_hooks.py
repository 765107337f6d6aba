"""The built extension in a real torch process, no GPU: torch's own TraceEntry objects (every action, two devices,
streams) through the exact trace callback the extension hands to the allocator; the OOM observer's body with real
DeviceStats and SnapshotInfo objects, whose blocks carry real Python contexts gathered by torch's CapturedTraceback;
and install() against the real allocator with no device. Archives are read with h5py."""
import json
import pickle
import textwrap
import unittest

import h5py

from support import CLI, PY, TORCH_SITE, child_env, frames_of, read_archive, run, scratch

MiB = 1 << 20
GiB = 1 << 30
ACTIONS = {"alloc": 0, "free_requested": 1, "free_completed": 2, "segment_alloc": 3, "segment_free": 4,
           "segment_map": 5, "segment_unmap": 6, "oom": 7, "snapshot": 8, "step": 9}

# (action, device, addr, size, stream, with a Python context)
ENTRIES = [
    ("segment_alloc", 0, 0x7F0000000000, 20 * MiB, 0x51, True),
    ("alloc", 0, 0x7F0000000000, 8 * MiB, 0x51, True),
    ("alloc", 1, 0x7E0000000000, 4 * MiB, 0x52, False),
    ("segment_map", 1, 0x7D0000000000, 2 * MiB, 0x52, False),
    ("free_requested", 0, 0x7F0000000000, 8 * MiB, 0x51, True),
    ("free_completed", 0, 0x7F0000000000, 8 * MiB, 0x51, False),
    ("snapshot", 0, 0, 0, 0, False),
    ("segment_unmap", 1, 0x7D0000000000, 2 * MiB, 0x52, False),
    ("segment_free", 1, 0x7C0000000000, 2 * MiB, 0x52, False),
    ("oom", 0, 3 * MiB, 64 * MiB, 0x51, True),  # addr = the device's free bytes, size = the request
]

JOB = textwrap.dedent("""
    import json, sys, torch, oomflight, oomflight._extension as ext, oomflight.torch as ot
    oomflight.init(run_name="hooks", folder="out")
    m = ext.load(torch)
    assert m.attach(ot._function_addresses(), [(0, 0, 0, 80 << 30), (1, 0, 0, 80 << 30)], False, 0) == ""
    entries = [tuple(e) for e in json.loads(sys.argv[1])]
    why = m._feed(entries)  # FEED
    assert why == "", why
    MiB = 1 << 20
    blocks = [(2 * MiB, 2 * MiB - 100, "active_allocated", True), (6 * MiB, 6 * MiB, "inactive", False),
              (4 * MiB, 3 * MiB, "active_pending_free", False), (8 * MiB, 8 * MiB, "active_allocated", False)]
    other = [(2 * MiB, 2 * MiB, "active_allocated", False)]
    # (device, address, stream, expandable, is_large, pool, with a context, blocks): the third an expandable
    # segment of the small pool in a CUDA graph's pool, which no sizing rule could tell
    segments = [(0, 0x7F0000000000, 0x51, False, True, (0, 0), True, blocks),
                (1, 0x7E0000000000, 0x52, True, True, (0, 0), False, other),
                (0, 0x7B0000000000, 0x53, True, False, (4, 9), False, [(2 * MiB, 512, "active_allocated", False)])]
    stats = [10 * MiB + 512, 22 * MiB, 30 * MiB, 40 * MiB]
    why = m._observe(0, 64 * MiB, 80 << 30, 3 * MiB, stats, segments, True)  # OBSERVE
    assert why == "", why
    print(json.dumps({"path": oomflight._capi.library().oomflight_last_dump_path().decode(),
                      "counters": m.counters()}))
""")


STACKS_JOB = textwrap.dedent("""
    import json, time, torch, oomflight, oomflight._extension as ext, oomflight.torch as ot
    oomflight.init(run_name="stacks", folder="out", dump_timeout="2s")
    m = ext.load(torch)
    assert m.attach(ot._function_addresses(), [(0, 0, 0, 80 << 30)], False, 0) == ""

    def allocate_here():
        assert m._feed([("alloc", 0, 0x1000, 4096, 0, True), ("alloc", 0, 0x2000, 4096, 0, True)]) == ""  # FIRST

    allocate_here()  # CALL
    # torch's first symbolisation imports much of torch (seconds): the extension does it on its helper once the
    # first context is kept; a dump right after start-up would wait for it (and give up at its deadline).
    deadline = time.monotonic() + 120
    while not m.counters()["symbolizer_warm"] and time.monotonic() < deadline:
        time.sleep(0.05)
    first = oomflight.request_dump("signal").path
    assert m._feed([("alloc", 0, 0x3000, 4096, 0, True)]) == ""  # SECOND
    seconds, code = m._dump_from_thread_holding_gil()
    second = oomflight._capi.library().oomflight_last_dump_path().decode()
    third = oomflight.request_dump("signal").path
    print(json.dumps({"first": first, "second": second, "second_code": code, "second_seconds": seconds,
                      "third": third, "counters": m.counters()}))
""")


class TorchObjectsThroughTheCallbacks(unittest.TestCase):
    def setUp(self):
        self.assertTrue(TORCH_SITE, "TEST_TORCH_SITE: the package installed with its extension")

    def test_trace_entries_and_the_observer_with_torch_state_give_an_exact_archive(self):
        cwd = scratch()
        (cwd / "job.py").write_text(JOB)
        out = run([PY, "job.py", json.dumps(ENTRIES)], cwd, child_env())
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        result = json.loads(out.stdout.splitlines()[-1])
        self.assertEqual(result["counters"]["forwarded"], len(ENTRIES))
        self.assertEqual(result["counters"]["observer_dumps"], 1)
        self.assertEqual(result["counters"]["attached"], 0)  # fed, not attached: no device here
        a = read_archive(result["path"])
        ev = a["events"]
        # Every action mapped by name (torch numbers SNAPSHOT 7 and OOM 8; the archive the other way round), in
        # order, with its device, address, size and stream; the observer records no second oom.
        self.assertEqual([int(x) for x in ev["action"]], [ACTIONS[e[0]] for e in ENTRIES])
        self.assertEqual([int(x) for x in ev["device"]], [e[1] for e in ENTRIES])
        self.assertEqual([int(x) for x in ev["addr"]], [e[2] for e in ENTRIES])
        self.assertEqual([int(x) for x in ev["size"]], [e[3] for e in ENTRIES])
        self.assertEqual([int(x) for x in ev["stream"]], [e[4] for e in ENTRIES])
        row = a["ranks"][0]
        self.assertEqual(int(row["is_origin"]), 1)
        self.assertEqual(int(row["device"]), 0)
        self.assertEqual(int(row["oom_requested_bytes"]), 64 * MiB)
        self.assertEqual(int(row["device_free_bytes"]), 3 * MiB)
        self.assertEqual(int(row["device_capacity_bytes"]), 80 * GiB)
        # torch's exact figures (DeviceStats), not the trace's sums.
        self.assertEqual(int(row["allocated_bytes"]), 10 * MiB + 512)
        self.assertEqual(int(row["reserved_bytes"]), 22 * MiB)
        self.assertEqual(int(row["peak_allocated_bytes"]), 30 * MiB)
        self.assertEqual(int(row["peak_reserved_bytes"]), 40 * MiB)
        self.assertEqual(a["attrs"]["reason"], "rank 0: CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total "
                                                       "capacity of 80.00 GiB of which 3.00 MiB is free.")
        with h5py.File(result["path"], "r") as f:
            segments = f["state_segments"][()]
            blocks = f["state_blocks"][()]
            # The failing device's segments only (device 1's is not this OOM's), as torch's SnapshotInfo has them.
            self.assertEqual([(int(s["device"]), int(s["address"]), int(s["total_size"]), int(s["stream"]),
                               int(s["is_expandable"])) for s in segments],
                             [(0, 0x7F0000000000, 20 * MiB, 0x51, 0), (0, 0x7B0000000000, 2 * MiB, 0x53, 1)])
            # The segments' details (0.2.1): torch's pool kind, pool id and the frames where the first was allocated.
            self.assertEqual([(int(s["segment_type"]), [int(x) for x in s["segment_pool_id"]]) for s in segments],
                             [(0, [0, 0]), (1, [4, 9])])
            line = next(i for i, text in enumerate(JOB.splitlines(), 1) if "# OBSERVE" in text)
            self.assertEqual(frames_of(f, int(segments[0]["stack_id"]))[0], ("<module>", str(cwd / "job.py"), line))
            self.assertEqual(int(segments[1]["stack_id"]), -1)
            base = 0x7F0000000000
            self.assertEqual([(int(b["address"]), int(b["size"]), int(b["requested_size"]), int(b["state"]))
                              for b in blocks],
                             [(base, 2 * MiB, 2 * MiB - 100, 0), (base + 2 * MiB, 6 * MiB, 6 * MiB, 2),
                              (base + 8 * MiB, 4 * MiB, 3 * MiB, 1), (base + 12 * MiB, 8 * MiB, 8 * MiB, 0),
                              (0x7B0000000000, 2 * MiB, 512, 0)])
            # The first block's context, gathered by torch's CapturedTraceback, symbolised and interned: its
            # innermost frame is the line of the job that made it.
            line = next(i for i, text in enumerate(JOB.splitlines(), 1) if "# OBSERVE" in text)
            frames = frames_of(f, int(blocks[0]["stack_id"]))
            self.assertEqual(frames[0], ("<module>", str(cwd / "job.py"), line))
            self.assertEqual([int(b["stack_id"]) for b in blocks[1:]], [-1] * 4)
            # The live events' stacks (the observer's freeze holds the GIL: symbolised on its own thread): every
            # entry carries the line that fed it, from torch's context where it has one, else from oomflight's own
            # capture (issue 32), but free_completed, which a later allocation's thread records.
            feed = next(i for i, text in enumerate(JOB.splitlines(), 1) if "# FEED" in text)
            for entry, stack_id in zip(ENTRIES, f["events"]["stack_id"]):
                frames = frames_of(f, int(stack_id))
                expected = [] if entry[0] == "free_completed" else [("<module>", str(cwd / "job.py"), feed)]
                self.assertEqual(frames[:1], expected, entry)
        self.assertEqual(result["counters"]["contexts_kept"], sum(1 for e in ENTRIES if e[5]))
        self.assertEqual(result["counters"]["contexts_refused"], 0)

    def test_live_stacks_are_symbolised_off_the_freezing_thread_and_never_wait_for_a_held_gil(self):
        cwd = scratch()
        (cwd / "job.py").write_text(STACKS_JOB)
        out = run([PY, "job.py"], cwd, child_env())
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        result = json.loads(out.stdout.splitlines()[-1])
        lines = {mark: next(i for i, text in enumerate(STACKS_JOB.splitlines(), 1) if f"# {mark}" in text)
                 for mark in ("FIRST", "SECOND", "CALL")}
        job = str(cwd / "job.py")

        def stacks(path):
            with h5py.File(path, "r") as f:
                return [frames_of(f, int(s)) for s in f["events"]["stack_id"]]

        # 1. Asked for through ctypes (the GIL released): the helper thread symbolised both events, whole stacks.
        first = stacks(result["first"])
        self.assertEqual(len(first), 2)
        self.assertEqual(first[0][:2], [("allocate_here", job, lines["FIRST"]), ("<module>", job, lines["CALL"])])
        self.assertEqual(first[1], first[0])
        # 2. The freezing thread is not the one holding the GIL, which is never released during that dump: the
        # dump went on without the new event's stack after the resolver's deadline (a quarter of the 2 s
        # OOMFLIGHT_DUMP_TIMEOUT), said so, and kept the others' stacks (remembered from the first dump).
        second = stacks(result["second"])
        self.assertEqual(result["second_code"], 0)
        self.assertEqual(second[:2], first)
        self.assertEqual(second[2], [])
        self.assertIn("the Python stacks of 1 events were not symbolised within 500 ms: the helper thread was still "
                      "waiting to take the GIL (another thread held it)", out.stderr)
        self.assertIn("1 events' call sites were not symbolised (they are recorded with no stack)", out.stderr)
        # 3. Once the GIL is free the work finishes: the next dump has that event's stack too.
        third = stacks(result["third"])
        self.assertEqual(third[2][:1], [("<module>", job, lines["SECOND"])])
        # The exports carry them as for an imported snapshot: memory_viz trace entries with PyTorch's frame dicts,
        # folded stacks of the live bytes (3 x 4096, all from the two call sites).
        self.assertTrue(CLI, "TEST_CLI: the oomflight CLI")
        out = run([CLI, "export", result["third"], "--format", "memory_viz", "-o", str(cwd / "viz")], cwd, child_env())
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        (pickle_path,) = (cwd / "viz").iterdir()
        with open(pickle_path, "rb") as f:
            snapshot = pickle.load(f)
        trace = [e for e in snapshot["device_traces"][0] if e["action"] == "alloc"]
        self.assertEqual([e["addr"] for e in trace], [0x1000, 0x2000, 0x3000])
        self.assertEqual({k: trace[0]["frames"][0][k] for k in ("name", "filename", "line")},
                         {"name": "allocate_here", "filename": job, "line": lines["FIRST"]})
        self.assertEqual(trace[2]["frames"][0]["line"], lines["SECOND"])
        folded = cwd / "third.folded"
        out = run([CLI, "export", result["third"], "--format", "folded", "-o", str(folded)], cwd, child_env())
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        rows = dict(line.rsplit(" ", 1) for line in folded.read_text().splitlines())
        self.assertEqual(sum(int(v) for v in rows.values()), 3 * 4096)
        by_bytes = sorted((int(v), k) for k, v in rows.items())
        self.assertEqual([v for v, _ in by_bytes], [4096, 8192], rows)
        self.assertIn("allocate_here", by_bytes[1][1].split(";")[-1], rows)  # innermost frame last
        self.assertNotIn("allocate_here", by_bytes[0][1], rows)
        self.assertEqual(result["counters"]["contexts_kept"], 3)
        self.assertEqual(result["counters"]["symbolizer_warm"], 1)

    def test_install_with_no_device_warns_once_and_still_records_batches_at_optimizer_steps(self):
        cwd = scratch()
        out = run([PY, "-c", textwrap.dedent("""
            import json, torch, oomflight, oomflight.torch as ot
            assert ot.install(run_name="cpu", folder="out") is False
            assert ot.install() is False            # idempotent: no second warning
            oomflight.init()                          # the job's own init after install(): nothing to do
            try:
                oomflight.init(max_entries=10)
            except oomflight.StateError as e:
                print("init:", e)
            model = torch.nn.Linear(8, 8)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
            r = oomflight.request_dump("signal")
            print(json.dumps({"path": r.path, "status": ot.status()}))
            """)], cwd, child_env())
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        warnings = [line for line in out.stderr.splitlines() if "warn" in line]
        self.assertEqual(len(warnings), 1, out.stderr)
        self.assertIn("not recording CUDA allocator events: torch 2.11.0+", warnings[0])
        self.assertIn("sees no CUDA device (torch.cuda.is_available() is False): the caching allocator's hooks are "
                      "not attached; batches, metadata and on-demand dumps are still recorded", warnings[0])
        self.assertIn("init: oomflight was already started by oomflight.torch.install(): give settings there",
                      out.stdout)
        result = json.loads(out.stdout.splitlines()[-1])
        self.assertFalse(result["status"]["attached"])
        self.assertEqual(result["status"]["batch"], 3)
        a = read_archive(result["path"])
        self.assertEqual(a["attrs"]["run_name"], "cpu")
        steps = [int(b) for act, b in zip(a["events"]["action"], a["events"]["batch"]) if act == ACTIONS["step"]]
        self.assertEqual(steps, [0, 1, 2, 3])  # batch 0 from install, one more after each optimizer step
        with h5py.File(result["path"], "r") as f:
            self.assertEqual([int(b) for b in f["batches"]["batch"]], [0, 1, 2, 3])


OWN_STACKS_JOB = textwrap.dedent("""
    import json, time, torch, oomflight, oomflight._extension as ext, oomflight.torch as ot
    if not oomflight.initialized():  # under `oomflight run`, `import torch` has started it
        oomflight.init(run_name="own", folder="out")
    m = ext.load(torch)
    assert m.attach(ot._function_addresses(), [(0, 0, 0, 80 << 30)], False, 0, ot.stacks_setting()) == ""

    def step(layer):
        # torch's context (gathered here by CapturedTraceback) and oomflight's own capture, from one line
        assert m._feed([("alloc", 0, 0x1000 * layer, 4096, 0, True),  # FEED (a call's line is its first)
                        ("alloc", 0, 0x100000 + layer, 512, 0, False),
                        ("free_completed", 0, 0x100000 + layer, 512, 0, False)]) == ""

    def model():
        for layer in range(1, 4):
            step(layer)  # STEP

    model()  # MODEL
    oomflight.record("segment_alloc", 0, 0x200000, 2 << 20)  # RECORD
    assert m._feed_from_native_thread("pt_autograd_0", 0x300000, 1024) == ""
    # torch's first symbolize imports for seconds (on the extension's helper, once a context is kept): a dump
    # before it is done would give torch's contexts up at the resolver's deadline on a busy machine.
    deadline = time.monotonic() + 120
    while not m.counters()["symbolizer_warm"] and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({"path": oomflight.request_dump("signal").path, "counters": m.counters(),
                      "frames": m.build_info()["python_frames"]}))
""")


class OwnPythonStacks(unittest.TestCase):
    """Issue 32: with no setting, events that reach the extension without torch's context carry the allocating
    thread's Python frames, captured by oomflight itself, and they are the frames torch's own context names."""

    def setUp(self):
        self.assertTrue(TORCH_SITE, "TEST_TORCH_SITE: the package installed with its extension")

    def job(self, **env):
        cwd = scratch()
        (cwd / "job.py").write_text(OWN_STACKS_JOB)
        out = run([PY, "job.py"], cwd, child_env(**env))
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return cwd, json.loads(out.stdout.splitlines()[-1])

    def line(self, marker: str) -> int:
        return next(i for i, text in enumerate(OWN_STACKS_JOB.splitlines(), 1) if marker in text)

    def test_every_event_carries_the_frames_torch_names_for_it(self):
        cwd, result = self.job()
        self.assertEqual(result["frames"], "in place")  # Debian's Python 3.11: the interpreter's own frames
        job = str(cwd / "job.py")
        with h5py.File(result["path"], "r") as f:
            ev = f["events"][()]
            stacks = [frames_of(f, int(e["stack_id"])) for e in ev]
        actions = [int(a) for a in ev["action"]]
        # 3 layers x (torch's context, oomflight's capture, free_completed), the record() call, the native thread
        self.assertEqual(actions, [0, 0, 2] * 3 + [ACTIONS["segment_alloc"], 0])
        for layer in range(3):
            theirs, ours, completed = stacks[3 * layer: 3 * layer + 3]
            self.assertEqual(ours, theirs, f"layer {layer + 1}: oomflight's frames against torch's")
            self.assertEqual(ours, [("step", job, self.line("# FEED")), ("model", job, self.line("# STEP")),
                                    ("<module>", job, self.line("# MODEL"))])
            self.assertEqual(completed, [], "free_completed carries no stack: its thread is a later allocation's")
        self.assertEqual(stacks[9][0], ("<module>", job, self.line("# RECORD")))
        self.assertEqual(stacks[10], [("thread 'pt_autograd_0' (no Python frame)", "", 0)])
        # One stack per distinct call site: the three layers share theirs.
        self.assertEqual(len({int(e["stack_id"]) for e in ev[1:9:3]}), 1)
        self.assertEqual(result["counters"]["python_stacks_dropped"], 0)

    def test_stacks_off_records_none_of_them(self):
        _, result = self.job(OOMFLIGHT_STACKS="off")
        with h5py.File(result["path"], "r") as f:
            ids = [int(e["stack_id"]) for e in f["events"][()]]
        self.assertEqual(ids, [-1] * 11)
        self.assertEqual(result["counters"]["python_stacks"], 0)
        report = run([CLI, "report", result["path"]], scratch(), child_env())
        self.assertIn("metadata: oomflight.call_sites=off (no call sites recorded)", report.stdout)

    def test_the_report_names_the_jobs_lines_under_oomflight_run(self):
        cwd = scratch()
        (cwd / "job.py").write_text(OWN_STACKS_JOB)
        env = child_env()
        out = run([CLI, "run", "--run-name", "own", "--", PY, "job.py"], cwd, env)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        path = json.loads(out.stdout.splitlines()[-1])["path"]
        report = run([CLI, "report", path], cwd, env)
        self.assertEqual(report.returncode, 0, report.stderr)
        self.assertIn(f"step ({cwd / 'job.py'}:{self.line('# FEED')})", report.stdout)
        # The report says whose call sites they are.
        self.assertIn("metadata: oomflight.call_sites=python (oomflight's own capture of the allocating thread's "
                      "stack, frames read in place; torch's contexts where the job records memory history)",
                      report.stdout)


EXIT_EARLY_JOB = textwrap.dedent("""
    import sys, time, torch, oomflight, oomflight._extension as ext, oomflight.torch as ot
    oomflight.init(run_name="early", folder="out")
    m = ext.load(torch)
    assert m.attach(ot._function_addresses(), [(0, 0, 0, 80 << 30)], False, 0, sys.argv[1]) == ""
    assert m._feed([("alloc", 0, 0x1000, 4096, 0, True)]) == ""
    time.sleep(float(sys.argv[2]))
    print("leaving")
""")


class ExitWhileSymbolising(unittest.TestCase):
    def test_a_job_that_ends_while_the_helper_runs_python_exits_with_its_own_status(self):
        # A job that ends within a second of its first kept context: the extension's helper is still inside
        # torch's first symbolize (importing) when Python finalises, and the interpreter ends it. Before the
        # helper took the GIL with its own guard, pybind11's threw from its destructor there: the job's exit
        # ended in SIGABRT or SIGSEGV, every run.
        cwd = scratch()
        (cwd / "job.py").write_text(EXIT_EARLY_JOB)
        for stacks in ("torch", "python"):
            for delay in ("0.0", "0.05", "0.3"):
                out = run([PY, "job.py", stacks, delay], cwd, child_env())
                self.assertEqual(out.returncode, 0, f"stacks {stacks}, exit after {delay} s:\n{out.stderr[-3000:]}")
                self.assertEqual(out.stdout.strip(), "leaving")


if __name__ == "__main__":
    unittest.main()
