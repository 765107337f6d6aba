"""SIGUSR1 to one rank of a running 4-rank job: every rank dumps into one archive of kind "signal", and training
goes on to its normal end. And with OOMFLIGHT_DUMP_ON_EXIT=1, SIGTERM to every rank (as a scheduler tears a job
down): one archive of kind "exit" of all ranks, then every rank ends by SIGTERM, within the dump's bound. The archive's per-batch table is checked against the trace: every step of the replay
is the same trace, so every ended batch of every rank has the same alloc count and the same own peak, the peak
the replay itself reports.

Usage: signal_dump.py OOMFLIGHT_CLI
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

import h5py

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from fixtures import DEVICE_MEMORY, OWN_SNAPSHOT, SMALL_DEVICE_MEMORY  # noqa: E402  (tests/support)
from rank_processes import replay_pid  # noqa: E402
CLI = os.path.abspath(sys.argv[1])
TRACE = OWN_SNAPSHOT  # the demo's step (tests/support/fixtures.py)
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("OOMFLIGHT_")},
       "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
SIGUSR1_BIT = 1 << (signal.SIGUSR1 - 1)
SIGTERM_BIT = 1 << (signal.SIGTERM - 1)


def catches(pid: int, bit: int = SIGUSR1_BIT) -> bool:
    """Whether the process has a handler for the signal (oomflight's session has started): /proc's SigCgt mask."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.M)
    return bool(mask) and (int(mask.group(1), 16) & bit) != 0


def catches_sigusr1(pid: int) -> bool:
    return catches(pid, SIGUSR1_BIT)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (/proc/PID/stat): how far it got, whatever the machine's load."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class SignalDump(unittest.TestCase):
    def test_sigusr1_to_one_rank_dumps_every_rank_and_training_goes_on(self):
        work = Path(tempfile.mkdtemp(prefix="oomflight-signal-"))
        cmd = ["mpirun", "--oversubscribe", "-np", "4", CLI, "run", "--run-name", "sig", "--", CLI, "replay", TRACE,
               "--device-memory", DEVICE_MEMORY, "--steps", "20000"]
        proc = subprocess.Popen(cmd, cwd=work, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        # Rank 1, once its session is up (before that, SIGUSR1's default action would kill it).
        deadline = time.monotonic() + 60
        pid = None
        while time.monotonic() < deadline and not (pid and catches_sigusr1(pid)):
            pid = replay_pid(1, work)
            time.sleep(0.01)
        self.assertTrue(pid and catches_sigusr1(pid), "rank 1 never installed its SIGUSR1 handler")
        # Into the training loop: reading the 0.75 MB trace takes about 0.05 s of CPU, a step about 0.2 ms (20,000
        # steps: about 4 s of CPU a rank, so that the burst below lands well before the job's end; with 5,000 steps
        # and a 1 s mark the burst met a rank that had just ended, on a fast run).
        while time.monotonic() < deadline and cpu_seconds(pid) < 0.5:
            time.sleep(0.01)
        # A burst, as a script in a loop sends it: one dump (OOMFLIGHT_SIGNAL_DUMP_INTERVAL, 10 s by default).
        for _ in range(30):
            os.kill(pid, signal.SIGUSR1)
            time.sleep(0.01)
        out, _ = proc.communicate(timeout=300)
        self.assertEqual(proc.returncode, 0, out)
        for rank in range(4):
            self.assertIn(f"rank {rank}: replayed 20000 step(s)", out, "training must go on after the dump")
        self.assertIn("oomflight[rank 1] info: rank 1 asked for a signal dump at batch", out)
        self.assertEqual(out.count("asked for a signal dump at batch"), 2, out)  # its start and its end, once
        skipped = [line for line in out.splitlines() if "skipped (OOMFLIGHT_SIGNAL_DUMP_INTERVAL=10.000 s)" in line]
        self.assertEqual(len(skipped), 1, out)  # said once per burst, not once per signal
        archives = sorted((work / "sig" / "oomflight").glob("*.h5"))
        self.assertEqual(len(archives), 1, f"{archives}\n{out}")
        self.assertRegex(archives[0].name, r"^signal\.\d+\.h5$")
        peak = re.search(r"rank 0: replayed 20000 step\(s\) of .*: peak reserved [\d.]+ GiB of 8.00 GiB, "
                         r"peak allocated ([\d.]+) GiB", out)
        self.assertTrue(peak, out)
        with h5py.File(archives[0], "r") as f:
            self.assertEqual(f.attrs["kind"], b"signal")
            self.assertEqual(list(f.attrs["origin_ranks"]), [1])
            self.assertEqual(list(f.attrs["ranks_present"]), [0, 1, 2, 3])
            self.assertEqual(f.attrs["reason"], b"rank 1: SIGUSR1 received")
            batches = f["batches"][...]
            ranks = f["ranks"][...]
        counts = set()
        for row in ranks:
            rank = int(row["rank"])
            mine = batches[batches["rank"] == rank]
            self.assertGreater(len(mine), 2, f"rank {rank} has {len(mine)} batch rows")
            self.assertEqual(list(mine["batch"]), list(range(int(mine["batch"][0]), int(mine["batch"][-1]) + 1)))
            self.assertEqual(int(mine["batch"][-1]), int(row["batch"]), "the last row is the running batch")
            self.assertEqual(int(mine["end_t_ns"][-1]), 0)
            ended = mine[1:-1]  # the first kept batch may have started before the session saw a full step
            self.assertTrue((ended["end_t_ns"] > ended["start_t_ns"]).all())
            counts.update(int(n) for n in ended["alloc_events"])
            for own_peak in ended["peak_allocated_bytes"]:
                self.assertAlmostEqual(own_peak / 2**30, float(peak.group(1)), delta=0.006)
            self.assertTrue((ended["oom_events"] == 0).all())
        self.assertEqual(len(counts), 1, f"every step replays the same trace: alloc counts {counts}")
        self.assertGreater(counts.pop(), 1000)

    def test_sigterm_with_dump_on_exit_writes_every_rank_then_ends_the_job(self):
        work = Path(tempfile.mkdtemp(prefix="oomflight-exit-"))
        cmd = ["mpirun", "--oversubscribe", "-np", "4", "-x", "OOMFLIGHT_DUMP_ON_EXIT=1", "-x",
               "OOMFLIGHT_DUMP_TIMEOUT=5s", CLI, "run", "--run-name", "exit", "--", CLI, "replay", TRACE,
               "--device-memory", DEVICE_MEMORY, "--steps", "100000"]
        proc = subprocess.Popen(cmd, cwd=work, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        deadline = time.monotonic() + 60
        pids = []
        while time.monotonic() < deadline and not (len(pids) == 4 and all(catches(p, SIGTERM_BIT) for p in pids)):
            pids = [p for p in (replay_pid(r, work) for r in range(4)) if p]
            time.sleep(0.01)
        self.assertEqual(len(pids), 4, "the four ranks never installed their SIGTERM handler")
        while time.monotonic() < deadline and cpu_seconds(pids[0]) < 1.0:
            time.sleep(0.01)
        sent = time.monotonic()
        for pid in pids:  # as a scheduler does: every rank at once
            os.kill(pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        took = time.monotonic() - sent
        self.assertLess(took, 3 * 5 + 20, f"the job outlived the dump's bound:\n{out}")
        self.assertNotEqual(proc.returncode, 0, out)
        self.assertIn("exited on signal 15 (Terminated)", out)
        self.assertIn("writing the history of every rank: SIGTERM received", out)
        archives = sorted((work / "exit" / "oomflight").glob("*.h5"))
        self.assertEqual(len(archives), 1, f"{archives}\n{out}")
        self.assertRegex(archives[0].name, r"^exit\.\d+\.h5$")
        with h5py.File(archives[0], "r") as f:
            self.assertEqual(f.attrs["kind"], b"exit")
            self.assertEqual(list(f.attrs["ranks_present"]), [0, 1, 2, 3])
            self.assertTrue(set(f.attrs["origin_ranks"]) <= {0, 1, 2, 3} and len(f.attrs["origin_ranks"]) >= 1)
            self.assertTrue((f["ranks"]["event_count"] > 0).all())

    def test_without_dump_on_exit_sigterm_is_left_alone(self):
        work = Path(tempfile.mkdtemp(prefix="oomflight-noexit-"))
        cmd = ["mpirun", "--oversubscribe", "-np", "2", CLI, "run", "--run-name", "plain", "--", CLI, "replay", TRACE,
               "--device-memory", DEVICE_MEMORY, "--steps", "100000"]
        proc = subprocess.Popen(cmd, cwd=work, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        deadline = time.monotonic() + 60
        pid = None
        while time.monotonic() < deadline and not (pid and catches_sigusr1(pid)):
            pid = replay_pid(0, work)
            time.sleep(0.01)
        self.assertTrue(pid and catches_sigusr1(pid), "the session never started")
        self.assertFalse(catches(pid, SIGTERM_BIT), "oomflight must not catch SIGTERM unless asked to")
        proc.kill()
        proc.communicate()
        subprocess.run(["pkill", "-KILL", "-f", f"replay {TRACE}"], check=False)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
