"""The Composer and Lightning callbacks driven by minimal stand-in trainers, with Debian's python3 (no torch, no
trainer: the package must work without them): batches are marked from the trainer's own count, run names and
Composer's overlapping arguments reach the settings, schedule arguments become OOMFLIGHT_SKIP_BATCHES and
OOMFLIGHT_INTERVAL, and Lightning's on_exception dumps an OOM once. The real trainers: test_torch_trainers.py."""
import json
import textwrap
import unittest

from support import PY, child_env, read_archive, run, scratch


def python(code: str, cwd):
    return run([PY, "-c", textwrap.dedent(code)], cwd, child_env())


class Composer(unittest.TestCase):
    def test_batches_come_from_the_trainers_timestamp(self):
        cwd = scratch()
        out = python("""
            import json, types, oomflight
            from oomflight.integrations.composer import OomflightCallback
            class Time:  # composer.core.Time: an int-like with .value
                def __init__(self, v): self.value = v
                def __str__(self): return f"Time{self.value}"
            cb = OomflightCallback(max_entries=50, folder="out", overwrite=True, install_torch=False)
            state = types.SimpleNamespace(run_name="composer-run", timestamp=types.SimpleNamespace(batch=Time(0)))
            cb.fit_start(state, None)
            for b in (10, 11, 12):
                state.timestamp.batch = Time(b)
                cb.batch_start(state, None)
                oomflight.record("alloc", 0, 0x1000 * b, 1024)
            r = oomflight.request_dump("signal")
            print(json.dumps({"path": r.path}))
            from oomflight.integrations._common import settings_from
            print(json.dumps([settings_from(dict(skip_batches=1, interval=i, folder=None)) for i in ("3ba", 3, Time(3))]))
            """, cwd)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        a = read_archive(json.loads(lines[0])["path"])
        self.assertEqual(a["attrs"]["run_name"], "composer-run")
        ev = a["events"]
        self.assertEqual(list(ev["action"]), [9, 0, 9, 0, 9, 0])
        self.assertEqual(list(ev["batch"]), [10, 10, 11, 11, 12, 12])
        self.assertEqual(json.loads(lines[1]), [{"skip_batches": 1, "interval": "3ba"}, {"skip_batches": 1, "interval": "3ba"},
                                                {"skip_batches": 1, "interval": "Time3"}])


class Lightning(unittest.TestCase):
    def test_batches_count_across_epochs_and_an_oom_exception_dumps_once(self):
        cwd = scratch()
        out = python("""
            import json, types, oomflight
            from oomflight.integrations.lightning import OomflightCallback
            cb = OomflightCallback(folder="out", install_torch=False, run_name="lit")
            loop = types.SimpleNamespace(total_batch_idx=0)  # Lightning's count across epochs
            trainer = types.SimpleNamespace(fit_loop=types.SimpleNamespace(epoch_loop=loop), logger=None)
            cb.setup(trainer, None, "fit")
            for epoch in range(2):
                for batch_idx in range(3):  # batch_idx restarts every epoch; the marks must not
                    loop.total_batch_idx = 3 * epoch + batch_idx
                    cb.on_train_batch_start(trainer, None, None, batch_idx)
                    oomflight.record("alloc", 0, 0x1000, 256)
            error = MemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
            cb.on_exception(trainer, None, error)
            cb.on_exception(trainer, None, error)  # Lightning may report it twice: one dump
            print(json.dumps({"path": oomflight._capi.library().oomflight_last_dump_path().decode()}))
            """, cwd)
        self.assertEqual(out.returncode, 0, out.stderr)
        files = sorted((cwd / "out").glob("*.h5"))
        self.assertEqual([p.name for p in files], ["oom.5.h5"])
        a = read_archive(files[0])
        self.assertEqual(a["attrs"]["run_name"], "lit")
        steps = [int(b) for act, b in zip(a["events"]["action"], a["events"]["batch"]) if act == 9]
        self.assertEqual(steps, [0, 1, 2, 3, 4, 5])


if __name__ == "__main__":
    unittest.main()
