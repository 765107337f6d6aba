"""The package under real mpirun: every rank initialises through Python, records a known number of events, and
one rank's trigger_oom leaves ONE archive of all ranks, read back with h5py."""
import re
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


SNAPSHOT_THEN_OOM = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import oomflight
    oomflight.init(run_name="both", folder="out", dump_timeout="20s", skip_batches=1, interval="2ba")
    rank, size = oomflight.rank()
    for batch in range(5):
        oomflight.mark_batch(batch)
        for i in range(10 * (batch + 1)):
            oomflight.record("alloc", 0, (batch << 20) + 0x1000 * i, 512 * (rank + 1))
        if batch == 3:  # batch 3 ended the window 1-2: wait for its archive, written by the watchers meanwhile
            while not Path("out/snapshot.1.h5").exists():
                time.sleep(0.01)
    if rank == 1:
        oomflight.trigger_oom(0, "CUDA out of memory. Tried to allocate 1.00 GiB", 1 << 30, 0)
        raise SystemExit("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB")
    time.sleep(120)
""")


class SnapshotAndOom(unittest.TestCase):
    def test_a_snapshot_window_and_an_oom_in_one_run_give_both_archives(self):
        cwd = scratch()
        (cwd / "job.py").write_text(SNAPSHOT_THEN_OOM)
        out = run(["mpirun", "--oversubscribe", "-np", "2", PY, "job.py"], cwd, child_env())
        self.assertIn("torch.OutOfMemoryError", out.stderr)
        self.assertEqual([p.name for p in archives(cwd / "out")], ["oom.4.h5", "snapshot.1.h5"],
                         out.stdout + out.stderr)
        snap = read_archive(cwd / "out" / "snapshot.1.h5")
        self.assertEqual(snap["attrs"]["kind"], "snapshot")
        self.assertEqual((snap["attrs"]["window_first_batch"], snap["attrs"]["window_last_batch"]), (1, 2))
        for row in snap["ranks"]:
            mine = snap["events"][int(row["event_offset"]):int(row["event_offset"]) + int(row["event_count"])]
            window = mine[mine["batch"] >= 1]
            # batch 0's 10 allocs are never freed: the state at the window's start; then batches 1 and 2
            self.assertEqual(len(mine[mine["batch"] == 0]), 10)
            self.assertEqual(sorted(set(window["batch"].tolist())), [1, 2])
            self.assertEqual(len(window), (1 + 20) + (1 + 30), "each batch's step event and allocs")
            self.assertTrue(all(window["size"][window["action"] == 0] == 512 * (int(row["rank"]) + 1)))
        oom = read_archive(cwd / "out" / "oom.4.h5")
        self.assertEqual(oom["attrs"]["kind"], "oom")
        self.assertEqual(list(oom["attrs"]["origin_ranks"]), [1])
        self.assertEqual(list(oom["attrs"]["ranks_present"]), [0, 1])
        self.assertEqual(oom["attrs"]["complete"], 1)


NORMAL_EXIT = textwrap.dedent("""
    import oomflight
    oomflight.init(run_name="plain", folder="out")
    rank, size = oomflight.rank()
    oomflight.mark_batch(0)
    oomflight.record("alloc", 0, 0x1000, 4096)
    print(f"rank {rank} of {size} done", flush=True)
    # no oomflight.shutdown(): the script just ends
""")


class NormalExit(unittest.TestCase):
    def test_a_script_that_never_calls_shutdown_ends_cleanly_under_mpirun(self):
        cwd = scratch()
        (cwd / "job.py").write_text(NORMAL_EXIT)
        out = run(["mpirun", "--oversubscribe", "-np", "2", PY, "job.py"], cwd, child_env())
        text = out.stdout + out.stderr
        self.assertEqual(out.returncode, 0, text)
        # mpirun forwards both ranks' stdout into one stream: lines may run together
        self.assertEqual(sorted(re.findall(r"rank (\d) of 2 done", out.stdout)), ["0", "1"], text)
        self.assertNotIn("exited improperly", text)
        self.assertNotIn("finalize", text.lower())


if __name__ == "__main__":
    unittest.main()
