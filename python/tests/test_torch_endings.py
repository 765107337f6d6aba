"""Every ending, round two (issue 39), each row of the issue's table a real job with the real torch (2.11, gloo, no
GPU), measured against the same job without oomflight where the issue names one:

- a dump asked for on another thread while the process exits at once (sys.exit(0) and sys.exit(3)), with oomflight's
  own stacks and torch's, and under `mpirun -np 2`: the process ends with its own status, every run (SIGABRT before:
  the helper's GIL guard was noexcept, and the interpreter ends a thread that takes the GIL at finalisation with
  pthread_exit's forced unwinding);
- init_process_group(init_method="file://F") twice with the same F: both runs end, and F is removed, as without
  oomflight (the extension kept the job's FileStore for good);
- destroy_process_group() then init_process_group() again, rank 0 hosting the store (Lightning's launcher, plain
  env://): no flood of torch's warnings from a dead store, and an OOM after the second init is one archive of both
  ranks;
- workers of a torchrun job that fail before init_process_group: each is the rank torchrun numbered, in its log line
  and its rank-local file (every one claimed rank 0 before);
- a sub-interpreter exists and a native thread allocates: no crash (PyGILState_Check answers yes on every thread
  then);
- function and file names with a lone surrogate and a NUL: stored escaped, never dropped or cut;
- frames deep in a 20,000-line function: every event keeps its stack, and a limit passed names its real cause;
- a build at first use: keyed by what it is compiled against, and never on the thread in init_process_group.

TEST_REPEAT (default 3) is how many times each exit-during-a-dump case runs; the issue's acceptance is 20.
"""
from __future__ import annotations

import os
import re
import socket
import statistics
import subprocess
import sys
import textwrap
import time
import types
import unittest
from pathlib import Path

import h5py

from support import CLI, MPIRUN_ENV, PY, PYTHON_ROOT, TORCH_SITE, child_env, frames_of, read_archive, run, scratch

REPEAT = int(os.environ.get("TEST_REPEAT", "3"))
TORCHRUN = str(Path(PY).parent / "torchrun")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(args: list[str], cwd: Path, env: dict, timeout: float = 240) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = run(args, cwd, env, timeout=timeout)
    return result, time.monotonic() - started


# A job that asks for a dump on another thread and exits at once. argv: stacks (python, torch, or plain: no
# oomflight at all, the baseline), exit status, events. Events are fed through the extension's trace callback from
# many call sites, so that the freeze has stacks to symbolise when the interpreter finalises.
EXIT_DURING_DUMP = textwrap.dedent("""
    import os, sys, threading
    stacks, status, events = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    import torch
    if stacks != "plain":
        import oomflight, oomflight._extension as ext, oomflight.torch as ot
        if not oomflight.initialized():
            oomflight.init(run_name="exiting", folder="out", stacks=stacks)
        m = ext.load(torch)
        assert m.attach(ot._function_addresses(), [(0, 0, 0, 80 << 30)], False, 0, stacks) == ""
        calls = [compile(f"def site{k}(m, i):\\n    return m._feed([('alloc', 0, 0x1000 + 4096 * i, 4096, 0, "
                         f"{stacks == 'torch'})])\\n", f"site{k}.py", "exec") for k in range(64)]
        sites = []
        for code in calls:
            scope = {}
            exec(code, scope)
            sites.extend(v for k, v in scope.items() if k.startswith("site"))
        for i in range(events):
            assert sites[i % len(sites)](m, i) == ""
        threading.Thread(target=lambda: oomflight.request_dump("signal", reason="asked on another thread"),
                         daemon=True).start()
    print("leaving", flush=True)
    sys.exit(status)
""")


