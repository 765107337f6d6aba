"""Interval-scoped snapshots under real mpirun: 4 ranks replay the full-step transformer trace for 6 batches.

- OOMFLIGHT_SKIP_BATCHES=1 OOMFLIGHT_INTERVAL=3ba: exactly one archive, kind snapshot, window 1..3, every rank;
  for every rank, the events of batches 1 to 3 and nothing later, and before them only the allocator state at
  the window's start (allocs and segment allocs of batches -1 and 0 still live then); the per-batch table.
- Retention: a window every batch with OOMFLIGHT_MAX_DUMPS=2 leaves the newest two (batches 4 and 5); with
  OOMFLIGHT_MAX_TOTAL_MB=1 only the newest; a foreign file in the folder is never touched.
- OOMFLIGHT_SKIP_BATCHES=0 OOMFLIGHT_SNAPSHOT_EVERY=2ba: three archives, windows 0-1, 2-3 and 4-5 (the last one
  closed by the job's normal end). Batch 0 is the trace itself: as many events as the pickle's device trace,
  event for event (action and size); batches 1, 2 and 3 match the first run's, event for event.

- A rank stopped (SIGSTOP) while a snapshot is written: the others give up at the deadline, snapshots end for
  the job, no partial file stays, and the job itself runs to its end.
- Windows faster than writes (600 one-batch windows, the replay unpaced): no rank's memory grows past 1 GiB (a
  pending window used to keep a ring copy each: 4.2 GiB per rank after 1,500 batches); windows are skipped by every
  rank alike and counted: each archive's `snapshot_windows_skipped` and rank 0's log account for every window.

It replays PyTorch's shared full-step snapshot (a 0.6 s step, 19,342 entries: the windows, the pacing and the
retention sizes above are its); without ../shared it exits 77, which ctest reports as skipped, naming what is missing.

Usage: snapshots.py OOMFLIGHT_CLI SNAPSHOT_DIR
"""
import os
import pickle
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import h5py

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from fixtures import need  # noqa: E402  (tests/support)
from rank_processes import replay_pid  # noqa: E402

CLI, SNAPSHOTS = os.path.abspath(sys.argv[1]), sys.argv[2]
TRACE = os.path.join(SNAPSHOTS, "transformer-lm-fullstep-ctx128.pickle")
need(TRACE, "a third-party PyTorch snapshot", "torch-snapshots")
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("OOMFLIGHT_")},
       "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "oom", "snapshot", "step"]


