"""The package in one process (no mpirun): settings as keywords checked by the library, the calls, the dump
kinds, and the archives they write, read back with h5py. Each test runs in a child Python: oomflight_init is
once per process."""
import json
import os
import shutil
import textwrap
import unittest

import h5py
import numpy as np

from support import CLI, PY, child_env, frames_of, read_archive, run, scratch


def python(code: str, cwd, **env):
    return run([PY, "-c", textwrap.dedent(code)], cwd, child_env(**env))


class Settings(unittest.TestCase):
    def test_keywords_fail_exactly_as_the_variables_do(self):
        cwd = scratch()
        out = python("""
            import oomflight
            for kwargs in ({"max_entries": "lots"}, {"dump_timout": "3s"}, {"poll_interval": -1}):
                try:
                    oomflight.init(**kwargs)
                except oomflight.ConfigError as e:
                    print("ConfigError:", e)
            """, cwd)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertEqual(len(lines), 3, out.stdout)
        self.assertIn("OOMFLIGHT_MAX_ENTRIES='lots'", lines[0])
        self.assertIn("OOMFLIGHT_DUMP_TIMOUT is not an oomflight setting", lines[1])
        self.assertIn("OOMFLIGHT_POLL_INTERVAL='-1s'", lines[2])
        # The same text as the variable gives to `oomflight init` from C.
        env_out = python("""
            import oomflight
            try:
                oomflight.init()
            except oomflight.ConfigError as e:
                print(e)
            """, cwd, OOMFLIGHT_MAX_ENTRIES="lots")
        self.assertEqual(env_out.stdout.strip(), lines[0].removeprefix("ConfigError: "))

    def test_durations_and_booleans_become_the_variables_texts(self):
        import datetime

        import oomflight
        self.assertEqual(oomflight.settings_to_variables(dump_timeout=3, poll_interval=0.25, overwrite=True,
                                                         max_entries=5),
                         {"OOMFLIGHT_DUMP_TIMEOUT": "3s", "OOMFLIGHT_POLL_INTERVAL": "250ms",
                          "OOMFLIGHT_OVERWRITE": "1", "OOMFLIGHT_MAX_ENTRIES": "5"})
        self.assertEqual(oomflight.settings_to_variables(dump_timeout=datetime.timedelta(minutes=1)),
                         {"OOMFLIGHT_DUMP_TIMEOUT": "60000ms"})


