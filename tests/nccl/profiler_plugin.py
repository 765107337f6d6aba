"""The NCCL profiler plugin (plugins/nccl) as NCCL loads it, without a GPU or NCCL: tests/nccl/nccl_loader.cpp
finds it through NCCL_PROFILER_PLUGIN as NCCL does, takes ncclProfiler_v4, _v5 or _v6 and sends NCCL's events
in NCCL's layouts under mpirun with 2 ranks (for v6 under `oomflight run`, which names the plugin); rank 0 then asks for a signal dump, and the archive's /collectives
and /communicators are checked row by row (h5py alone, as a user without oomflight reads them). And the plugin in
a process where oomflight is not initialised and NCCL_PROFILER_PLUGIN is unset (NCCL then opens
libnccl-profiler.so from the library path): every call succeeds, and nothing is recorded or written.

Usage: profiler_plugin.py NCCL_LOADER PLUGIN OOMFLIGHT_CLI
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import h5py

LOADER, PLUGIN, CLI = (os.path.abspath(a) for a in sys.argv[1:4])
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith(("OOMFLIGHT_", "NCCL_"))},
       "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
COMM = 0x1234ABCD
N = 5  # allreduces: seq 0 .. N - 2 complete, seq N - 1 only starts
MiB = 1 << 20
# enum oomflight_collective_op, enum oomflight_datatype (oomflight.h)
ALLREDUCE, BROADCAST, SEND = 0, 3, 6
FLOAT32, BFLOAT16 = 7, 9
START, END = 0, 1
DEVICE = 1  # OOMFLIGHT_COLL_DEVICE_COMPLETION
UNTRACKED = 2  # OOMFLIGHT_COLL_UNTRACKED


def expected_rows(rank: int, nranks: int):
    """(op, seq, phase, flags, peer, count, bytes, datatype) in the order the loader makes them."""
    def allreduce(seq, phase, flags):
        return (ALLREDUCE, seq, phase, flags, -1, MiB, 4 * MiB, FLOAT32)
    rows = [allreduce(0, START, 0), allreduce(0, END, 0), allreduce(0, END, DEVICE)]  # host end, then device end
    for seq in range(1, N - 1):
        rows += [allreduce(seq, START, 0), allreduce(seq, END, DEVICE)]
    rows += [(BROADCAST, 0, START, 0, 0, MiB, 4 * MiB, FLOAT32), (BROADCAST, 0, END, DEVICE, 0, MiB, 4 * MiB, FLOAT32)]
    peer = (rank + 1) % nranks
    rows += [(SEND, 0, START, 0, peer, 256, 512, BFLOAT16), (SEND, 0, END, DEVICE, peer, 256, 512, BFLOAT16)]
    rows.append(allreduce(N - 1, START, 0))  # the rank is inside it: no end
    return rows


class ProfilerPlugin(unittest.TestCase):
    def workdir(self, name: str) -> Path:
        work = Path(tempfile.mkdtemp(prefix=f"oomflight-nccl-{name}-"))
        self.addCleanup(shutil.rmtree, work, ignore_errors=True)
        return work

    def test_exports_the_three_versioned_structs_only(self):
        out = subprocess.run(["nm", "-D", "--defined-only", PLUGIN], capture_output=True, text=True, check=True).stdout
        names = {line.split()[-1] for line in out.splitlines() if line.strip()}
        self.assertEqual(names, {"ncclProfiler_v4", "ncclProfiler_v5", "ncclProfiler_v6"}, out)
        self.assertEqual(Path(PLUGIN).name, "libnccl-profiler-oomflight.so")
        self.assertTrue((Path(PLUGIN).parent / "liboomflight.so").exists(), "the plugin sits next to liboomflight")

    def run_job(self, version: str, env_plugin: dict, launcher=()) -> Path:
        work = self.workdir(version)
        cmd = ["mpirun", "--oversubscribe", "-np", "2", "-x", f"OOMFLIGHT_RUN_NAME=nccl-{version}"]
        for name, value in env_plugin.items():
            cmd += ["-x", f"{name}={value}"]
        cmd += [*launcher, LOADER, version, str(N)]
        proc = subprocess.run(cmd, cwd=work, env=ENV, capture_output=True, text=True, timeout=300)
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out)
        printed = re.search(r"^archive (\S+)$", proc.stdout, re.M)
        self.assertTrue(printed, out)
        archives = sorted((work / f"nccl-{version}" / "oomflight").glob("*.h5"))
        self.assertEqual([a.resolve() for a in archives], [Path(printed.group(1)).resolve()], out)
        return archives[0]

    def check_archive(self, archive: Path):
        with h5py.File(archive, "r") as f:
            self.assertEqual(f.attrs["kind"], b"signal")
            self.assertEqual(list(f.attrs["ranks_present"]), [0, 1])
            self.assertIn("collectives", f, "no /collectives in the archive")
            collectives = f["collectives"][...]
            communicators = f["communicators"][...]
        for rank in (0, 1):
            mine = collectives[(collectives["rank"] == rank) & (collectives["comm_id"] == COMM)]
            got = [(int(r["op"]), int(r["seq"]), int(r["phase"]), int(r["flags"]), int(r["peer"]), int(r["count"]),
                    int(r["bytes"]), int(r["datatype"])) for r in mine]
            self.assertEqual(got, expected_rows(rank, 2), f"rank {rank}")
            self.assertTrue((mine["stream"] == 0).all())
            self.assertTrue((mine["batch"] == 0).all())
            times = [int(t) for t in mine["t_ns"]]
            self.assertEqual(times, sorted(times), f"rank {rank}: records oldest first")
            self.assertGreater(times[0], 0)
            comms = communicators[communicators["rank"] == rank]
            ours = comms[comms["comm_id"] == COMM]
            self.assertEqual(len(ours), 1, comms)
            self.assertEqual(ours[0]["name"], b"test-comm")
            self.assertEqual((int(ours[0]["comm_rank"]), int(ours[0]["comm_size"])), (rank, 2))
            self.assertIn(b"world", list(comms["name"]), "oomflight_init registers the world communicator")

    def test_v4_found_by_name(self):
        # NCCL_PROFILER_PLUGIN=oomflight: NCCL opens libnccl-profiler-oomflight.so from the library path.
        self.check_archive(self.run_job("v4", {"NCCL_PROFILER_PLUGIN": "oomflight",
                                               "LD_LIBRARY_PATH": os.path.dirname(PLUGIN)}))

    def test_v5_found_by_path(self):
        self.check_archive(self.run_job("v5", {"NCCL_PROFILER_PLUGIN": PLUGIN}))

    def test_v6_named_by_oomflight_run(self):
        # As a user runs a job: `oomflight run` sets NCCL_PROFILER_PLUGIN to the plugin next to its library.
        self.check_archive(self.run_job("v6", {}, launcher=(CLI, "run", "--")))

    def test_oomflight_run_names_the_plugin_unless_the_job_did(self):
        show = [CLI, "run", "--", "sh", "-c", 'printf %s "$NCCL_PROFILER_PLUGIN"']
        out = subprocess.run(show, env=ENV, capture_output=True, text=True, check=True).stdout
        self.assertEqual(Path(out).resolve(), Path(PLUGIN).resolve())
        for own in ("none", "/opt/other/libnccl-profiler.so"):
            out = subprocess.run(show, env={**ENV, "NCCL_PROFILER_PLUGIN": own}, capture_output=True, text=True,
                                 check=True).stdout
            self.assertEqual(out, own)

    def test_two_threads_as_nccl_calls_it(self):
        # The user's thread starts and stops allreduces while another thread, as NCCL's proxy thread, reports their
        # kernel channels; the collective history keeps the newest records: each start there has one device end.
        work = self.workdir("threads")
        ops = 50000
        env = {**ENV, "NCCL_PROFILER_PLUGIN": PLUGIN, "OOMFLIGHT_RUN_NAME": "threads"}
        proc = subprocess.run([LOADER, "v5", str(ops), "threads"], cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertNotIn("not recorded", proc.stderr, "no operation may be dropped with 256 in flight")
        archives = sorted((work / "threads" / "oomflight").glob("*.h5"))
        self.assertEqual(len(archives), 1, proc.stdout + proc.stderr)
        with h5py.File(archives[0], "r") as f:
            collectives = f["collectives"][...]
            ranks = f["ranks"][...]
        mine = collectives[collectives["comm_id"] == COMM]
        self.assertGreaterEqual(int(ranks[0]["collectives_recorded"]), 2 * ops)
        self.assertFalse(((mine["phase"] == END) & (mine["flags"] == 0)).any(), "host ends only before any channel")
        start_at, end_at = {}, {}
        for i, r in enumerate(mine):
            seq = int(r["seq"])
            table = start_at if int(r["phase"]) == START else end_at
            self.assertNotIn(seq, table, f"seq {seq}: two {'starts' if table is start_at else 'ends'}")
            table[seq] = i
        self.assertGreater(len(start_at), 4000)
        for seq, i in start_at.items():
            self.assertIn(seq, end_at, f"seq {seq} has no device end")
            self.assertGreater(end_at[seq], i)
        self.assertTrue(all(seq < min(start_at) for seq in set(end_at) - set(start_at)),
                        "an end without its start only where the start was pushed out of the history")
        self.assertEqual(max(start_at), ops - 1)

    def loader_archive(self, name: str, args: list[str]):
        work = self.workdir(name)
        env = {**ENV, "NCCL_PROFILER_PLUGIN": PLUGIN, "OOMFLIGHT_RUN_NAME": name}
        proc = subprocess.run([LOADER, *args], cwd=work, env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        archives = sorted((work / name / "oomflight").glob("*.h5"))
        self.assertEqual(len(archives), 1, proc.stdout + proc.stderr)
        return archives[0], proc.stderr

    def test_past_the_pool_every_start_is_recorded_and_the_untracked_counted(self):
        # 2,000 allreduces started and none stopped, past the pool of 1,024 operations in flight: before (issue 30)
        # 976 starts were dropped, the archive held 1,024 rows and the report said the rank "waits in allreduce
        # #1023". Now every start is in the archive, those without a slot flagged untracked, and the report names
        # the last one entered and counts the rest.
        for version in ("v4", "v5", "v6"):
            with self.subTest(version=version):
                archive, log = self.loader_archive(f"pool-{version}", [version, "2000", "pool"])
                with h5py.File(archive, "r") as f:
                    collectives = f["collectives"][...]
                mine = collectives[collectives["comm_id"] == COMM]
                self.assertEqual([int(s) for s in mine["seq"]], list(range(2000)))
                self.assertTrue((mine["phase"] == START).all())
                self.assertEqual([int(x) for x in mine["flags"]], [0] * 1024 + [UNTRACKED] * 976)
                self.assertIn("976 operations recorded untracked (all slots in use)", log)
                report = subprocess.run([CLI, "report", str(archive)], capture_output=True, text=True, timeout=120)
                self.assertEqual(report.returncode, 0, report.stderr)
                text = report.stdout
                for expected in (
                        "rank 0 entered allreduce #1999 on communicator 'test-comm' (1 ranks; 4.00 MiB), and whether it "
                        "finished it is not known (untracked)",
                        "976 operations on communicator 'test-comm' were not followed to their end by their source",
                        "    rank 0: last entered allreduce #1999 (4.00 MiB) in batch 0",
                        "the newest tracked operation without an end: allreduce #1023 (4.00 MiB)",
                        "      976 of its operations untracked"):
                    self.assertIn(expected, text)
                self.assertNotIn("waits in allreduce #1023", text)

    def test_sixteen_threads_with_one_operation_each_lose_none(self):
        # Each thread has at most one operation in flight, 16 in all, against 1,024 slots: before (issue 30) a claim
        # that landed on another thread's busy slot gave up, and 0.9% of the operations were lost.
        ops = 400000
        archive, log = self.loader_archive("many", ["v6", str(ops), "many"])
        self.assertNotIn("untracked", log)
        self.assertNotIn("given up on", log)
        with h5py.File(archive, "r") as f:
            collectives = f["collectives"][...]
            ranks = f["ranks"][...]
        self.assertGreaterEqual(int(ranks[0]["collectives_recorded"]), 2 * ops)
        mine = collectives[collectives["comm_id"] == COMM]
        self.assertFalse((mine["flags"] & UNTRACKED).any())
        starts = {int(r["seq"]) for r in mine if int(r["phase"]) == START}
        device_ends = {int(r["seq"]) for r in mine if int(r["phase"]) == END and int(r["flags"]) == DEVICE}
        self.assertGreater(len(starts), 1000)
        # Every start the history kept has its device end, but the few whose end was still to come at the freeze:
        # none here, every thread stops its operation before the dump.
        self.assertEqual(starts - device_ends, set())

    def test_quiet_without_oomflight(self):
        # NCCL_PROFILER_PLUGIN unset: NCCL opens libnccl-profiler.so, here a link to the plugin on the library path
        # (the README's way to make it the default). oomflight_init is never called.
        work = self.workdir("quiet")
        (work / "lib").mkdir()
        (work / "lib" / "libnccl-profiler.so").symlink_to(PLUGIN)
        env = {**ENV, "LD_LIBRARY_PATH": str(work / "lib")}
        for version in ("v4", "v5", "v6"):
            proc = subprocess.run([LOADER, version, str(N), "quiet"], cwd=work, env=env, capture_output=True,
                                  text=True, timeout=60)
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            self.assertIn("quiet: every call succeeded, no handle was handed out", proc.stdout)
            own = [line for line in proc.stderr.splitlines() if not line.startswith("NCCL log")]
            self.assertEqual(own, [], "quiet: nothing but NCCL's log")
        self.assertEqual(sorted(p.name for p in work.iterdir()), ["lib"], "nothing written")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
