#!/usr/bin/env python3
"""The store transport (torchrun, issue 33) against the MPI path on the same job and history sizes, in one run.

    bench/store_vs_mpi.py --torch-python VENV/bin/python [--build build] [--ranks 2,4,8,16] [--events 20000]
                          [--repeats 3]

For each world size P, the same job runs twice: under `mpirun -np P oomflight run -- python job.py` and under
`oomflight run -- torchrun --nproc-per-node P job.py` (gloo, the c10d store of torchrun's agent). Every rank records
EVENTS events; once every rank has (a barrier: MPI's, or torch.distributed's), rank P-1 asks for an oom dump and
every other rank waits, off the CPU. Measured from the archive alone, so that both paths are timed alike:

- trigger to freeze: each rank's freeze_t_ns (/ranks, CLOCK_MONOTONIC, one host) minus the origin's; the table
  gives the slowest rank's;
- the whole dump: the origin's "archive ... written in X s" (from its request to the archive's name).

Medians over the repeats. On this machine (2 cores) every P > 2 is oversubscribed, and torch's import costs each
rank about a second of CPU before the job starts (not timed).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import h5py

JOB = textwrap.dedent("""
    import os, sys, time
    mode = sys.argv[1]
    events = int(sys.argv[2])
    import oomflight
    if mode == "store":
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        barrier = dist.barrier
    else:
        oomflight.init()
        rank, size = oomflight.rank()
        barrier = None
    for i in range(events):
        oomflight.record("alloc", 0, 0x100000000 * (rank + 1) + 512 * i, 512)
    if barrier:
        barrier()
    else:  # every rank's history is in before the dump: a file per rank, polled
        open(f"ready.{rank}", "w").close()
        while sum(os.path.exists(f"ready.{r}") for r in range(size)) < size:
            time.sleep(0.01)
    if rank == size - 1:
        oomflight.trigger_oom(0, "bench", 1 << 30, 1 << 20)
        open("dumped", "w").close()
    else:
        while not os.path.exists("dumped"):
            time.sleep(0.01)
        time.sleep(0.2)
""")

WRITTEN = re.compile(r"archive \S+ written (?:by \d+ of \d+ ranks )?in ([\d.]+) s")


def one(args, mode, ranks):
    with tempfile.TemporaryDirectory(prefix="oomflight-store-bench-") as tmp:
        cwd = Path(tmp)
        (cwd / "job.py").write_text(JOB)
        env = dict(os.environ, OOMFLIGHT_FOLDER=str(cwd / "out"), OMPI_ALLOW_RUN_AS_ROOT="1",
                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
        cli = str(Path(args.build) / "bin" / "oomflight")
        env["OOMFLIGHT_LIBRARY"] = str(Path(args.build) / "core" / "liboomflight.so")
        if mode == "mpi":
            cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), "-x", "OOMFLIGHT_FOLDER", "-x", "OOMFLIGHT_LIBRARY",
                   cli, "run", "--", args.torch_python, "job.py", mode, str(args.events)]
        else:
            torchrun = str(Path(args.torch_python).parent / "torchrun")
            cmd = [cli, "run", "--", torchrun, "--standalone", "--nproc-per-node", str(ranks), "job.py", mode,
                   str(args.events)]
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
        log = p.stdout + p.stderr
        archives = [f for f in (cwd / "out").glob("*.h5") if ".rank" not in f.name] if (cwd / "out").is_dir() else []
        if p.returncode != 0 or len(archives) != 1:
            sys.exit(f"{mode} at {ranks} ranks: exit {p.returncode}, archives {archives}\n{log[-4000:]}")
        with h5py.File(archives[0], "r") as f:
            rows = f["ranks"][()]
            if len(rows) != ranks:
                sys.exit(f"{mode} at {ranks} ranks: {len(rows)} ranks in the archive\n{log[-4000:]}")
            origin = int(f.attrs["origin_ranks"][0])
            freeze = {int(r["rank"]): int(r["freeze_t_ns"]) for r in rows}
        lag_ms = max(freeze[r] - freeze[origin] for r in freeze) / 1e6
        written = WRITTEN.search(log)
        if not written:
            sys.exit(f"{mode} at {ranks} ranks: no \"written in\" line\n{log[-4000:]}")
        whole = float(written.group(1))
        return lag_ms, whole


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--torch-python", required=True)
    ap.add_argument("--ranks", default="2,4,8,16")
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    print(f"| ranks | events a rank | MPI: trigger to last freeze | store: trigger to last freeze | MPI: whole dump "
          f"| store: whole dump |")
    print("|---|---|---|---|---|---|")
    for ranks in [int(r) for r in args.ranks.split(",")]:
        results = {"mpi": [], "store": []}
        for _ in range(args.repeats):
            for mode in ("mpi", "store"):  # alternating, so that the machine's load falls on both alike
                results[mode].append(one(args, mode, ranks))
        med = {m: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for m, v in results.items()}
        print(f"| {ranks} | {args.events:,} | {med['mpi'][0]:.1f} ms | {med['store'][0]:.1f} ms "
              f"| {med['mpi'][1] * 1000:.0f} ms | {med['store'][1] * 1000:.0f} ms |", flush=True)


if __name__ == "__main__":
    main()
