"""The trainer callbacks in the real trainers, on CPU: Lightning's Trainer.fit (torch 2.11.0) and Composer's
Trainer.fit (its own environment: Composer 0.32.1 pins torch 2.7.0), a tiny model, 6 batches over 2 epochs, with
Composer's MemorySnapshot schedule skip_batches=1, interval="2ba": exactly one snapshot archive, window 1..2, named
after the trainer's run, whose batches are the trainer's own count. Then the same under `mpirun -np 2` with the
trainers' own gloo process group: one archive of both ranks. Without CUDA the torch hooks' guard warns once."""
import json
import os
import textwrap
import unittest
from pathlib import Path

import h5py

from support import CLI, MPIRUN_ENV, PY, PYTHON_ROOT, child_env, run, scratch

COMPOSER_PY = os.environ.get("TEST_COMPOSER_PYTHON", "")
STEP = 9

# Under mpirun, the variables torch.distributed's env:// rendezvous reads (each trainer starts its own gloo group).
DIST_ENV = textwrap.dedent("""
    import os
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        rank, size = os.environ["OMPI_COMM_WORLD_RANK"], os.environ["OMPI_COMM_WORLD_SIZE"]
        os.environ.update(RANK=rank, WORLD_SIZE=size, NODE_RANK=rank, LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("TEST_MASTER_PORT", "29533"))
""")

LIGHTNING = DIST_ENV + textwrap.dedent("""
    import torch, pytorch_lightning as pl
    from torch.utils.data import DataLoader, TensorDataset
    from oomflight.integrations.lightning import OomflightCallback

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    size = int(os.environ.get("WORLD_SIZE", "1"))
    data = DataLoader(TensorDataset(torch.randn(12 * size, 4), torch.randn(12 * size, 1)), batch_size=4)  # 3 a rank
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, num_nodes=size,
                         strategy="ddp" if size > 1 else "auto", enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[OomflightCallback(skip_batches=1, interval="2ba", folder="out")])
    trainer.fit(Tiny(), data)
    print("batches", trainer.fit_loop.epoch_loop.total_batch_idx + 1, "world", trainer.world_size)
""")

# The same fit, whose training_step also hands the torch extension one allocation of its own (no device here: the
# extension attached by hand once the callback has started oomflight, with the default call sites).
LIGHTNING_FEEDS = LIGHTNING.replace("""        x, y = batch
""", """        import oomflight._extension as ext, oomflight.torch as ot
        m = ext.load(torch)
        assert m.attach(ot._function_addresses(), [(0, 0, 0, 80 << 30)], False, 0, ot.stacks_setting()) == ""
        assert m._feed([("alloc", 0, 0x10000 * (batch_idx + 1), 4096, 0, False)]) == ""  # FEED
        x, y = batch
""")
assert LIGHTNING_FEEDS != LIGHTNING

COMPOSER = DIST_ENV + textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from composer import Trainer
    from composer.models import ComposerClassifier
    from composer.utils import dist
    from oomflight.integrations.composer import OomflightCallback

    size = int(os.environ.get("WORLD_SIZE", "1"))
    dataset = TensorDataset(torch.randn(24 * size, 4), torch.randint(0, 2, (24 * size,)))
    model = ComposerClassifier(torch.nn.Sequential(torch.nn.Linear(4, 2)), num_classes=2)
    sampler = dist.get_sampler(dataset, shuffle=False) if size > 1 else None
    trainer = Trainer(model=model, train_dataloader=DataLoader(dataset, batch_size=4, sampler=sampler),
                      max_duration="6ba", device="cpu", run_name="composer-tiny", progress_bar=False,
                      log_to_console=False, callbacks=[OomflightCallback(skip_batches=1, interval="2ba",
                                                                         folder="out")])
    trainer.fit()
    print("batches", int(trainer.state.timestamp.batch), "world", dist.get_world_size())
