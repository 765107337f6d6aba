"""Jobs started by Slurm, as most clusters start them: the demo under `srun -n 4 --mpi=pmix` (Open MPI's ranks
started directly by Slurm through PMIx, no mpirun) gives one archive of 4 ranks, origin 2, whose report names the
ranks waiting in the all-reduce rank 2 never entered; and {host} and {local_rank} in a rank-local file name give the
same names under srun and under mpirun. Needs the one-node cluster of scripts/slurm/start.sh (bootstrap.sh starts
it); without one the test fails, naming the script.

Usage: slurm_launch.py OOMFLIGHT_CLI
"""
import os
import socket
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import h5py

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from fixtures import DEVICE_MEMORY, OWN_SNAPSHOT, SMALL_DEVICE_MEMORY  # noqa: E402  (tests/support)
CLI = os.path.abspath(sys.argv[1])
TRACE = OWN_SNAPSHOT  # the demo's step (tests/support/fixtures.py)
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith(("OOMFLIGHT_", "OMPI_", "PMIX_", "SLURM_"))},
       "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       # Every rank keeps its rank-local file, named with its host and its rank on that host.
       "OOMFLIGHT_KEEP_RANK_FILES": "1", "OOMFLIGHT_RANK_FILENAME": "{kind}.{batch}.{host}.local{local_rank}.rank{rank}.h5"}
DEMO = ["replay", TRACE, "--device-memory", DEVICE_MEMORY, "--rank-device-memory", f"2={SMALL_DEVICE_MEMORY}", "--steps", "2", "--pace",
        "--rank-delay", "2=1s", "--rank-delay", "3=1500ms"]
LAUNCHERS = {"srun": ["srun", "-n", "4", "--mpi=pmix"], "mpirun": ["mpirun", "--oversubscribe", "-np", "4"]}


class SlurmLaunch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        r = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30) \
            if subprocess.run(["which", "sinfo"], capture_output=True).returncode == 0 else None
        if r is None or r.returncode != 0 or not r.stdout.strip() or "down" in r.stdout:
            raise AssertionError("no Slurm cluster is up here: run scripts/slurm/start.sh (bootstrap.sh does)\n"
                                 + ("" if r is None else r.stdout + r.stderr))

    def run_demo(self, launcher: str) -> Path:
        work = Path(tempfile.mkdtemp(prefix=f"oomflight-{launcher}-"))
        cmd = LAUNCHERS[launcher] + [CLI, "run", "--run-name", "demo", "--", CLI, *DEMO]
        r = subprocess.run(cmd, cwd=work, env=ENV, capture_output=True, text=True, timeout=300)
        out = r.stdout + r.stderr
        self.assertNotEqual(r.returncode, 0, f"{launcher}: rank 2's out-of-memory error must end the job\n{out}")
        self.assertIn("oomflight[rank 2] info: rank 2 out of memory at batch 0", out)
        self.assertIn("written by 4 of 4 ranks", out)
        return work

    def check_archive_and_rank_files(self, launcher: str, work: Path):
        archives = sorted((work / "demo/oomflight").glob("oom.*.h5"))
        rank_files = sorted(p.name for p in (work / "demo/oomflight").glob("*.rank*.h5"))
        host = socket.gethostname().split(".")[0]
        self.assertEqual(rank_files, [f"oom.0.{host}.local{r}.rank{r}.h5" for r in range(4)], launcher)
        archives = [a for a in archives if ".rank" not in a.name]
        self.assertEqual([a.name for a in archives], ["oom.0.h5"], launcher)
        with h5py.File(archives[0], "r") as f:
            self.assertEqual(list(f.attrs["origin_ranks"]), [2])
            self.assertEqual(int(f.attrs["world_size"]), 4)
            rows = sorted((int(r["rank"]), int(r["local_rank"]), r["host"].decode()) for r in f["ranks"][...])
            self.assertEqual(rows, [(r, r, host) for r in range(4)], launcher)
        report = subprocess.run([CLI, "report", str(archives[0])], capture_output=True, text=True, timeout=60)
        self.assertIn("ranks 0, 1 wait in allreduce #0 on the world communicator (4 ranks; 8 B), which rank 2 never "
                      "entered: it ran out of memory in batch 0", report.stdout, launcher)

    def test_the_demo_under_srun(self):
        work = self.run_demo("srun")
        self.check_archive_and_rank_files("srun", work)

    def test_the_same_names_under_mpirun(self):
        work = self.run_demo("mpirun")
        self.check_archive_and_rank_files("mpirun", work)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