def run(work: Path, run_name: str, settings: dict) -> str:
    (work / run_name / "oomflight").mkdir(parents=True, exist_ok=True)
    (work / run_name / "oomflight" / "notes.h5").write_text("not an archive: retention must leave it alone")
    cmd = ["mpirun", "--oversubscribe", "-np", "4"]
    for k, v in settings.items():
        cmd += ["-x", f"{k}={v}"]
    # Paced (a step lasts as long as the trace's, 0.6 s): each window is written before the next closes, so none is
    # skipped (a rank keeps at most 2 windows waiting; test_windows_faster_than_writes covers the skips).
    cmd += [CLI, "run", "--run-name", run_name, "--", CLI, "replay", TRACE, "--device-memory", "64GiB", "--steps", "6",
            "--pace"]
    r = subprocess.run(cmd, cwd=work, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


def events(path: Path) -> dict:
    """rank -> list of (batch, action, addr, size)."""
    out = {}
    with h5py.File(path, "r") as f:
        ev = f["events"][...]
        for row in f["ranks"][...]:
            e = ev[int(row["event_offset"]):int(row["event_offset"]) + int(row["event_count"])]
            out[int(row["rank"])] = list(zip(e["batch"].tolist(), e["action"].tolist(), e["addr"].tolist(),
                                             e["size"].tolist()))
    return out


def of_batch(rows: list, batch: int) -> list:
    return [(a, addr, size) for b, a, addr, size in rows if b == batch]


class Snapshots(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = Path(tempfile.mkdtemp(prefix="oomflight-snapshots-"))
        cls.out_once = run(cls.work, "once", {"OOMFLIGHT_SKIP_BATCHES": "1", "OOMFLIGHT_INTERVAL": "3ba"})
        cls.out_every = run(cls.work, "every", {"OOMFLIGHT_SKIP_BATCHES": "0", "OOMFLIGHT_SNAPSHOT_EVERY": "2ba"})
        cls.out_count = run(cls.work, "count", {"OOMFLIGHT_SKIP_BATCHES": "0", "OOMFLIGHT_SNAPSHOT_EVERY": "1ba",
                                                "OOMFLIGHT_MAX_DUMPS": "2"})
        cls.out_size = run(cls.work, "size", {"OOMFLIGHT_SKIP_BATCHES": "0", "OOMFLIGHT_SNAPSHOT_EVERY": "1ba",
                                              "OOMFLIGHT_MAX_TOTAL_MB": "1"})
        with open(TRACE, "rb") as f:
            cls.trace = pickle.load(f)["device_traces"][0]

    def test_a_rank_stalled_during_a_snapshot_write_ends_snapshots_not_the_job(self):
        """Rank 1 stops (SIGSTOP) once the first window's archive is laid out, and continues 3 timeouts later. The
        other ranks give up on that snapshot at the deadline, say that no more snapshots are taken, and remove its
        partial file; the job runs to its end (its own steps waited for rank 1, as any job's would) and exits 0."""
        import signal
        import time
        run_name = "stalled"
        folder = self.work / run_name / "oomflight"
        folder.mkdir(parents=True, exist_ok=True)
        cmd = ["mpirun", "--oversubscribe", "-np", "4", "-x", "OOMFLIGHT_SKIP_BATCHES=0", "-x",
               "OOMFLIGHT_SNAPSHOT_EVERY=1ba", "-x", "OOMFLIGHT_DUMP_TIMEOUT=1s", CLI, "run", "--run-name", run_name,
               "--", CLI, "replay", TRACE, "--device-memory", "64GiB", "--steps", "6"]
        proc = subprocess.Popen(cmd, cwd=self.work, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        pid, stopped = None, False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            pid = pid or replay_pid(1, self.work)
            if pid and any(folder.glob("*.partial")):
                os.kill(pid, signal.SIGSTOP)
                stopped = True
                break
            time.sleep(0.0005)
        if stopped:
            time.sleep(3)
            os.kill(pid, signal.SIGCONT)
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out = proc.communicate()[0] + "\n[killed by the test after 120 s]"
        if not stopped:
            self.skipTest("the first snapshot was written before rank 1 could be stopped")
        self.assertEqual(proc.returncode, 0, out)
        self.assertIn("no more snapshots in this job", out)
        self.assertIn("not every rank reached", out)
        self.assertEqual(list(folder.glob("*.partial")), [], out)
        for archive in folder.glob("snapshot.*.h5"):  # whatever was written before the stall is complete
            with h5py.File(archive, "r") as f:
                self.assertEqual(int(f.attrs["complete"]), 1)
                self.assertEqual(sorted(int(r) for r in f["ranks"]["rank"]), [0, 1, 2, 3])

    def test_one_window_skip_1_interval_3(self):
        folder = self.work / "once" / "oomflight"
        self.assertEqual(sorted(p.name for p in folder.iterdir()), ["notes.h5", "snapshot.1.h5"], self.out_once)
        path = folder / "snapshot.1.h5"
        with h5py.File(path, "r") as f:
            self.assertEqual(f.attrs["kind"], b"snapshot")
            self.assertEqual((int(f.attrs["window_first_batch"]), int(f.attrs["window_last_batch"])), (1, 3))
            self.assertEqual(list(f.attrs["ranks_present"]), [0, 1, 2, 3])
            self.assertEqual(list(f.attrs["origin_ranks"]), [])
            batches = f["batches"][...]
        got = events(path)
        self.assertEqual(sorted(got), [0, 1, 2, 3])
        for rank, rows in got.items():
            # -1: the blocks that predate the trace, recorded before the first batch and still live.
            self.assertEqual(sorted({b for b, *_ in rows}), [-1, 0, 1, 2, 3], f"rank {rank}: batches")
            # Before the window: only the state at its start, allocs and segment allocs still live then.
            before = [r for r in rows if r[0] < 1]
            self.assertTrue(before, f"rank {rank}: no state at the window's start")
            self.assertEqual({ACTIONS[a] for _, a, _, _ in before} - {"alloc", "segment_alloc"}, set())
            freed_in_batch_0 = {addr for b, a, addr, _ in rows if b < 1 and ACTIONS[a] == "free_completed"}
            self.assertFalse(freed_in_batch_0)
            # The window: three identical replays of the trace, each opened by its step event.
            one = of_batch(rows, 1)
            self.assertEqual(ACTIONS[one[0][0]], "step")
            self.assertEqual(one, of_batch(rows, 2))
            self.assertEqual(one, of_batch(rows, 3))
            # Frozen when batch 4 started, which ended the window: batches 0 to 3 ended, 4 running.
            mine = batches[batches["rank"] == rank]
            self.assertEqual(list(mine["batch"]), [0, 1, 2, 3, 4])
            self.assertEqual(list(mine["end_t_ns"] > 0), [True, True, True, True, False])
            self.assertEqual(len(set(mine["alloc_events"][1:4].tolist())), 1, "batches 1 to 3 replay the same")

    def test_every_2_batches_gives_three_windows_and_matches_the_trace(self):
        folder = self.work / "every" / "oomflight"
        self.assertEqual(sorted(p.name for p in folder.iterdir()),
                         ["notes.h5", "snapshot.0.h5", "snapshot.2.h5", "snapshot.4.h5"], self.out_every)
        windows = {}
        for name, window in (("snapshot.0.h5", (0, 1)), ("snapshot.2.h5", (2, 3)), ("snapshot.4.h5", (4, 5))):
            with h5py.File(folder / name, "r") as f:
                self.assertEqual((int(f.attrs["window_first_batch"]), int(f.attrs["window_last_batch"])), window)
            windows[window] = events(folder / name)
        once = events(self.work / "once" / "oomflight" / "snapshot.1.h5")
        expected = [(e["action"], e["size"]) for e in self.trace if e["action"] in ACTIONS]
        for rank in range(4):
            batch0 = of_batch(windows[(0, 1)][rank], 0)
            self.assertEqual(ACTIONS[batch0[0][0]], "step")
            # Batch 0 is the trace replayed on a fresh device: the pickle's entries, event for event.
            self.assertEqual([(ACTIONS[a], size) for a, _, size in batch0[1:]], expected, f"rank {rank}")
            # Two runs, the same batches: the same events.
            self.assertEqual(of_batch(windows[(0, 1)][rank], 1), of_batch(once[rank], 1))
            self.assertEqual(of_batch(windows[(2, 3)][rank], 2), of_batch(once[rank], 2))
            self.assertEqual(of_batch(windows[(2, 3)][rank], 3), of_batch(once[rank], 3))
            self.assertEqual(sorted({b for b, *_ in windows[(4, 5)][rank]} - {-1, 3}), [4, 5])


    def test_retention_keeps_the_newest_by_count_and_by_size(self):
        names = sorted(p.name for p in (self.work / "count" / "oomflight").iterdir())
        self.assertEqual(names, ["notes.h5", "snapshot.4.h5", "snapshot.5.h5"], self.out_count)
        self.assertEqual(self.out_count.count("retention: removed"), 4, self.out_count)
        self.assertIn("(OOMFLIGHT_MAX_DUMPS=2; 2 archives of this job", self.out_count)
        # Each archive is bigger than 1 MB: only the one just written may stay, every time.
        names = sorted(p.name for p in (self.work / "size" / "oomflight").iterdir())
        self.assertEqual(names, ["notes.h5", "snapshot.5.h5"], self.out_size)
        self.assertIn("(OOMFLIGHT_MAX_TOTAL_MB=1; 1 archives of this job", self.out_size)


class SignalBetweenWrites(unittest.TestCase):
    def test_a_signal_dump_between_two_writes_leaves_the_snapshots_going(self):
        """SIGUSR1 to rank 3 in the middle of a paced run with a window every batch: one signal archive of every
        rank, and the snapshots go on to the end. (A signal that lands during a write, about 1 time in 30 here,
        ends them instead: the write yields to the dump, docs/protocol.md; then the log says so.)"""
        import signal
        import time
        work = Path(tempfile.mkdtemp(prefix="oomflight-snapshots-signal-"))
        self.addCleanup(__import__("shutil").rmtree, work, True)
        cmd = ["mpirun", "--oversubscribe", "-np", "4", "-x", "OOMFLIGHT_SKIP_BATCHES=0", "-x",
               "OOMFLIGHT_SNAPSHOT_EVERY=1ba", CLI, "run", "--run-name", "sig", "--", CLI, "replay", TRACE,
               "--device-memory", "64GiB", "--steps", "8", "--pace"]
        proc = subprocess.Popen(cmd, cwd=work, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        folder = work / "sig" / "oomflight"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (folder / "snapshot.2.h5").exists():
            time.sleep(0.02)
        pid = replay_pid(3, work)
        self.assertIsNotNone(pid)
        os.kill(pid, signal.SIGUSR1)
        out, _ = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 0, out)
        names = sorted(p.name for p in folder.iterdir())
        signals = [n for n in names if n.startswith("signal.")]
        self.assertEqual(len(signals), 1, names)
        with h5py.File(folder / signals[0], "r") as f:
            self.assertEqual(list(f.attrs["ranks_present"]), [0, 1, 2, 3])
            self.assertEqual(list(f.attrs["origin_ranks"]), [3])
        snapshots = sorted(int(n.split(".")[1]) for n in names if n.startswith("snapshot."))
        if "no more snapshots in this job" in out:
            self.assertIn("abandoned: a dump", out)
            self.assertEqual(snapshots, list(range(len(snapshots))))
        else:
            self.assertEqual(snapshots, list(range(8)), out)


class FasterThanWrites(unittest.TestCase):
    WINDOWS = 600

    def test_windows_faster_than_writes_are_skipped_and_counted_within_bounded_memory(self):
        work = Path(tempfile.mkdtemp(prefix="oomflight-snapshots-fast-"))
        self.addCleanup(__import__("shutil").rmtree, work, True)
        # Each rank runs under a Python parent that writes its peak resident memory (ru_maxrss of its children, KiB)
        # to a file of its own (mpirun's merged stdout may join lines).
        peak = ("import os, resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
                "open('peak.' + os.environ['OMPI_COMM_WORLD_RANK'], 'w').write("
                "str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); sys.exit(r.returncode)")
        cmd = ["mpirun", "--oversubscribe", "-np", "4", "-x", "OOMFLIGHT_SKIP_BATCHES=0",
               "-x", "OOMFLIGHT_SNAPSHOT_EVERY=1ba", "-x", "OOMFLIGHT_MAX_DUMPS=3", sys.executable, "-c", peak,
               CLI, "run", "--run-name", "fast", "--", CLI, "replay", TRACE, "--device-memory", "64GiB",
               "--steps", str(self.WINDOWS)]
        r = subprocess.run(cmd, cwd=work, env=ENV, capture_output=True, text=True, timeout=400)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        peaks = [int((work / f"peak.{rank}").read_text()) for rank in range(4)]
        self.assertEqual(len(peaks), 4, out)
        self.assertLess(max(peaks), 1 << 20, f"a rank's peak RSS reached {max(peaks)} KiB")
        # Every window is written or skipped, and rank 0's lines account for each: a written window follows the
        # previous one after exactly the windows it says were skipped.
        written = [(int(m.group(1)), int(m.group(2) or 0)) for m in re.finditer(
            r"snapshot of batches (\d+) to \1: archive \S+ written by 4 ranks in [\d.]+ m?s(?: \((\d+) earlier windows? "
            r"skipped)?", out)]
        self.assertGreater(len(written), 1, out)
        previous = -1
        for window, skipped in written:
            self.assertEqual(window, previous + 1 + skipped, f"window {window} after {previous}: {skipped} skipped\n{out[-5000:]}")
            previous = window
        last = re.search(r"the last (\d+) snapshot windows? w[a-z]+ skipped \((\d+) in all", out)
        trailing = int(last.group(1)) if last else 0
        self.assertEqual(previous + 1 + trailing, self.WINDOWS, out[-3000:])
        skipped_in_all = sum(s for _, s in written) + trailing
        self.assertGreater(skipped_in_all, 0, "the replay unpaced should outrun the writes on this machine")
        if last:
            self.assertEqual(int(last.group(2)), skipped_in_all)
        # The archives kept (retention: the newest 3) say the same as the log.
        said = dict(written)
        folder = work / "fast" / "oomflight"
        kept = sorted(folder.glob("snapshot.*.h5"))
        self.assertEqual(len(kept), 3)
        for path in kept:
            with h5py.File(path, "r") as f:
                window = int(f.attrs["window_first_batch"])
                got = int(f.attrs["snapshot_windows_skipped"]) if "snapshot_windows_skipped" in f.attrs else 0
                self.assertEqual(got, said[window], path.name)
                self.assertEqual(sorted(f["ranks"]["rank"].tolist()), [0, 1, 2, 3])
        # The report, text and page, says it for an archive that follows skipped windows.
        with_skips = [p for p in kept if said[int(p.name.split(".")[1])] > 0] or kept[-1:]
        page = work / "report.html"
        report = subprocess.run([CLI, "report", str(with_skips[0]), "--html", str(page)], capture_output=True,
                                text=True)
        self.assertEqual(report.returncode, 0, report.stderr)
        skipped_here = said[int(with_skips[0].name.split(".")[1])]
        if skipped_here > 0:
            self.assertIn(f"skipped: {skipped_here} earlier snapshot window", report.stdout)
            self.assertIn(f"<dt>skipped</dt><dd>{skipped_here} earlier snapshot window", page.read_text())


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
