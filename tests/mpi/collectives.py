"""Which collective every rank was in when the job died, from a real 4-rank job under mpirun: the replay records its
MPI_Allreduce after each step on the world communicator. Read with h5py (/collectives, /communicators, the counts in
/ranks), through `oomflight report` (text and HTML) and the Perfetto export.

- A straggler that runs out of memory in batch 0 (rank 2 starts each step 1 s late, rank 3 1.5 s late): ranks 0 and 1
  finished batch 0 and wait in allreduce #0, which rank 2 never entered; rank 3 is still computing.
- A rank that fails in batch 2 after two good steps: every rank finished allreduce #0 and #1 (a start and an end
  each, in order), and the others wait in #2.

Usage: collectives.py OOMFLIGHT_CLI
"""
import json
import os
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
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("OOMFLIGHT_")},
       "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
WORLD = 0x6f6f6d776f726c64  # oomflight_world_communicator()


def run_job(work: Path, *replay_args: str) -> Path:
    cmd = ["mpirun", "--oversubscribe", "-np", "4", CLI, "run", "--run-name", "coll", "--", CLI, "replay", TRACE,
           "--device-memory", DEVICE_MEMORY, "--rank-device-memory", f"2={SMALL_DEVICE_MEMORY}", "--pace", *replay_args]
    r = subprocess.run(cmd, cwd=work, env=ENV, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0, "rank 2's out-of-memory error must end the job:\n" + out
    archives = sorted(work.glob("coll/oomflight/*.h5"))
    assert len(archives) == 1, f"one archive expected, found {archives}:\n{out}"
    return archives[0]


def rows_by_rank(f):
    op_names = {v: k for k, v in h5py.check_enum_dtype(f["collectives"].dtype["op"]).items()}
    by_rank = {r: [] for r in range(4)}
    for row in f["collectives"][...]:
        by_rank[int(row["rank"])].append({"op": op_names[int(row["op"])], "seq": int(row["seq"]),
                                          "phase": int(row["phase"]), "flags": int(row["flags"]),
                                          "count": int(row["count"]), "bytes": int(row["bytes"]),
                                          "datatype": int(row["datatype"]), "peer": int(row["peer"]),
                                          "comm_id": int(row["comm_id"]), "batch": int(row["batch"]),
                                          "t_ns": int(row["t_ns"])})
    return by_rank


class Collectives(unittest.TestCase):
    def check_world(self, f):
        comms = f["communicators"][...]
        self.assertEqual(sorted(int(c["rank"]) for c in comms), [0, 1, 2, 3])
        for c in comms:
            self.assertEqual((c["name"], int(c["comm_size"]), int(c["comm_rank"]), int(c["comm_id"])),
                             (b"world", 4, int(c["rank"]), WORLD))

    def test_a_straggler_fails_while_the_others_wait_in_the_allreduce_it_never_entered(self):
        work = Path(tempfile.mkdtemp(prefix="oomflight-coll-"))
        archive = run_job(work, "--steps", "2", "--rank-delay", "2=1s", "--rank-delay", "3=1500ms")
        with h5py.File(archive, "r") as f:
            self.check_world(f)
            by_rank = rows_by_rank(f)
            ranks = {int(r["rank"]): r for r in f["ranks"][...]}
        # Ranks 0 and 1 entered allreduce #0 (one double, 8 bytes) and were inside it at the freeze: a start, no end.
        for rank in (0, 1):
            self.assertEqual([(r["op"], r["seq"], r["phase"], r["count"], r["bytes"], r["datatype"], r["peer"],
                               r["comm_id"], r["batch"]) for r in by_rank[rank]],
                             [("allreduce", 0, 0, 1, 8, 8, -1, WORLD, 0)], by_rank[rank])
            self.assertLess(by_rank[rank][0]["t_ns"], int(ranks[rank]["freeze_t_ns"]))
            self.assertEqual((int(ranks[rank]["collectives_recorded"]), int(ranks[rank]["collectives_overwritten"]),
                              int(ranks[rank]["collectives_in_flight"])), (1, 0, 0))
        # Rank 2 ran out of memory in batch 0 and rank 3 was still computing it: neither entered a collective.
        for rank in (2, 3):
            self.assertEqual(by_rank[rank], [])
            self.assertEqual(int(ranks[rank]["collectives_recorded"]), 0)
        self.assertEqual(int(ranks[2]["is_origin"]), 1)

        report = subprocess.run([CLI, "report", str(archive), "--html", str(work / "r.html")], capture_output=True,
                                text=True, timeout=60)
        self.assertEqual(report.returncode, 0, report.stderr)
        self.assertIn("ranks 0, 1 wait in allreduce #0 on the world communicator (4 ranks; 8 B), which rank 2 never "
                      "entered: it ran out of memory in batch 0", report.stdout)
        self.assertIn("rank 3 had not reached it yet: still computing batch 0", report.stdout)
        self.assertRegex(report.stdout, r"rank 0: in allreduce #0 \(8 B\), entered in batch 0, [0-9.]+ s before the freeze")
        self.assertIn("rank 2: none recorded (the origin)", report.stdout)
        page = (work / "r.html").read_text()
        self.assertEqual(page.count('class="op in-flight"'), 2)
        self.assertIn('data-rank="0"', page.split('id="chart-collectives"')[1])
        self.assertIn("which rank 2 never entered", page)

        subprocess.run([CLI, "export", str(archive), "--format", "perfetto", "-o", str(work / "t.json")],
                       capture_output=True, text=True, timeout=60, check=True)
        trace = json.loads((work / "t.json").read_text())
        slices = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("tid") == 1]
        self.assertEqual(sorted((e["pid"], e["name"], e["args"]["in_flight_at_freeze"]) for e in slices),
                         [(0, "allreduce #0", True), (1, "allreduce #0", True)])
        self.assertTrue(all(e["dur"] > 0 and e["args"]["communicator"] == "the world communicator" for e in slices))

    def test_after_two_good_steps_every_rank_holds_both_allreduces_and_the_others_wait_in_the_third(self):
        work = Path(tempfile.mkdtemp(prefix="oomflight-coll-"))
        archive = run_job(work, "--steps", "4", "--rank-memory-from-step", "2", "--rank-delay", "2=1s")
        with h5py.File(archive, "r") as f:
            self.check_world(f)
            by_rank = rows_by_rank(f)
        finished = [("allreduce", 0, 0, 0), ("allreduce", 0, 1, 0), ("allreduce", 1, 0, 1), ("allreduce", 1, 1, 1)]
        for rank in range(4):
            got = [(r["op"], r["seq"], r["phase"], r["batch"]) for r in by_rank[rank]]
            # A blocking MPI call's end is its return: no device flag.
            self.assertTrue(all(r["flags"] == 0 for r in by_rank[rank]))
            times = [r["t_ns"] for r in by_rank[rank]]
            self.assertEqual(times, sorted(times))
            if rank == 2:
                self.assertEqual(got, finished)
            else:
                self.assertEqual(got, finished + [("allreduce", 2, 0, 2)])
        report = subprocess.run([CLI, "report", str(archive)], capture_output=True, text=True, timeout=60)
        self.assertIn("ranks 0, 1, 3 wait in allreduce #2 on the world communicator (4 ranks; 8 B), which rank 2 "
                      "never entered: it ran out of memory in batch 2", report.stdout)
        self.assertRegex(report.stdout, r"rank 2: in none; last finished allreduce #1 \(8 B\) in batch 1, [0-9.]+ s "
                                        r"before the freeze \(the origin\)")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
