"""An unchanged DDP script with the real torch on CPU (gloo), under `mpirun -np 2 oomflight run -- python train.py`:
the import hook installs oomflight.torch (no device: one warning), every optimizer step marks a batch, `kill -USR1`
of one rank gives one archive of kind signal holding both ranks with their per-batch rows, training goes on, and
the job's exit status is its own."""
import os
import re
import signal
import textwrap
import time
import unittest
from pathlib import Path

import h5py

from support import CLI, MPIRUN_ENV, PY, child_env, scratch

TRAIN = textwrap.dedent("""
    # A plain DDP job: nothing here knows about oomflight.
    import os, sys, time
    import torch
    import torch.distributed as dist

    rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["TEST_MASTER_PORT"])
    dist.init_process_group("gloo", rank=rank, world_size=size)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
        if step == 3:  # let the test signal one rank here, then go on training
            open(f"pid.{rank}", "w").write(str(os.getpid()))
            deadline = time.time() + 120
            while not os.path.exists("release") and time.time() < deadline:
                time.sleep(0.05)
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)
    sys.exit(int(sys.argv[1]))
""")


@unittest.skipUnless(CLI, "TEST_CLI names the built oomflight")
class UnchangedScript(unittest.TestCase):
    def job(self, exit_code: int, port: int):
        import subprocess

        cwd = scratch()
        (cwd / "train.py").write_text(TRAIN)
        env = child_env(**MPIRUN_ENV, TEST_MASTER_PORT=str(port))
        env.pop("OOMFLIGHT_LIBRARY")  # `oomflight run` sets it to its own library
        env.pop("PYTHONPATH")         # and puts its package on the path: nothing of ours here
        args = ["mpirun", "-np", "2", "-x", "TEST_MASTER_PORT", CLI, "run", "--run-name", "ddp", "--", PY,
                "train.py", str(exit_code)]
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 240
            while not all((cwd / f"pid.{r}").is_file() and (cwd / f"pid.{r}").read_text() for r in (0, 1)):
                self.assertIsNone(proc.poll(), "the job ended before step 3")
                self.assertLess(time.time(), deadline, "the ranks did not reach step 3")
                time.sleep(0.1)
            os.kill(int((cwd / "pid.1").read_text()), signal.SIGUSR1)
            folder = cwd / "ddp" / "oomflight"
            while not list(folder.glob("signal.*.h5")):
                self.assertLess(time.time(), deadline, "no signal archive")
                time.sleep(0.1)
            (cwd / "release").write_text("")
            stdout, stderr = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        return cwd, proc.returncode, stdout, stderr

    def test_sigusr1_gives_one_archive_of_both_ranks_and_the_exit_status_is_the_jobs(self):
        cwd, rc, stdout, stderr = self.job(0, 29561)
        self.assertEqual(rc, 0, stderr[-4000:])
        # mpirun forwards each rank's writes as they come: print's text and its newline are two writes
        # when Python's output is unbuffered, so one rank's line may be cut by the other's.
        self.assertEqual(sorted(re.findall(r"rank (\d) done", stdout)), ["0", "1"], stdout)
        warnings = [line for line in stderr.splitlines() if "not recording CUDA allocator events" in line]
        self.assertEqual(len(warnings), 2, stderr[-3000:])  # the guard's one warning, per rank
        files = sorted(p.name for p in (cwd / "ddp" / "oomflight").glob("*.h5"))
        self.assertEqual(files, ["signal.4.h5"])  # batch 4: marked by step 3's optimizer step
        with h5py.File(cwd / "ddp" / "oomflight" / files[0], "r") as f:
            self.assertEqual(f.attrs["kind"].decode() if isinstance(f.attrs["kind"], bytes) else f.attrs["kind"],
                             "signal")
            self.assertEqual([int(r) for r in f["ranks"]["rank"]], [0, 1])
            batches = f["batches"][()]
            for rank in (0, 1):
                rows = [int(b["batch"]) for b in batches if int(b["rank"]) == rank]
                self.assertEqual(rows, [0, 1, 2, 3, 4], f"rank {rank}")
            events = f["events"][()]
            self.assertEqual([int(e["batch"]) for e in events if int(e["action"]) == 9], [0, 1, 2, 3, 4] * 2)

    def test_a_failing_exit_status_reaches_mpirun(self):
        cwd, rc, stdout, stderr = self.job(3, 29567)
        self.assertEqual(rc, 3, stderr[-4000:])
        self.assertEqual(len(list((cwd / "ddp" / "oomflight").glob("signal.*.h5"))), 1)


if __name__ == "__main__":
    unittest.main()