@unittest.skipUnless(TORCH_SITE, "TEST_TORCH_SITE: the package installed with its extension")
class ExitDuringADump(unittest.TestCase):
    """Row 1: the process ends with its own status in every run, and no later than the same job without oomflight
    by more than a regression would cost (a dump that waited would take OOMFLIGHT_DUMP_TIMEOUT)."""

    def test_a_process_that_exits_while_a_dump_symbolises_ends_with_its_own_status(self):
        cwd = scratch()
        (cwd / "job.py").write_text(EXIT_DURING_DUMP)
        baseline = []
        for status in (0, 3):
            result, took = timed([PY, "job.py", "plain", str(status), "0"], cwd, child_env())
            self.assertEqual(result.returncode, status, result.stderr)
            baseline.append(took)
        timings = {}
        for stacks in ("python", "torch"):
            for status in (0, 3):
                for attempt in range(REPEAT):
                    result, took = timed([PY, "job.py", stacks, str(status), "2000"], cwd,
                                         child_env(OOMFLIGHT_DUMP_TIMEOUT="30s"))
                    log = result.stdout + result.stderr
                    self.assertEqual(result.returncode, status,
                                     f"stacks {stacks}, sys.exit({status}), run {attempt + 1}:\n{log[-3000:]}")
                    self.assertEqual(result.stdout.strip(), "leaving")
                    self.assertNotIn("terminate called", log)
                    self.assertNotIn("Fatal Python error", log)
                    timings.setdefault(stacks, []).append(took)
        base = statistics.median(baseline)
        print(f"exit during a dump: median {base:.2f} s without oomflight; "
              + ", ".join(f"stacks {k} {statistics.median(v):.2f} s (max {max(v):.2f})" for k, v in timings.items()),
              flush=True)
        for stacks, values in timings.items():
            # Not a timing threshold: a process that waited for its dump would take OOMFLIGHT_DUMP_TIMEOUT (30 s).
            self.assertLess(statistics.median(values), base + 10, f"stacks {stacks}: {values} against {base:.2f}")

    @unittest.skipUnless(CLI, "TEST_CLI names the built oomflight")
    def test_under_mpirun_each_rank_ends_with_its_own_status_and_the_peer_is_not_held(self):
        cwd = scratch()
        (cwd / "job.py").write_text(EXIT_DURING_DUMP)
        for status in (0, 3):
            for attempt in range(REPEAT):
                result, took = timed(["mpirun", "-np", "2", "--oversubscribe", "-x", "PYTHONPATH", "-x",
                                      "OOMFLIGHT_LIBRARY", CLI, "run", "--", PY, "job.py", "python", str(status),
                                      "2000"], cwd, child_env(OOMFLIGHT_DUMP_TIMEOUT="30s"))
                log = result.stdout + result.stderr
                self.assertEqual(result.returncode, status, f"sys.exit({status}), run {attempt + 1}:\n{log[-3000:]}")
                self.assertNotIn("terminate called", log)
                # mpirun forwards each rank's writes as they come: "leaving" and its newline may be two writes, so
                # the two ranks' lines can interleave ("leavingleaving\n\n"); the word is counted, not the lines.
                self.assertEqual(result.stdout.count("leaving"), 2, log[-3000:])
                # Not a timing threshold: a rank held by its peer's dump waits OOMFLIGHT_DUMP_TIMEOUT (30 s).
                self.assertLess(took, 25, log[-3000:])


FILE_STORE_JOB = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    rank, path, destroy = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "destroy"
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    dist.barrier()
    if destroy:
        dist.destroy_process_group()
    print("done", rank, flush=True)
""")


REINIT_JOB = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
    time.sleep(float(os.environ["TEST_IDLE"]))  # rank 0 hosted the store that is gone now
    # The new group's store on another port: torch alone, re-binding the same port, hung 1 run in 14 here under load
    # (without oomflight), which is not what this job is for.
    os.environ["MASTER_PORT"] = os.environ["TEST_PORT2"]
    dist.init_process_group("gloo")
    dist.barrier()
    if rank == int(os.environ.get("TEST_OOM_RANK", "-1")):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                     "79.10 GiB of which 1.50 GiB is free.")
    if os.environ.get("TEST_OOM_RANK"):
        out = os.environ["TEST_OUT"]
        for _ in range(1200):  # the other rank's dump: this one answers it meanwhile
            if any(".rank" not in n for n in os.listdir(out)) if os.path.isdir(out) else False:
                break
            time.sleep(0.05)
    else:
        dist.barrier()
    print("done", rank, flush=True)
""")


