#!/usr/bin/env python3
"""What one request costs the job's c10d store: the CPU of the TCPStore server's thread per `check`, the request an
idle oomflight watcher makes (core/control/src/store_pacing.hpp sizes its polls from this).

    VENV/bin/python bench/store_server_cost.py [--clients 1,2] [--seconds 5]

A TCPStore server (torch's default, the libuv backend) runs in this process, as it runs in torchrun's agent or rank
0's process; C client processes each `check` a missing key in a closed loop for the given time. The server's CPU is
this process's (its main thread only waits); per request = CPU / requests. With few clients each request wakes the
server's loop on its own (the dearest case); more clients let it batch. Times vary with the machine.
"""
import argparse
import multiprocessing as mp
import resource
import time
from datetime import timedelta

import torch.distributed as dist


def client(port: int, seconds: float, out: "mp.Queue") -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        store.check(["oomflight/0/0/d0/cause"])
        n += 1
    out.put(n)


def cpu_seconds() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,2")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    print(f"torch {__import__('torch').__version__}; TCPStore libuv backend: {server.libuvBackend}")
    print("| client processes | requests a second | server CPU a request |")
    print("|---|---|---|")
    for c in [int(x) for x in args.clients.split(",")]:
        out: "mp.Queue" = mp.Queue()
        procs = [mp.Process(target=client, args=(server.port, args.seconds, out)) for _ in range(c)]
        cpu0 = cpu_seconds()
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        cpu = cpu_seconds() - cpu0
        total = sum(out.get() for _ in procs)
        print(f"| {c} | {total / args.seconds:,.0f} | {cpu / total * 1e6:.1f} us |")


if __name__ == "__main__":
    main()
