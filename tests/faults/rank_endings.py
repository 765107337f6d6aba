"""Every way a rank can end, for real (issue 29; docs/protocol.md, "Leaving"): two ranks under mpirun, rank 1 ends,
and rank 0 is either blocked (as in the job's next collective, which rank 1 never enters) while the launcher tears
the job down (mpirun's default), or ends normally a moment later while the launcher keeps the job going (mpirun
--enable-recovery --mca orte_abort_on_non_zero_status 0: Open MPI's own way to outlive a failed rank. Without
--enable-recovery, mpirun 4.1 itself hangs once a rank dies of a signal, oomflight or not, and calls a rank whose
MPI process is not its direct child "improper" and tears the job down; srun with PMIx cancels the step whenever an
MPI rank ends without MPI_Finalize, --kill-on-bad-exit or not). Rank 1 ends by sys.exit(2), an
uncaught ValueError, os._exit(3), SIGKILL, SIGTERM (with and without OOMFLIGHT_DUMP_ON_EXIT=1), an uncaught
out-of-memory error, or a caught one that it retries past (it then ends normally, as rank 0 does).

Two jobs: a plain Python script under `oomflight run` (the start-up hook's excepthook and exit handling), and a
Lightning Trainer.fit with OomflightCallback under a plain mpirun (the callback's own start and on_exception), with
the real torch environment's interpreter.

What must hold for each: the job's exit status is the rank's own (mpirun's status and its "exited on signal" line
when it tears the job down; each rank's status, recorded by a shell around it, when it does not; never a signal
that oomflight caused, never a segfault); no step waits on a deadline: OOMFLIGHT_DUMP_TIMEOUT is a minute, and the
job ends within BOUND_S of rank 1's last step; every archive names the right ranks, and no other file is left (no
stray rank-local file).

Without oomflight (no `oomflight run`), the plain job is run too, once per case, as the reference for the exit
statuses: they must be equal.

Usage: rank_endings.py OOMFLIGHT_CLI LIBOOMFLIGHT PYTHON_PACKAGE_ROOT TORCH_PYTHON [TEST...] (TORCH_PYTHON may be
""); exits 0 when every case holds.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from pathlib import Path

import h5py

CLI = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ""
LIBRARY = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else ""
PACKAGE_ROOT = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else ""
TORCH_PYTHON = sys.argv[4] if len(sys.argv) > 4 else ""
TIMEOUT_S = 60   # OOMFLIGHT_DUMP_TIMEOUT: any wait on it is unmistakable against the job's own few seconds
BOUND_S = 20     # rank 1's last step to the job's end, on this shared 2-core machine (a wait would be >= 60 s)
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("OOMFLIGHT_") and k != "PYTHONPATH"},
       "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

# What both jobs do at the step where rank 1 ends (a module beside them).
ENDING = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path

    RANK = int(os.environ["OMPI_COMM_WORLD_RANK"])

    def barrier(name):
        # Every rank reaches this step before rank 1 ends (a file barrier: the jobs have no MPI of their own).
        Path(f"{name}.{RANK}").touch()
        deadline = time.time() + 120
        while not all(Path(f"{name}.{r}").exists() for r in (0, 1)) and time.time() < deadline:
            time.sleep(0.01)

    def end(how, peer, oom_error, capture_oom):
        barrier("ready")
        Path(f"last_step.{RANK}").write_text(repr(time.time()))
        if RANK == 0 or how == "oom_retried":
            if how == "oom_retried" and RANK == 1:
                try:
                    with capture_oom():  # every rank's history, then the job's own handling
                        raise oom_error("CUDA out of memory. Tried to allocate 2.00 GiB")
                except oom_error:
                    pass  # retried with a smaller batch: the job goes on and ends normally
            if peer == "blocked" and how != "oom_retried":
                time.sleep(600)  # in the next collective, which rank 1 never enters: the launcher ends this rank
            time.sleep(1.5)
            return
        time.sleep(0.3)
        if how == "exit2":
            sys.exit(2)
        if how == "valueerror":
            raise ValueError("the job's own error")
        if how == "os_exit":
            os._exit(3)
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how in ("sigterm", "sigterm_dump_on_exit"):
            os.kill(os.getpid(), signal.SIGTERM)
            # Training goes on until SIGTERM (or the exit dump it asks for) ends the process; a handler of the job's
            # own (Lightning's) only takes note, and training goes on.
            for _ in range(100):
                time.sleep(0.05)
            return
        if how == "oom":
            raise oom_error("CUDA out of memory. Tried to allocate 2.00 GiB")
        raise AssertionError(f"unknown ending {how}")
""")