@unittest.skipUnless(CLI, "TEST_CLI names the built oomflight")
class TheJobsStoreIsTheJobs(unittest.TestCase):
    """Rows 2 and 3: oomflight holds no reference that outlives the job's process group, and joins the next one."""

    def two_ranks(self, script: str, args_of, cwd: Path, env: dict, oomflight: bool, timeout: float = 120):
        procs = []
        for rank in (0, 1):
            command = [PY, script, *args_of(rank)]
            if oomflight:
                command = [CLI, "run", "--", *command]
            procs.append(subprocess.Popen(command, cwd=cwd, env={**env, "RANK": str(rank)},
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                self.fail(f"{script} did not end within {timeout} s (oomflight: {oomflight})")
            outs.append((p.returncode, out, err))
        return outs

    def test_a_file_store_is_removed_at_the_jobs_end_and_the_same_file_serves_the_next_run(self):
        # With destroy_process_group at the end, torch drops its references there and then, and the last rank's
        # FileStore removes the file: with oomflight as without (before, the extension kept the job's FileStore for
        # good: the file stayed after every run, and the next run with it failed in init_process_group or hung).
        # Torch itself leaves the file now and then (2 runs of 40 here without oomflight, with or without a
        # gc.collect() after destroy_process_group): a run that leaves it is counted, the file removed so that the
        # next run starts as a user's would, and the test asserts what no interleaving of torch's own can give:
        # the file left after every run.
        cwd = scratch()
        (cwd / "job.py").write_text(FILE_STORE_JOB)
        seconds, left = {}, {}
        runs = 3
        for oomflight in (False, True):
            store = cwd / f"store-{oomflight}"
            for attempt in range(1, runs + 1):
                started = time.monotonic()
                outs = self.two_ranks("job.py", lambda r: [str(r), str(store), "destroy"], cwd, child_env(), oomflight)
                seconds.setdefault(oomflight, []).append(round(time.monotonic() - started, 2))
                for rank, (rc, out, err) in enumerate(outs):
                    self.assertEqual(rc, 0, f"oomflight {oomflight}, run {attempt}, rank {rank}:\n{err[-3000:]}")
                    self.assertIn(f"done {rank}", out)
                left.setdefault(oomflight, 0)
                if store.exists():
                    left[oomflight] += 1
                    store.unlink()
        print(f"file:// store, {runs} runs with the same file: {seconds[False]} s without oomflight (file left "
              f"{left[False]} times), {seconds[True]} s with (left {left[True]} times)", flush=True)
        self.assertLess(left[True], runs, "the store's file was left after every run with oomflight")

    def test_a_job_that_ends_without_destroy_process_group_lets_go_of_its_store_at_its_end(self):
        # Without destroy_process_group, torch's references go with Python's finalisation (its FileStore's file stays
        # in about 1 run of 40 here without oomflight: finalisation does not promise to destroy every object), and
        # oomflight's with its session's end, after it: each rank says it let go.
        cwd = scratch()
        (cwd / "job.py").write_text(FILE_STORE_JOB)
        store = cwd / "store"
        outs = self.two_ranks("job.py", lambda r: [str(r), str(store), "end"], cwd,
                              child_env(OOMFLIGHT_LOG_LEVEL="debug"), True)
        for rank, (rc, out, err) in enumerate(outs):
            self.assertEqual(rc, 0, err[-3000:])
            self.assertIn(f"joined the job's c10d store as rank {rank} of 2", err)
            self.assertIn("let go of the job's store: this rank's session ended", err)

    def reinit(self, oomflight: bool, **extra: str):
        cwd = scratch()
        (cwd / "job.py").write_text(REINIT_JOB)
        first, second = free_port(), free_port()
        while second == first:
            second = free_port()
        env = child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(first), TEST_PORT2=str(second),
                        WORLD_SIZE="2", TEST_IDLE="3",
                        TEST_OUT=str(cwd / "out"), OOMFLIGHT_FOLDER=str(cwd / "out"), **extra)
        return cwd, self.two_ranks("job.py", lambda r: [], cwd, env, oomflight)

    def test_destroy_then_init_again_leaves_the_dead_store_in_silence_and_joins_the_new_one(self):
        _, plain = self.reinit(False)
        _, watched = self.reinit(True)
        for rank in (0, 1):
            self.assertEqual(plain[rank][0], 0, plain[rank][2][-3000:])
            self.assertEqual(watched[rank][0], 0, watched[rank][2][-3000:])
        lines = [len(err.splitlines()) for _, _, err in plain], [len(err.splitlines()) for _, _, err in watched]
        print(f"destroy and init again, 3 s idle between: stderr lines without oomflight {lines[0]}, with "
              f"{lines[1]}", flush=True)
        # A poll of the dead store logged torch's warning and its C++ stack each time: thousands of lines.
        for rank in (0, 1):
            self.assertLessEqual(lines[1][rank], lines[0][rank] + 6, watched[rank][2][-4000:])

    def test_an_oom_after_init_again_is_one_archive_of_both_ranks(self):
        cwd, watched = self.reinit(True, TEST_OOM_RANK="1")
        self.assertEqual(watched[0][0], 0, watched[0][2][-3000:])
        self.assertNotEqual(watched[1][0], 0)
        files = sorted(p.name for p in (cwd / "out").iterdir())
        archives = [n for n in files if ".rank" not in n]
        self.assertEqual(len(archives), 1, f"{files}\n{watched[0][2][-2000:]}\n{watched[1][2][-2000:]}")
        a = read_archive(cwd / "out" / archives[0])
        self.assertEqual([int(r) for r in a["attrs"]["ranks_present"]], [0, 1])
        self.assertEqual([int(r) for r in a["attrs"]["origin_ranks"]], [1])


BEFORE_INIT_JOB = textwrap.dedent("""
    import os, signal, sys, time, torch
    rank, gate = int(os.environ["RANK"]), os.environ["TEST_GATE"]
    # torchrun stops the others (SIGTERM) once it sees the first failure: every worker fails on its own here.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(os.path.join(gate, str(rank)), "w").close()
    while len(os.listdir(gate)) < int(os.environ["WORLD_SIZE"]):
        time.sleep(0.01)
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                 "79.10 GiB of which 1.50 GiB is free.")
""")


@unittest.skipUnless(CLI, "TEST_CLI names the built oomflight")
@unittest.skipUnless(Path(TORCHRUN).is_file(), f"no torchrun beside {PY}")
class RanksBeforeTheStore(unittest.TestCase):
    def test_workers_that_fail_before_init_process_group_are_torchruns_ranks(self):
        cwd = scratch()
        (cwd / "job.py").write_text(BEFORE_INIT_JOB)
        (cwd / "gate").mkdir()
        out = cwd / "out"
        result = run([CLI, "run", "--", TORCHRUN, "--standalone", "--nproc-per-node", "4", "--monitor-interval", "1",
                      "job.py"], cwd, child_env(OOMFLIGHT_FOLDER=str(out), TEST_GATE=str(cwd / "gate")), timeout=300)
        log = result.stdout + result.stderr
        self.assertNotEqual(result.returncode, 0, log)
        self.assertEqual(sorted(p.name for p in out.iterdir()), [f"oom.0.rank{r}.h5" for r in range(4)], log)
        for rank in range(4):
            a = read_archive(out / f"oom.0.rank{rank}.h5")
            self.assertEqual(int(a["attrs"]["world_size"]), 4)
            self.assertEqual([int(r) for r in a["attrs"]["ranks_present"]], [rank])
            self.assertEqual(int(a["ranks"][0]["local_rank"]), rank)
            self.assertIn("(written by this rank alone, before this rank reached the job's store)",
                          a["attrs"]["reason"])
            self.assertRegex(log, rf"oomflight\[rank {rank}\] error: rank {rank} out of memory at batch 0")


SUBINTERPRETER_JOB = textwrap.dedent("""
    import json, torch, oomflight, oomflight._extension as ext, oomflight.torch as ot
    import _xxsubinterpreters as interpreters
    oomflight.init(run_name="sub", folder="out")
    m = ext.load(torch)
    assert m.attach(ot._function_addresses(), [(0, 0, 0, 80 << 30)], False, 0, "python") == ""
    interpreters.create()  # from now on CPython's PyGILState_Check() answers 1 on every thread
    assert m._feed_from_native_thread("pt_autograd_0", 0x1000, 512) == ""
    assert m._feed([("alloc", 0, 0x2000, 512, 0, False)]) == ""  # MAIN
    print(json.dumps({"path": oomflight.request_dump("signal").path}))
""")


NAMES_JOB = textwrap.dedent("""
    import json, torch, oomflight, oomflight._extension as ext, oomflight.torch as ot
    oomflight.init(run_name="names", folder="out")
    m = ext.load(torch)
    assert m.attach(ot._function_addresses(), [(0, 0, 0, 80 << 30)], False, 0, "python") == ""

    def allocate():
        assert m._feed([("alloc", 0, 0x3000, 512, 0, False)]) == ""

    def record():
        oomflight.record("alloc", 0, 0x4000, 512)

    odd = "alloc\\udcffname\\x00tail"
    for f in (allocate, record):
        f.__code__ = f.__code__.replace(co_name=odd, co_qualname=odd, co_filename="/jobs/odd\\udcff\\x00.py")
        f()
    print(json.dumps({"path": oomflight.request_dump("signal").path}))
""")


def long_function_job(lines: int) -> str:
    """A job whose one function is `lines` long and allocates (through the extension's trace callback) from every
    fourth line of it: that many distinct stacks, each deep in one code object's line table."""
    body = "\n".join(f"    feed({i})" if i % 4 == 0 else "    pass" for i in range(lines))
    return textwrap.dedent("""
        import json, sys, threading, time, torch, oomflight, oomflight._extension as ext, oomflight.torch as ot
        oomflight.init(run_name="long", folder="out", dump_timeout=sys.argv[1], poll_interval=sys.argv[2])
        m = ext.load(torch)
        assert m.attach(ot._function_addresses(), [(0, 0, 0, 80 << 30)], False, 0, "python") == ""

        def feed(i):
            m._feed([("alloc", 0, 0x100000 + 512 * i, 512, 0, False)])
        """) + "\ndef long_function():\n" + body + "\n\n" + textwrap.dedent("""
        long_function()
        result = {}
        # Asked on another thread while this one sleeps: the GIL is free the whole time.
        t = threading.Thread(target=lambda: result.update(path=oomflight.request_dump("signal").path))
        t.start()
        while t.is_alive():
            time.sleep(0.01)
        print(json.dumps(result))
        """)


@unittest.skipUnless(TORCH_SITE, "TEST_TORCH_SITE: the package installed with its extension")
class StackCapture(unittest.TestCase):
    """Row 5 and the names: a native thread never reads Python frames; names are kept as Python holds them."""

    def job(self, script: str, *args: str, **env: str):
        cwd = scratch()
        (cwd / "job.py").write_text(script)
        out = run([PY, "job.py", *args], cwd, child_env(**env))
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr[-4000:])
        import json

        return cwd, json.loads(out.stdout.splitlines()[-1]), out.stderr

    def test_a_native_thread_after_a_sub_interpreter_is_named_not_read(self):
        cwd, result, _ = self.job(SUBINTERPRETER_JOB)
        with h5py.File(result["path"], "r") as f:
            stacks = [frames_of(f, int(e["stack_id"])) for e in f["events"][()] if int(e["action"]) == 0]
        self.assertEqual(stacks[0], [("thread 'pt_autograd_0' (no Python frame)", "", 0)])
        line = next(i for i, t in enumerate(SUBINTERPRETER_JOB.splitlines(), 1) if "# MAIN" in t)
        self.assertEqual(stacks[1], [("<module>", str(cwd / "job.py"), line)])

    def test_a_surrogate_and_a_nul_in_names_are_kept_escaped(self):
        cwd, result, _ = self.job(NAMES_JOB)
        with h5py.File(result["path"], "r") as f:
            stacks = [frames_of(f, int(e["stack_id"])) for e in f["events"][()] if int(e["action"]) == 0]
        self.assertEqual(len(stacks), 2)
        for frames in stacks:  # the extension's own capture, then oomflight.record's
            self.assertEqual(frames[0][:2], ("alloc\\udcffname\\x00tail", "/jobs/odd\\udcff\\x00.py"))
            self.assertEqual(frames[1][0], "<module>")
        report = run([CLI, "report", result["path"]], cwd, child_env()) if CLI else None
        if report is not None:
            self.assertEqual(report.returncode, 0, report.stderr)
            self.assertIn("alloc\\udcffname\\x00tail", report.stdout)

    def test_frames_deep_in_a_long_function_keep_their_stacks_and_a_limit_names_its_cause(self):
        script = long_function_job(20000)
        cwd, result, log = self.job(script, "30s", "10ms")
        self.assertNotIn("were not symbolised", log)
        with h5py.File(result["path"], "r") as f:
            ev = f["events"][()]
            allocs = [e for e in ev if int(e["action"]) == 0]
            self.assertEqual(len(allocs), 5000)
            first_line = next(i for i, t in enumerate(script.splitlines(), 1) if t == "    feed(0)")
            for k in (0, 1234, 4999):
                frames = frames_of(f, int(allocs[k]["stack_id"]))
                self.assertEqual(frames[1], ("long_function", str(cwd / "job.py"), first_line + 4 * k))
        # With a limit too short for them (a quarter of a 4 ms deadline), the line names what took the time; the GIL
        # was free throughout, so it never says that it was not.
        _, _, log = self.job(script, "4ms", "1ms")
        said = [line for line in log.splitlines() if "Python stacks" in line and "were not symbolised" in line]
        self.assertEqual(len(said), 1, log)
        self.assertNotIn("GIL was not free", said[0])
        self.assertRegex(said[0], r"took longer than that|had not taken them up yet|waiting to take the GIL")


