"""The package under real mpirun: every rank initialises through Python, records a known number of events, and
one rank's trigger_oom leaves ONE archive of all ranks, read back with h5py."""
import textwrap
import unittest

from support import PY, archives, child_env, read_archive, run, scratch

JOB = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import oomflight
    oomflight.init(run_name="pympi", folder="out", dump_timeout="20s")
    rank, size = oomflight.rank()
    origin = int(sys.argv[1])
    oomflight.mark_batch(5)
    for i in range(100 * (rank + 1)):
        oomflight.record("alloc", rank % 8, 0x10000 * i, 4096, stream=rank)
    Path(f"ready.{rank}").touch()
    # Every rank's history is recorded before the trigger (a file barrier: the job has no MPI of its own).
    while len(list(Path(".").glob("ready.*"))) < size:
        time.sleep(0.01)
    if rank == origin:
        result = oomflight.trigger_oom(rank % 8, "CUDA out of memory. Tried to allocate 2.00 GiB", 2 << 30, 1 << 20)
        print(f"rank {rank}: {result.status} {result.ranks_written}/{result.world_size} {result.path}", flush=True)
        raise SystemExit("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    time.sleep(120)  # blocked "in a collective" until mpirun tears the job down
""")


class OneArchiveOfAllRanks(unittest.TestCase):
    def job(self, ranks: int, origin: int):
        cwd = scratch()
        (cwd / "job.py").write_text(JOB)
        out = run(["mpirun", "--oversubscribe", "-np", str(ranks), PY, "job.py", str(origin)], cwd, child_env())
        self.assertNotEqual(out.returncode, 0, "the origin's error must end the job")
        self.assertIn(f"rank {origin}: archive {ranks}/{ranks}", out.stdout, out.stdout + out.stderr)
        self.assertIn("torch.OutOfMemoryError: CUDA out of memory", out.stderr)
        files = archives(cwd / "out")
        self.assertEqual(len(files), 1, files)
        self.assertEqual(files[0].name, "oom.5.h5")
        a = read_archive(files[0])
        self.assertEqual(a["attrs"]["world_size"], ranks)
        self.assertEqual(list(a["attrs"]["ranks_present"]), list(range(ranks)))
        self.assertEqual(list(a["attrs"]["origin_ranks"]), [origin])
        rows = sorted(a["ranks"], key=lambda r: r["rank"])
        for row in rows:
            r = int(row["rank"])
            # the step event, 100 * (rank + 1) allocs, and the origin's oom event
            expected = 1 + 100 * (r + 1) + (1 if r == origin else 0)
            self.assertEqual(int(row["event_count"]), expected, f"rank {r}")
            self.assertEqual(int(row["is_origin"]), 1 if r == origin else 0)
            self.assertEqual(int(row["batch"]), 5)
            mine = a["events"][int(row["event_offset"]):int(row["event_offset"]) + expected]
            self.assertTrue(all(mine["stream"][1:101] == r), f"rank {r}'s events are its own")
        self.assertEqual(int(rows[origin]["oom_requested_bytes"]), 2 << 30)

    def test_two_ranks(self):
        self.job(2, 1)

    def test_four_ranks(self):
        self.job(4, 2)


if __name__ == "__main__":
    unittest.main()
