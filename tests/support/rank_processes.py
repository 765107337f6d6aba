"""The processes of an mpirun job's ranks, for tests that signal or stop one rank (tests/mpi, tests/faults)."""
import os
from pathlib import Path


def replay_pid(rank: int, job_folder: Path) -> int | None:
    """The pid of rank `rank`'s `oomflight replay` in the job started in `job_folder` (the mpirun's cwd, which its
    ranks inherit), or in a folder above it (a path the job writes to may be given). Another job's rank with that
    number (an earlier test's, still ending, or one running beside it) is never taken for it: it killed a test once
    (mpi.signal_dump: the pid found had ended by the time it was signalled). None while there is none."""
    within = Path(job_folder).resolve()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if b"replay" not in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                continue
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() not in env or cwd == Path("/"):
            continue
        if cwd == within or cwd in within.parents:
            return int(pid)
    return None