@unittest.skipUnless(TORCH_SITE, "TEST_TORCH_SITE: the package installed with its extension")
class FirstUseBuilds(unittest.TestCase):
    def test_the_build_folder_is_keyed_by_what_it_is_compiled_against(self):
        sys.path.insert(0, str(PYTHON_ROOT))
        try:
            from oomflight import _extension
            import torch
        finally:
            sys.path.pop(0)
        here = _extension.build_name(torch, ["/usr/local/cuda/include"])
        self.assertRegex(here, r"^oomflight_torch_[0-9a-f]{12}$")
        self.assertEqual(here, _extension.build_name(torch, ["/usr/local/cuda/include"]))
        self.assertNotEqual(here, _extension.build_name(torch, ["/opt/other/include"]))
        other_torch = types.SimpleNamespace(__version__="2.10.0+cu128")
        self.assertNotEqual(here, _extension.build_name(other_torch, ["/usr/local/cuda/include"]))
        # Another oomflight's sources (a header changed: torch's own check of a cached build reads the .cpp only).
        src = scratch()
        for name in _extension.SOURCES:
            (src / name).write_bytes((_extension.source_dir() / name).read_bytes())
        ours = _extension.build_name(torch, ["/usr/local/cuda/include"], src)
        with open(src / "python_thread.hpp", "a") as header:
            header.write("// changed\n")
        self.assertNotEqual(ours, _extension.build_name(torch, ["/usr/local/cuda/include"], src))