PLAIN = textwrap.dedent("""
    import sys
    import ending
    try:
        import oomflight
    except ImportError:
        oomflight = None  # the reference run, without oomflight
    if oomflight is not None:
        oomflight.init(folder="out")
        for batch in range(3):
            oomflight.mark_batch(batch)
            oomflight.record("alloc", 0, 0x10000 * (batch + 1), 1 << 20)
        capture = oomflight.capture_oom
    else:
        import contextlib
        capture = contextlib.nullcontext
    ending.end(sys.argv[1], sys.argv[2], MemoryError, capture)
""")

LIGHTNING = textwrap.dedent("""
    import sys
    import torch, pytorch_lightning as pl
    from torch.utils.data import DataLoader, TensorDataset
    import oomflight
    from oomflight.integrations.lightning import OomflightCallback
    import ending

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
        def training_step(self, batch, batch_idx):
            if self.trainer.fit_loop.epoch_loop.total_batch_idx == 2:
                ending.end(sys.argv[1], sys.argv[2], torch.OutOfMemoryError, oomflight.capture_oom)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, enable_checkpointing=False, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[OomflightCallback(folder="out")])
    trainer.fit(Tiny(), data)
""")

# Rank 1's ending -> (its exit status as a shell reports it, mpirun's status when it tears the job down, the kind of
# the one archive it leaves, if any).
CASES = {
    "exit2": (2, 2, None),
    "valueerror": (1, 1, None),
    "os_exit": (3, 3, None),
    "sigkill": (128 + 9, 128 + 9, None),
    "sigterm": (128 + 15, 128 + 15, None),
    "sigterm_dump_on_exit": (128 + 15, 128 + 15, "exit"),
    "oom": (1, 1, "oom"),
    "oom_retried": (0, 0, "oom"),
}


def archive_attrs(path: Path) -> dict:
    with h5py.File(path, "r") as f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        attrs["rows"] = sorted(int(r) for r in f["ranks"]["rank"])
    return attrs


