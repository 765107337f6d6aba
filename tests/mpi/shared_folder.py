"""Two jobs, one run name, one folder (issue 30): two real mpirun jobs of 2 ranks each run at once, both named
"shared", both writing into the same folder with OOMFLIGHT_MAX_DUMPS=3, and each asks for 15 signal dumps of its
two ranks, each dump's reason naming the job and the dump. Before (as issue 30 measured it), each job's retention
removed the other's archives (27 removed), and for every dump both jobs were told "archive .../signal.N.h5 written"
for the same path, so one job's path held the other's dump. Run here against 6ba6ec2 (the code before the fix), the
two jobs' NAME.partial was one file as well: 2 of alpha's 15 dumps in one run, 8 in another, failed and fell back to
rank-local files.

What must hold: every path a job was told holds (when it is still there) that job's own dump, its reason and its
job_id; no path was told to both jobs; retention removed only a job's own archives, so each job keeps exactly its
3 newest, and those are its dumps 12 to 14; a name another job's archive held carries the job's id; no partial file
is left.

Usage: shared_folder.py OOMFLIGHT_CLI LIBOOMFLIGHT PYTHON_PACKAGE_ROOT
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

import h5py

CLI = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ""
LIBRARY = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else ""
PACKAGE_ROOT = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else ""
DUMPS = 15

# What the file at a path holds, read by a Python that has not loaded liboomflight (its parallel HDF5 would stand in
# for h5py's own). A file without a job id (oomflight before 0.2.1) says "-".
READ = ("import h5py, sys; f = h5py.File(sys.argv[1], 'r'); "
        "print(f.attrs['reason'].decode(), f.attrs['job_id'].decode() if 'job_id' in f.attrs else '-')")

JOB = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from pathlib import Path
    import oomflight
    tag, folder = sys.argv[1], sys.argv[2]
    oomflight.init(run_name="shared", folder=folder, max_dumps=3)
    rank, size = oomflight.rank()
    oomflight.record("alloc", 0, 0x1000, 1 << 20)
    if rank == 0:
        paths = []
        for i in range(int(sys.argv[3])):
            r = oomflight.request_dump("signal", reason=f"{tag} dump {i}")
            # What the path holds right after the dump (the other job's retention or rename could change it later
            # only by taking this job's file, which it must not).
            held = subprocess.run([sys.executable, "-c", sys.argv[4], r.path], capture_output=True, text=True)
            paths.append([i, r.status, r.path, (held.stdout or held.stderr).strip()])
        Path(f"{tag}.paths.json").write_text(json.dumps(paths))
        Path(f"{tag}.done").touch()
    else:
        while not Path(f"{tag}.done").exists():
            time.sleep(0.02)
""")


class SharedFolder(unittest.TestCase):
    def setUp(self):
        if not CLI:
            self.skipTest("usage: shared_folder.py OOMFLIGHT_CLI LIBOOMFLIGHT PYTHON_PACKAGE_ROOT")
        self.work = Path(tempfile.mkdtemp(prefix="oomflight-shared-"))
        self.addCleanup(shutil.rmtree, self.work, True)

    def test_two_jobs_keep_their_own_archives_and_names(self):
        (self.work / "job.py").write_text(JOB)
        folder = self.work / "out"
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("OOMFLIGHT_")},
               "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
               "OOMFLIGHT_LIBRARY": LIBRARY, "PYTHONPATH": PACKAGE_ROOT}
        jobs = {}
        for tag in ("alpha", "beta"):
            cmd = ["mpirun", "--oversubscribe", "-np", "2", "-x", "OOMFLIGHT_LIBRARY", "-x", "PYTHONPATH",
                   sys.executable, "job.py", tag, str(folder), str(DUMPS), READ]
            jobs[tag] = subprocess.Popen(cmd, cwd=self.work, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, errors="replace")
        outputs = {tag: p.communicate(timeout=300)[0] for tag, p in jobs.items()}
        for tag, p in jobs.items():
            self.assertEqual(p.returncode, 0, f"{tag}:\n{outputs[tag][-4000:]}")
        told = {tag: json.loads((self.work / f"{tag}.paths.json").read_text()) for tag in jobs}
        # Every dump was an archive of both of the job's ranks, and the path the job was told held its own dump.
        held_ids = {}
        for tag in jobs:
            self.assertEqual([s for _, s, _, _ in told[tag]], ["archive"] * DUMPS, f"{tag}: {told[tag]}")
            for i, _, path, held in told[tag]:
                reason, _, job_id = held.rpartition(" ")
                self.assertEqual(reason, f"rank 0: {tag} dump {i}", f"{tag} was told {path}, which held {held!r}")
                self.assertEqual(held_ids.setdefault(tag, job_id), job_id, f"{tag}: {told[tag]}")
        self.assertNotEqual(held_ids["alpha"], held_ids["beta"])
        all_paths = [p for tag in jobs for _, _, p, _ in told[tag]]
        # What is left: each job's own 3 newest, holding its own dumps and its own job id.
        job_ids = {}
        left = {tag: [] for tag in jobs}
        for path in sorted(folder.glob("*.h5")):
            with h5py.File(path, "r") as f:
                reason = f.attrs["reason"].decode() if isinstance(f.attrs["reason"], bytes) else f.attrs["reason"]
                job_id = f.attrs["job_id"].decode() if isinstance(f.attrs["job_id"], bytes) else f.attrs["job_id"]
                self.assertEqual(list(f.attrs["ranks_present"]), [0, 1], path.name)
            m = re.fullmatch(r"rank 0: (alpha|beta) dump (\d+)", reason)
            self.assertIsNotNone(m, f"{path.name}: {reason!r}")
            tag, i = m.group(1), int(m.group(2))
            self.assertEqual(job_ids.setdefault(tag, job_id), job_id, f"{path.name}: two ids for {tag}")
            left[tag].append(i)
            # The path the job was told for this dump is this file.
            self.assertEqual(told[tag][i][2], str(path), f"{tag} dump {i}")
            # A name that does not carry the job's id is the plain one or its own counter; one that does is its own.
            if job_id in path.name:
                self.assertTrue(path.name.startswith(f"signal.-1.{job_id}"), path.name)
        self.assertEqual(job_ids, held_ids)
        for tag in jobs:
            self.assertEqual(sorted(left[tag]), [DUMPS - 3, DUMPS - 2, DUMPS - 1],
                             f"{tag} keeps its own 3 newest: {left}\n{outputs[tag][-3000:]}")
            removed = re.findall(r"retention: removed (\S+)", outputs[tag])
            self.assertEqual(len(removed), DUMPS - 3, f"{tag} removed its own 12 only:\n{outputs[tag][-3000:]}")
            self.assertTrue(set(removed) <= {p for _, _, p, _ in told[tag]}, f"{tag} removed another job's file")
        # At least one job met the other's name and took one with its id.
        self.assertTrue(any(i in p for i in job_ids.values() for p in all_paths), all_paths)
        self.assertEqual(list(folder.glob("*partial")), [])


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
