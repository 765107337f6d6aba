"""The NCCL profiler plugin inside a real NCCL (docs/nccl.md), on a machine with one GPU and torch: two processes
form one NCCL communicator through torch.distributed on the same GPU (NCCL_HOSTID differs per process, so NCCL
takes them for two hosts and connects them over its socket transport on the loopback; one GPU for two ranks is
otherwise refused as a duplicate), with NCCL_PROFILER_PLUGIN naming the plugin. Each process initialises oomflight
(one process each, no MPI), runs four allreduces, a broadcast and a send/receive, waits for the device, and asks
for a signal dump; the two archives' /collectives and /communicators are then printed and checked: every
operation has a start and a device end, NCCL's sequence numbers count the allreduces, the communicator is there.

Run on the GPU machine after scripts/gpu_check/prepare.sh (which puts the plugin next to liboomflight in
gpu-check/lib), from the checkout's root:
  source gpu-check/env.sh; python3 scripts/gpu_check/nccl_check.py OUT
Writes OUT/nccl_summary.json, each rank's log and NCCL's, and the archives (OUT/rank0.h5, OUT/rank1.h5).
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLREDUCES = 4
OPS = ["allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "send", "recv", "gather",
       "scatter", "barrier", "other"]


def worker(rank: int, out: Path, world_size: int = 2) -> None:
    import torch
    import torch.distributed as dist

    import oomflight

    oomflight.init()
    dist.init_process_group("nccl", rank=rank, world_size=world_size, device_id=torch.device("cuda:0"))
    print(f"rank {rank}: torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}", flush=True)
    x = torch.ones(1 << 20, device="cuda")
    for _ in range(ALLREDUCES):
        dist.all_reduce(x)
    dist.broadcast(x, src=0)
    y = x[:256].clone()
    if world_size == 1:
        pass  # no peer: NCCL's one-rank path (ncclLaunchOneRank) copies, and tells the profiler nothing
    elif rank == 0:
        dist.send(y, dst=1)
    else:
        dist.recv(y, src=0)
    torch.cuda.synchronize()
    time.sleep(2)  # NCCL's proxy thread reports the kernel channels' ends after the kernels
    result = oomflight.request_dump("signal", reason=f"nccl_check rank {rank}")
    print(f"rank {rank}: archive {result.path}", flush=True)
    dist.destroy_process_group()
    oomflight.shutdown()


def rows(archive: Path):
    import h5py

    with h5py.File(archive, "r") as f:
        colls = [{k: (v.decode() if isinstance(v, bytes) else int(v)) for k, v in zip(r.dtype.names, r.tolist())}
                 for r in f["collectives"][...]] if "collectives" in f else []
        comms = [{k: (v.decode() if isinstance(v, bytes) else int(v)) for k, v in zip(r.dtype.names, r.tolist())}
                 for r in f["communicators"][...]] if "communicators" in f else []
    return colls, comms


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    plugin = Path(os.environ.get("OOMFLIGHT_LIBRARY", "")).parent / "libnccl-profiler-oomflight.so"
    if not plugin.exists():
        print(f"nccl_check: {plugin} is missing (prepare.sh copies it when it is built)", file=sys.stderr)
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    works = [Path(tempfile.mkdtemp(prefix=f"nccl-check-{rank}-")) for rank in range(2)]
    for rank, work in enumerate(works):
        env = {**os.environ, "NCCL_PROFILER_PLUGIN": str(plugin), "NCCL_HOSTID": f"oomflight-check-{rank}",
               "NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV",
               "NCCL_DEBUG_FILE": str(out / f"nccl{rank}.log"), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OOMFLIGHT_RUN_NAME": f"nccl-check-{rank}", "PYTHONPATH": f"{ROOT / 'python'}:" + os.environ.get("PYTHONPATH", "")}
        log = open(out / f"worker{rank}.log", "w")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(rank), str(out)], cwd=work, env=env,
                                      stdout=log, stderr=subprocess.STDOUT))
    codes, deadline = [], time.monotonic() + 240
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("timeout")
    summary = {"exit": codes, "ranks": []}
    ok = codes == [0, 0]
    for rank in range(2):
        archives = sorted(works[rank].rglob("*.h5"))
        nccl_log = (out / f"nccl{rank}.log").read_text(errors="replace") if (out / f"nccl{rank}.log").exists() else ""
        loaded = [line.strip() for line in nccl_log.splitlines() if "rofiler" in line or "oomflight" in line]
        entry = {"rank": rank, "archives": [str(a) for a in archives], "nccl_log_profiler_lines": loaded[:20]}
        if archives:
            colls, comms = rows(archives[-1])
            entry["communicators"] = comms
            entry["collectives"] = [f"{OPS[c['op']]} seq {c['seq']} {'end' if c['phase'] else 'start'}"
                                    f"{' device' if c['flags'] & 1 else ''} peer {c['peer']} bytes {c['bytes']} "
                                    f"comm {c['comm_id']:x}" for c in colls]
            allreduce = [c for c in colls if c["op"] == 0]
            starts = sorted(c["seq"] for c in allreduce if c["phase"] == 0)
            device_ends = sorted(c["seq"] for c in allreduce if c["phase"] == 1 and c["flags"] & 1)
            entry["allreduce_starts"], entry["allreduce_device_ends"] = starts, device_ends
            ok = ok and len(starts) >= ALLREDUCES and device_ends == starts and any(c["op"] == 3 for c in colls)
            ok = ok and any(c["op"] == (6 if rank == 0 else 7) and c["phase"] == 1 and c["flags"] & 1 for c in colls)
            # archives are copied up one level, so that they come back from the device machine
            (out / f"rank{rank}.h5").write_bytes(archives[-1].read_bytes())
        else:
            ok = False
        summary["ranks"].append(entry)
    summary["ok"] = ok
    summary["one_rank"] = one_rank(out, plugin)
    (out / "nccl_summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    print("nccl_check:", "OK" if ok else "FAILED")
    return 0 if ok else 1


def one_rank(out: Path, plugin: Path) -> dict:
    """The issue's suggestion, a one-rank communicator (torch DDP of world size 1): NCCL's nRanks == 1 path
    (src/enqueue.cc, ncclLaunchOneRank) starts no profiler event, so the archive is expected to hold no NCCL
    collective. Recorded as a finding, not a pass or fail."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    work = Path(tempfile.mkdtemp(prefix="nccl-check-one-"))
    env = {**os.environ, "NCCL_PROFILER_PLUGIN": str(plugin), "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV",
           "NCCL_DEBUG_FILE": str(out / "nccl-one.log"), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "OOMFLIGHT_RUN_NAME": "nccl-check-one", "PYTHONPATH": f"{ROOT / 'python'}:" + os.environ.get("PYTHONPATH", "")}
    with open(out / "worker-one.log", "w") as log:
        try:
            code = subprocess.run([sys.executable, __file__, "--worker", "0", str(out), "1"], cwd=work, env=env,
                                  stdout=log, stderr=subprocess.STDOUT, timeout=120).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    archives = sorted(work.rglob("*.h5"))
    result = {"exit": code, "archives": [str(a) for a in archives]}
    if archives:
        colls, comms = rows(archives[-1])
        result["nccl_collectives"] = [f"{OPS[c['op']]} seq {c['seq']} phase {c['phase']}" for c in colls]
        result["communicators"] = [c["name"] for c in comms]
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 2)
    else:
        sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "nccl-check-out")))