class Endings:
    """The cases, for a job: `rank_command(how, peer)` gives the command of each rank."""
    work: Path
    needs_torch = False

    @classmethod
    def setUpClass(cls):
        if not CLI:
            raise unittest.SkipTest("usage: rank_endings.py OOMFLIGHT_CLI LIBOOMFLIGHT PYTHON_PACKAGE_ROOT TORCH_PYTHON")
        if cls.needs_torch and not TORCH_PYTHON:
            raise AssertionError("no real-torch environment: run scripts/bootstrap.sh (scripts/python_envs.sh makes it)")
        cls.work = Path(tempfile.mkdtemp(prefix=f"oomflight-endings-{cls.__name__}-"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def job_files(self, cwd: Path) -> None:
        (cwd / "ending.py").write_text(ENDING)
        (cwd / "plain.py").write_text(PLAIN)
        (cwd / "lightning.py").write_text(LIGHTNING)

    def rank_command(self, how: str, peer: str) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict:
        return dict(ENV)

    def run_job(self, how: str, teardown: bool, with_oomflight: bool = True):
        """Runs one case; returns (folder, mpirun's status, output, seconds from rank 1's last step to the job's
        end, and for a kept job the ranks' own statuses)."""
        peer = "blocked" if teardown else "normal"
        cwd = Path(tempfile.mkdtemp(prefix=f"{how}-{'teardown' if teardown else 'kept'}-", dir=self.work))
        self.job_files(cwd)
        rank = self.rank_command(how, peer) if with_oomflight else [sys.executable, "plain.py", how, peer]
        if not teardown:
            # A shell around each rank records its own status and end (mpirun's status is 0 without a teardown):
            # the rank's process is the shell's child, so that mpirun sees an exit status, never a signal.
            rank = ["sh", "-c", '"$@"; echo $? > status.$OMPI_COMM_WORLD_RANK; '
                                'date +%s.%N > end.$OMPI_COMM_WORLD_RANK', "sh", *rank]
        cmd = ["mpirun", "--oversubscribe", "-np", "2", "-x", f"OOMFLIGHT_DUMP_TIMEOUT={TIMEOUT_S}s"]
        if how == "sigterm_dump_on_exit":
            cmd += ["-x", "OOMFLIGHT_DUMP_ON_EXIT=1"]
        if not teardown:
            cmd += ["--enable-recovery", "--mca", "orte_abort_on_non_zero_status", "0"]
        env = self.env()
        for name in ("OOMFLIGHT_LIBRARY", "PYTHONPATH"):
            if name in env:
                cmd += ["-x", name]
        proc = subprocess.Popen(cmd + rank, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            out += "\n[killed by the test after 240 s]"
        ended = time.time()
        last = cwd / "last_step.1"
        self.assertTrue(last.exists(), f"rank 1 never reached its last step:\n{out}")
        seconds = ended - float(last.read_text())
        statuses = {}
        if not teardown:
            for r in (0, 1):
                status, end = cwd / f"status.{r}", cwd / f"end.{r}"
                self.assertTrue(status.exists(), f"rank {r} did not end:\n{out}")
                statuses[r] = int(status.read_text())
                if r == 0:
                    # The survivor's own end, from its last step: what a wait for the dead would lengthen.
                    seconds = float(end.read_text()) - float((cwd / "last_step.0").read_text())
        return cwd, proc.returncode, out, seconds, statuses

    def expected(self, how: str, teardown: bool) -> tuple:
        return CASES[how]

    def check_case(self, how: str, teardown: bool):
        own_status, mpirun_status, kind = self.expected(how, teardown)
        cwd, rc, out, seconds, statuses = self.run_job(how, teardown)
        context = f"\n--- {how}, {'torn down' if teardown else 'kept'}, rc {rc}, {seconds:.1f} s:\n{out[-6000:]}"
        # The figures docs/protocol.md quotes: one line per case.
        print(f"\n{type(self).__name__} {how} {'torn down' if teardown else 'kept going'}: {seconds:.1f} s from the "
              f"last step to the end, mpirun {rc}, ranks {statuses or '-'}", file=sys.stderr, flush=True)
        self.assertLess(seconds, BOUND_S, "a rank waited on a deadline" + context)
        for crash in ("Segmentation fault", "signal 11", "Aborted", "core dumped"):
            self.assertNotIn(crash, out, context)
        self.assertNotIn("within OOMFLIGHT_DUMP_TIMEOUT", out, context)
        if teardown:
            self.assertEqual(rc, mpirun_status, context)
            if mpirun_status > 128:
                self.assertIn(f"process rank 1 with PID", out, context)
                self.assertIn(f"exited on signal {mpirun_status - 128}", out, context)
            else:
                self.assertNotIn("exited on signal", out, context)
        else:
            self.assertEqual(statuses, {0: 0, 1: own_status}, context)
        if how == "valueerror":
            self.assertIn("ValueError: the job's own error", out, context)
        if how in ("oom", "oom_retried"):
            self.assertIn("CUDA out of memory. Tried to allocate 2.00 GiB", out, context)
        # The archive that the ending asks for, naming both ranks, and nothing else: no stray rank-local file.
        files = sorted(p.relative_to(cwd).as_posix() for p in (cwd / "out").rglob("*")) if (cwd / "out").exists() else []
        if kind is None:
            self.assertEqual(files, [], context)
        else:
            self.assertEqual(len(files), 1, f"{files}{context}")
            self.assertTrue(files[0].startswith(f"out/{kind}.") and files[0].endswith(".h5"), f"{files}{context}")
            attrs = archive_attrs(cwd / files[0])
            self.assertEqual(attrs["kind"], kind, context)
            self.assertEqual(list(attrs["ranks_present"]), [0, 1], context)
            self.assertEqual(attrs["rows"], [0, 1], context)
            self.assertIn(1, list(attrs["origin_ranks"]), context)
            self.assertEqual(int(attrs["complete"]), 1, context)
        return statuses


def add_cases(cls):
    for how in CASES:
        for teardown in (True, False):
            name = f"test_{how}_{'torn_down' if teardown else 'kept_going'}"
            def case(self, how=how, teardown=teardown):
                self.check_case(how, teardown)
            setattr(cls, name, case)
    return cls


@add_cases
class UnderOomflightRun(Endings, unittest.TestCase):
    """A plain Python job under `oomflight run` (its start-up hook), checked against the same job without oomflight."""

    def rank_command(self, how, peer):
        return [CLI, "run", "--python", "--", sys.executable, "plain.py", how, peer]

    def check_case(self, how, teardown):
        statuses = super().check_case(how, teardown)
        if not teardown:
            # The same job without oomflight: the same statuses, rank by rank.
            _, _, out, _, reference = self.run_job(how, teardown, with_oomflight=False)
            self.assertEqual(statuses, reference, f"without oomflight:\n{out[-3000:]}")


@add_cases
class LightningCallback(Endings, unittest.TestCase):
    """Lightning's Trainer.fit with OomflightCallback (no `oomflight run`), in the real torch environment."""

    needs_torch = True

    def env(self):
        return {**ENV, "OOMFLIGHT_LIBRARY": LIBRARY, "PYTHONPATH": PACKAGE_ROOT}

    def rank_command(self, how, peer):
        return [TORCH_PYTHON, "lightning.py", how, peer]

    def expected(self, how, teardown):
        if how.startswith("sigterm"):
            # Lightning replaces SIGTERM's handler with its own (at fit, after the callback's setup, so oomflight's
            # OOMFLIGHT_DUMP_ON_EXIT handler too), which takes note, and training ends at the batch's end with
            # SIGTERMException, a SystemExit of status 0: the rank's own status is Lightning's, with or without
            # oomflight. A launcher then tears nothing down, and a peer blocked in a collective waits forever.
            if teardown:
                self.skipTest("Lightning ends a SIGTERMed rank with status 0 at its batch's end: nothing is torn down")
            return 0, 0, None
        return super().expected(how, teardown)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v", *sys.argv[5:]])  # then test names, to run some