class Calls(unittest.TestCase):
    def test_record_mark_stacks_gauges_and_a_signal_dump(self):
        cwd = scratch()
        out = python("""
            import json, oomflight
            oomflight.init(run_name="api", max_entries=1000, folder="out")
            assert oomflight.rank() == (0, 1)
            stack = oomflight.intern_stack([("forward", "model.py", 42), ("main", "train.py", 7)])
            assert oomflight.intern_stack([("forward", "model.py", 42), ("main", "train.py", 7)]) == stack
            oomflight.annotate(epoch=1)
            oomflight.mark_batch(4)
            oomflight.annotate(lr=1e-4, wandb_api_key="s3cr3t")
            for i in range(6):
                assert oomflight.record("alloc", 2, 0x1000 * i, 512 * (i + 1), stream=7, stack_id=stack)
            oomflight.record("free_requested", 2, 0, 512)
            oomflight.set_memory(2, allocated=10 << 20, reserved=30 << 20, capacity=80 << 30, free=1 << 30)
            for bad in (lambda: oomflight.record("allocate", 0, 0, 0), lambda: oomflight.mark_batch(-1),
                        lambda: oomflight.request_dump("nap"), lambda: oomflight.set_memory(64)):
                try:
                    bad()
                except ValueError as e:
                    print("ValueError:", e)
            r = oomflight.request_dump("signal", reason="on demand")
            print(json.dumps({"status": r.status, "path": r.path, "ranks": r.ranks_written, "batch": r.batch}))
            oomflight.shutdown()
            try:
                oomflight.record("alloc", 0, 0, 0)
            except oomflight.StateError as e:
                print("StateError:", e)
            """, cwd)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertIn("unknown action 'allocate'", lines[0])
        self.assertIn("batch -1 is negative", lines[1])
        self.assertIn("kind 'nap'", lines[2])
        self.assertIn("device 64 is outside 0 .. 63", lines[3])
        result = json.loads(lines[4])
        self.assertIn("oomflight_record: oomflight_init was not called", lines[5])
        self.assertEqual(result["status"], "archive")
        self.assertEqual(result["ranks"], 1)
        self.assertEqual(result["batch"], 4)
        self.assertTrue(result["path"].endswith("out/signal.4.h5"), result["path"])
        a = read_archive(result["path"])
        self.assertEqual(a["attrs"]["kind"], "signal")
        self.assertEqual(a["attrs"]["run_name"], "api")
        events = a["events"]
        self.assertEqual(len(events), 8)  # the step event, 6 allocs, 1 free
        self.assertEqual(list(events["action"]), [9, 0, 0, 0, 0, 0, 0, 1])
        self.assertEqual(list(events["size"][1:7]), [512 * (i + 1) for i in range(6)])
        self.assertTrue(all(events["device"][1:] == 2))
        self.assertTrue(all(events["batch"] == 4))
        self.assertTrue(all(events["stream"][1:7] == 7))
        import h5py
        with h5py.File(result["path"], "r") as f:
            strings, blob = f["strings"][...], f["string_data"][...].tobytes()
            text = lambda i: blob[strings[i]["offset"]:strings[i]["offset"] + strings[i]["length"]].decode()
            meta = {text(c["key"]): (text(c["value"]), int(c["batch"])) for c in f["context"][...] if c["kind"] == 1}
            env = {text(c["key"]): text(c["value"]) for c in f["context"][...] if c["kind"] == 0}
        self.assertEqual(meta, {"epoch": ("1", -1), "lr": ("0.0001", 4), "wandb_api_key": ("<redacted>", 4)})
        self.assertEqual(env["OOMFLIGHT_RUN_NAME"], "api")
        self.assertIn("python", env["command_line"])
        with open(result["path"], "rb") as f:
            self.assertNotIn(b"s3cr3t", f.read())
        row = a["ranks"][0]
        self.assertEqual(row["device"], 2)
        self.assertEqual(row["reserved_bytes"], 30 << 20)
        self.assertEqual(row["device_capacity_bytes"], 80 << 30)

    def test_negative_and_oversized_figures_are_refused_naming_the_argument(self):
        # Issue 39: ctypes turned a negative figure into 2^64 - figure in silence; set_memory(free=capacity -
        # reserved) with reserved above the capacity was stored, and the report printed "device free 16777216.00 TiB
        # of 8.00 GiB". Every figure is now checked where it is given, and nothing refused is published.
        cwd = scratch()
        out = python("""
            import oomflight
            oomflight.init(run_name="numbers", folder="out")
            GiB = 1 << 30
            reserved, capacity = 8 * GiB + GiB // 2, 8 * GiB
            oomflight.set_memory(0, allocated=GiB, reserved=2 * GiB, capacity=capacity, free=6 * GiB)
            for bad in (lambda: oomflight.set_memory(0, reserved=reserved, capacity=capacity, free=capacity - reserved),
                        lambda: oomflight.set_memory(0, capacity=capacity, free=capacity + 1),
                        lambda: oomflight.set_memory(1 << 32, capacity=capacity),
                        lambda: oomflight.record("alloc", 0, 0x1000, -512),
                        lambda: oomflight.record("alloc", 0, -4096, 512),
                        lambda: oomflight.record("oom", 0, -1, 512),
                        lambda: oomflight.record("alloc", 0, 0x1000, 1 << 63),
                        lambda: oomflight.record("alloc", 0, 0x1000, 2.5),
                        lambda: oomflight.request_dump("signal", requested_bytes=-1),
                        lambda: oomflight.request_dump("signal", batch=-2),
                        lambda: oomflight.trigger_oom(0, "x", device_free_bytes=-GiB),
                        lambda: oomflight.mark_batch(1 << 64),
                        lambda: oomflight.intern_stack([("f", "f.py", -3)])):
                try:
                    bad()
                    print("accepted")
                except (ValueError, TypeError) as e:
                    print(type(e).__name__ + ":", e)
            print(oomflight.request_dump("signal").path)
            """, cwd)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertEqual(lines[:-1], [
            "ValueError: set_memory: free -536870912 is negative (a figure of bytes is 0 .. 2^63 - 1)",
            "ValueError: oomflight_set_memory: device_free_bytes 8589934593 is above device_capacity_bytes 8589934592",
            "ValueError: set_memory: device 4294967296 is outside 0 .. 63",
            "ValueError: record: size -512 is negative (a figure of bytes is 0 .. 2^63 - 1)",
            "ValueError: record: addr -4096 is negative",
            "ValueError: record: addr (an oom event's free bytes) -1 is negative (a figure of bytes is 0 .. 2^63 - 1)",
            "ValueError: record: size 9223372036854775808 is outside 0 .. 9223372036854775807 (a figure of bytes is "
            "0 .. 2^63 - 1)",
            "TypeError: record: size must be an int, not float (2.5)",
            "ValueError: request_dump: requested_bytes -1 is negative (a figure of bytes is 0 .. 2^63 - 1)",
            "ValueError: request_dump: batch -2 is outside -1 .. 9223372036854775807 (-1: the current batch)",
            "ValueError: trigger_oom: device_free_bytes -1073741824 is negative (a figure of bytes is 0 .. 2^63 - 1)",
            "ValueError: mark_batch: batch 18446744073709551616 is outside 0 .. 9223372036854775807",
            "ValueError: intern_stack: frame 0's line -3 is negative",
        ])
        a = read_archive(lines[-1])
        row = a["ranks"][0]
        self.assertEqual((row["device_free_bytes"], row["device_capacity_bytes"], row["reserved_bytes"]),
                         (6 << 30, 8 << 30, 2 << 30), "the figures published before the refused ones")
        self.assertEqual([int(x) for x in a["events"]["action"]], [], "no refused event was recorded")

    def test_a_recorded_event_carries_its_callers_frames_unless_stacks_are_off(self):
        # Issue 32: oomflight.record() without a stack_id names where it was called, as the torch extension's
        # events do; OOMFLIGHT_STACKS=off (here the init keyword) records none.
        script = """
            import json, sys, oomflight
            oomflight.init(run_name="where", folder="out", stacks=sys.argv[1])

            def allocate(i):
                oomflight.record("alloc", 0, 0x1000 * i, 512)  # RECORD

            for i in range(3):
                allocate(i)  # CALL
            print(oomflight.request_dump("signal").path)
            """
        lines = textwrap.dedent(script).splitlines()
        record = next(i for i, text in enumerate(lines, 1) if "# RECORD" in text)
        call = next(i for i, text in enumerate(lines, 1) if "# CALL" in text)
        for stacks in ("python", "off"):
            cwd = scratch()
            (cwd / "job.py").write_text(textwrap.dedent(script))
            out = run([PY, "job.py", stacks], cwd, child_env())
            self.assertEqual(out.returncode, 0, out.stderr)
            import h5py
            with h5py.File(out.stdout.strip(), "r") as f:
                allocs = [int(e["stack_id"]) for e in f["events"][()] if int(e["action"]) == 0]
                self.assertEqual(len(allocs), 3)
                if stacks == "off":
                    self.assertEqual(allocs, [-1] * 3)
                    continue
                self.assertEqual(len(set(allocs)), 1, "one call site, one stack")
                job = str(cwd / "job.py")
                self.assertEqual(frames_of(f, allocs[0]), [("allocate", job, record), ("<module>", job, call)])

    def test_a_crossing_of_the_headroom_threshold_in_a_process_of_its_own_is_one_archive_at_the_next_batch(self):
        # Issue 42: with no other rank (no watcher), a crossing is written by the batch thread at the next
        # mark_batch, not by the publishing call (inside torch's allocator, in a real job). Once per arming: the
        # figure stays over, falls within 5 points, rises, then falls more than 5 points below and crosses again,
        # which is the second archive. The cap is the limit where one is set. A bad threshold is refused naming it.
        cwd = scratch()
        out = python("""
            import oomflight
            MiB, GiB = 1 << 20, 1 << 30
            oomflight.init(run_name="headroom", folder="out", headroom_dump="75%")
            # 50%, 87.5% (crossed), 92.8%, 70.8% (within 5 points: still disarmed), 81.3%, 62.5% (armed), 87.5%
            for batch, reserved in enumerate([2 * GiB, 3584 * MiB, 3800 * MiB, 2900 * MiB, 3328 * MiB, 2560 * MiB,
                                              3584 * MiB]):
                oomflight.mark_batch(batch)
                oomflight.set_memory(0, reserved=reserved, capacity=80 * GiB, cap=4 * GiB)
            oomflight.mark_batch(7)
            oomflight.shutdown()
            """, cwd)
        self.assertEqual(out.returncode, 0, out.stderr)
        files = sorted((cwd / "out").glob("*.h5"))
        self.assertEqual([f.name for f in files], ["headroom.1.h5", "headroom.6.h5"], out.stderr)
        for f, batch, reserved in ((files[0], 1, "3.50 GiB"), (files[1], 6, "3.50 GiB")):
            a = read_archive(f)
            self.assertEqual(a["attrs"]["kind"], "headroom")
            self.assertEqual(int(a["attrs"]["dump_batch"]), batch)
            self.assertEqual(a["attrs"]["reason"], f"rank 0: device 0: reserved {reserved} of its 4.00 GiB per-process "
                                                   "cap, over OOMFLIGHT_HEADROOM_DUMP=75% (3.00 GiB)")
        self.assertIn(f"rank 0 crossed the headroom threshold at batch 1: device 0: reserved 3.50 GiB", out.stderr)
        bad = python("""
            import oomflight
            oomflight.init(headroom_dump=1.5)
            """, cwd)
        self.assertIn("OOMFLIGHT_HEADROOM_DUMP='1.5': must be above 0 and at most 1", bad.stderr)

    @unittest.skipUnless(os.environ.get("TEST_FAKE_NVML_DIR"), "TEST_FAKE_NVML_DIR names the stand-in for NVML")
    def test_the_memory_outside_the_allocator_is_nvmls_count_less_reserved_and_unknown_without_it(self):
        # Issue 42, item 4. With the driver's NVML (here its stand-in, tests/support/fake_nvml.c, which lists this
        # process at TEST_NVML_USED_BYTES): the batch rows and the ranks row carry 7.5 GiB - 7 GiB reserved, the
        # headroom check adds it (7 GiB alone is under 90% of 8 GiB, 7.5 GiB is over), and the report shows it.
        # Without NVML, or when it lists no figure for the process, the archive says unknown (-1), never 0.
        job = """
            import oomflight
            GiB = 1 << 30
            oomflight.init(run_name="outside", folder="out", headroom_dump="0.9")
            oomflight.set_memory(0, reserved=7 * GiB, capacity=8 * GiB)  # under 7.20 GiB: no crossing
            oomflight.mark_batch(0)  # NVML's first sample: 7.5 GiB used, 512 MiB of it outside the allocator
            oomflight.set_memory(0, reserved=7 * GiB, capacity=8 * GiB)  # 7.5 GiB in all: crossed
            oomflight.mark_batch(1)  # a process of its own: the batch thread writes the crossing's archive
            print(oomflight.request_dump("signal").path)
            """
        GiB = 1 << 30
        cases = {"nvml": {"LD_LIBRARY_PATH": os.environ["TEST_FAKE_NVML_DIR"], "TEST_NVML_USED_BYTES": str(GiB * 15 // 2)},
                 "not available": {"LD_LIBRARY_PATH": os.environ["TEST_FAKE_NVML_DIR"], "TEST_NVML_USED_BYTES": "na"},
                 "not listed": {"LD_LIBRARY_PATH": os.environ["TEST_FAKE_NVML_DIR"]},
                 "no nvml": {}}
        for case, env in cases.items():
            cwd = scratch()
            out = python(job, cwd, **env)
            self.assertEqual(out.returncode, 0, f"{case}: {out.stderr}")
            signal = read_archive(out.stdout.strip())
            expected = GiB // 2 if case == "nvml" else -1
            self.assertEqual([int(r["outside_allocator_bytes"]) for r in signal["ranks"]], [expected], case)
            self.assertEqual([int(b["outside_allocator_bytes"]) for b in signal["batches"]], [expected] * 2, case)
            headroom = sorted((cwd / "out").glob("headroom.*.h5"))
            report = run([CLI, "report", out.stdout.strip()], cwd, child_env()).stdout
            if case == "nvml":
                self.assertEqual([f.name for f in headroom], ["headroom.0.h5"], out.stderr)
                self.assertEqual(read_archive(headroom[0])["attrs"]["reason"],
                                 "rank 0: device 0: reserved 7.00 GiB and 512.00 MiB outside the caching allocator of "
                                 "its 8.00 GiB capacity, over OOMFLIGHT_HEADROOM_DUMP=90% (7.20 GiB)")
                self.assertRegex(report, r"\n +0 +1 +0 B +7\.00 GiB +512\.00 MiB ")
                self.assertNotIn("unknown on every rank", report)
                # The rows as oomflight before 0.3 wrote them (the same members without the last): read as unknown.
                older = cwd / "older.h5"
                shutil.copy(out.stdout.strip(), older)
                with h5py.File(older, "r+") as f:
                    for name in ("ranks", "batches"):
                        rows = f[name][()]
                        names = [n for n in rows.dtype.names if n != "outside_allocator_bytes"]
                        dtype = np.dtype({"names": names, "formats": [rows.dtype.fields[n][0] for n in names],
                                          "offsets": [rows.dtype.fields[n][1] for n in names],
                                          "itemsize": rows.dtype.fields["outside_allocator_bytes"][1]})
                        kept = np.zeros(len(rows), dtype)
                        for n in names:
                            kept[n] = rows[n]
                        del f[name]
                        f.create_dataset(name, data=kept)
                older_report = run([CLI, "report", str(older)], cwd, child_env())
                self.assertEqual(older_report.returncode, 0, older_report.stderr)
                self.assertRegex(older_report.stdout, r"\n +0 +1 +0 B +7\.00 GiB +\? ")
                self.assertIn("per-batch peak allocated", older_report.stdout)
                self.assertIn("memory outside the caching allocator: unknown on every rank", older_report.stdout)
            else:
                self.assertEqual(headroom, [], f"{case}: 7 GiB alone is under the threshold")
                self.assertRegex(report, r"\n +0 +1 +0 B +7\.00 GiB +\? ")
                self.assertIn("memory outside the caching allocator: unknown on every rank", report)

    def test_an_oom_reaching_capture_oom_dumps_once_and_propagates_unchanged(self):
        cwd = scratch()
        out = python("""
            import oomflight
            oomflight.init(run_name="cap", folder="out")
            oomflight.mark_batch(2)
            class OutOfMemoryError(RuntimeError):
                pass
            OutOfMemoryError.__module__ = "torch"
            error = OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            try:
                with oomflight.capture_oom():
                    with oomflight.capture_oom():  # nested: still one dump
                        raise error
            except OutOfMemoryError as e:
                assert e is error
                print("propagated:", e)
            try:
                with oomflight.capture_oom():
                    raise KeyError("not memory")
            except KeyError:
                print("other errors pass")
            print(oomflight.is_oom(error), oomflight.is_oom(KeyError("x")), oomflight.is_oom("MemoryError", ""))
            """, cwd)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.splitlines(), [
            "propagated: CUDA out of memory. Tried to allocate 2.00 GiB", "other errors pass", "True False True"])
        files = sorted((cwd / "out").glob("*.h5"))
        self.assertEqual([p.name for p in files], ["oom.2.h5"])
        a = read_archive(files[0])
        self.assertIn("torch.OutOfMemoryError: CUDA out of memory", a["attrs"]["reason"])
        self.assertEqual(a["ranks"][0]["is_origin"], 1)

    def test_an_oom_reaching_the_top_dumps_and_the_jobs_traceback_is_printed(self):
        cwd = scratch()
        out = python("""
            import oomflight, oomflight.oom
            oomflight.oom.install_excepthook()
            oomflight.init(run_name="top", folder="out")
            oomflight.mark_batch(9)
            raise MemoryError("cannot allocate 8 GiB of pinned host memory")
            """, cwd)
        self.assertEqual(out.returncode, 1)
        self.assertIn("MemoryError: cannot allocate 8 GiB of pinned host memory", out.stderr)
        self.assertIn("archive", out.stderr)
        self.assertEqual([p.name for p in (cwd / "out").glob("*.h5")], ["oom.9.h5"])


if __name__ == "__main__":
    unittest.main()