""")


def archive_summary(path: Path) -> dict:
    with h5py.File(path, "r") as f:
        ev = f["events"][()]
        ranks = f["ranks"][()]
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        steps = {}
        for r in ranks:
            rows = ev[int(r["event_offset"]): int(r["event_offset"]) + int(r["event_count"])]
            steps[int(r["rank"])] = [int(e["batch"]) for e in rows if int(e["action"]) == STEP]
        batches = f["batches"][()] if "batches" in f else []
        return {"attrs": attrs, "steps": steps, "batch_rows": sorted({int(b["batch"]) for b in batches}),
                "ranks": [int(r["rank"]) for r in ranks]}


class RealTrainers(unittest.TestCase):
    def fit(self, python: str, script: str, env: dict, ranks: int = 1, port: int = 29533):
        cwd = scratch()
        self.last_cwd = cwd
        (cwd / "fit.py").write_text(script)
        env = dict(env, TEST_MASTER_PORT=str(port))
        args = [python, "fit.py"]
        if ranks > 1:
            args = ["mpirun", "-np", str(ranks), "--oversubscribe", "-x", "PYTHONPATH", "-x", "OOMFLIGHT_LIBRARY",
                    "-x", "TEST_MASTER_PORT"] + args
        out = run(args, cwd, env, timeout=600)
        self.assertEqual(out.returncode, 0, out.stdout[-3000:] + out.stderr[-5000:])
        files = sorted((cwd / "out").glob("*.h5"))
        self.assertEqual([p.name for p in files], ["snapshot.1.h5"], out.stderr[-3000:])
        return out, archive_summary(files[0])

    def check_window(self, a: dict, ranks: list[int]):
        self.assertEqual(a["attrs"]["kind"], "snapshot")
        self.assertEqual(a["ranks"], ranks)
        for rank in ranks:
            self.assertEqual(a["steps"][rank], [1, 2], f"rank {rank}: the window's batch marks")
        self.assertTrue({1, 2} <= set(a["batch_rows"]), a["batch_rows"])

    def test_lightning_fit_gives_one_snapshot_of_batches_1_to_2(self):
        out, a = self.fit(PY, LIGHTNING, child_env())
        self.assertIn("batches 6 world 1", out.stdout)
        self.check_window(a, [0])
        self.assertEqual(a["attrs"]["run_name"], "lightning_logs-version_0")  # the Trainer's logger names the run
        warnings = [line for line in out.stderr.splitlines() if "not recording CUDA allocator events" in line]
        self.assertEqual(len(warnings), 1, out.stderr[-3000:])
        self.assertIn("sees no CUDA device", warnings[0])

    def test_lightnings_snapshot_names_the_training_steps_line_by_default(self):
        # Issue 32: no stacks setting anywhere, and the report's call sites name the job's own line.
        self.assertNotIn("OOMFLIGHT_STACKS", child_env())
        self.fit(PY, LIGHTNING_FEEDS, child_env())
        cwd = self.last_cwd
        report = run([CLI, "report", str(cwd / "out" / "snapshot.1.h5")], cwd, child_env())
        self.assertEqual(report.returncode, 0, report.stderr)
        line = next(i for i, text in enumerate(LIGHTNING_FEEDS.splitlines(), 1) if "# FEED" in text)
        self.assertIn(f"training_step ({cwd / 'fit.py'}:{line})", report.stdout)

    def test_under_oomflight_run_the_callbacks_settings_are_named_not_dropped(self):
        # `oomflight run` started oomflight at `import torch`, before the callback: its settings (the snapshot
        # schedule, the folder) cannot apply any more. The log names each one once (the script fits twice, so the
        # callback starts twice) with the variable that gives it; set so, they apply, and nothing is said; nor when
        # the callback itself started the session for the first fit.
        twice = LIGHTNING + "trainer.fit(Tiny(), data)  # a second fit: the callback's setup runs again\n"
        cwd = scratch()
        (cwd / "fit.py").write_text(twice)
        out = run([CLI, "run", "--", PY, "fit.py"], cwd, child_env(), timeout=600)
        self.assertEqual(out.returncode, 0, out.stderr[-5000:])
        self.assertIn("batches 6 world 1", out.stdout)
        said = [line for line in out.stderr.splitlines() if "the trainer callback's settings are not applied" in line]
        self.assertEqual(len(said), 1, out.stderr[-3000:])
        self.assertIn("set OOMFLIGHT_FOLDER=out OOMFLIGHT_SKIP_BATCHES=1 OOMFLIGHT_INTERVAL=2ba in every rank's "
                      "environment", said[0])
        self.assertFalse((cwd / "out").exists(), "no schedule was in force: no snapshot")

        for how, env, args in (
                ("set in the environment", child_env(OOMFLIGHT_SKIP_BATCHES="1", OOMFLIGHT_INTERVAL="2ba",
                                                     OOMFLIGHT_FOLDER="out/", OOMFLIGHT_OVERWRITE="false"),
                 [CLI, "run", "--", PY, "fit.py"]),
                ("started by the callback", child_env(), [PY, "fit.py"])):
            cwd = scratch()
            (cwd / "fit.py").write_text(twice)
            out = run(args, cwd, env, timeout=600)
            self.assertEqual(out.returncode, 0, out.stderr[-5000:])
            self.assertNotIn("settings are not applied", out.stderr, how)
            self.assertEqual([p.name for p in sorted((cwd / "out").glob("*.h5"))], ["snapshot.1.h5"], how)
            self.check_window(archive_summary(cwd / "out" / "snapshot.1.h5"), [0])

    def test_the_callbacks_defaults_are_the_librarys(self):
        # _common.DEFAULTS decides that a callback argument equal to the default in force is applied: it must be
        # what `oomflight config` says the defaults are.
        from oomflight.integrations import _common

        out = run([CLI, "config"], scratch(), child_env())
        self.assertEqual(out.returncode, 0, out.stderr)
        for name, default in _common.DEFAULTS.items():
            line = next(text for text in out.stdout.splitlines() if text.startswith(name + " "))
            self.assertEqual(line.split()[3], default, line)

    @unittest.skipUnless(COMPOSER_PY, "TEST_COMPOSER_PYTHON names Composer's environment")
    def test_composer_fit_gives_one_snapshot_of_batches_1_to_2(self):
        env = child_env(PYTHONPATH=str(PYTHON_ROOT))  # Composer's torch is 2.7.0: the tree's package, no build
        env["PYTHONPATH"] = str(PYTHON_ROOT)
        out, a = self.fit(COMPOSER_PY, COMPOSER, env)
        self.assertIn("batches 6 world 1", out.stdout)
        self.check_window(a, [0])
        self.assertEqual(a["attrs"]["run_name"], "composer-tiny")
        self.assertIn("torch 2.7.0+", out.stderr)

    def test_lightning_ddp_under_mpirun_gives_one_archive_of_both_ranks(self):
        env = child_env(**MPIRUN_ENV)
        out, a = self.fit(PY, LIGHTNING, env, ranks=2, port=29541)
        self.assertIn("world 2", out.stdout)
        self.check_window(a, [0, 1])
        self.assertEqual(int(a["attrs"]["world_size"]), 2)

    @unittest.skipUnless(COMPOSER_PY, "TEST_COMPOSER_PYTHON names Composer's environment")
    def test_composer_under_mpirun_gives_one_archive_of_both_ranks(self):
        env = child_env(**MPIRUN_ENV)
        env["PYTHONPATH"] = str(PYTHON_ROOT)
        out, a = self.fit(COMPOSER_PY, COMPOSER, env, ranks=2, port=29547)
        self.assertIn("world 2", out.stdout)
        self.check_window(a, [0, 1])


if __name__ == "__main__":
    unittest.main()