FIRST_USE_JOB = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"init_process_group returned on rank {rank}", file=sys.stderr, flush=True)
    import oomflight, oomflight.torch as ot
    for _ in range(6000):  # the join comes once the extension is built, on the builder's thread
        if ot._state.get("store_joined"):
            break
        time.sleep(0.1)
    oomflight.record("alloc", 0, 0x10000000 * (rank + 1), 512)
    dist.barrier()
    if rank == 1:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                     "79.10 GiB of which 1.50 GiB is free.")
    dist.barrier()
""")


@unittest.skipUnless(CLI, "TEST_CLI names the built oomflight")
@unittest.skipUnless(Path(TORCHRUN).is_file(), f"no torchrun beside {PY}")
class FirstUseBuild(unittest.TestCase):
    def test_a_build_at_first_use_runs_beside_the_job_and_joins_when_done(self):
        # The package from the tree (no install-time build) and an empty TORCH_EXTENSIONS_DIR: the extension is
        # compiled at first use. init_process_group returns at once (its line comes before the build's end), and the
        # ranks join the job's store once it is built: an OOM then is one archive of both ranks.
        cwd = scratch()
        (cwd / "job.py").write_text(FIRST_USE_JOB)
        out = cwd / "out"
        env = child_env(OOMFLIGHT_FOLDER=str(out), TORCH_EXTENSIONS_DIR=str(cwd / "extensions"))
        env["PYTHONPATH"] = f"{PYTHON_ROOT}:{PYTHON_ROOT / 'tests'}"
        if Path("/usr/lib/ccache/c++").exists():
            env["CXX"] = "/usr/lib/ccache/c++"  # CI builds it twice: the second pass takes the first's objects
        result = run([CLI, "run", "--", TORCHRUN, "--standalone", "--nproc-per-node", "2", "--monitor-interval", "0.1",
                      "job.py"], cwd, env, timeout=900)
        log = result.stdout + result.stderr
        self.assertNotEqual(result.returncode, 0, log)
        built = log.find("built oomflight's torch extension at first use")
        self.assertGreater(built, 0, log[-4000:])
        self.assertIn("building oomflight's torch extension for torch", log)
        for rank in (0, 1):
            returned = log.find(f"init_process_group returned on rank {rank}")
            self.assertGreaterEqual(returned, 0, log[-4000:])
            self.assertLess(returned, built, "init_process_group waited for the compiler:\n" + log[-4000:])
        names = [p.name for p in (cwd / "extensions").iterdir()]
        self.assertEqual(len(names), 1, names)
        self.assertRegex(names[0], r"^oomflight_torch_[0-9a-f]{12}$")
        archives = [p for p in out.iterdir() if ".rank" not in p.name]
        self.assertEqual(len(archives), 1, f"{sorted(p.name for p in out.iterdir())}\n{log[-4000:]}")
        a = read_archive(archives[0])
        self.assertEqual([int(r) for r in a["attrs"]["ranks_present"]], [0, 1])


if __name__ == "__main__":
    unittest.main()
