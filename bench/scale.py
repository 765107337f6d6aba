#!/usr/bin/env python3
"""Per-phase cost of a coordinated dump against the world size: the measured table and fit of docs/scale.md.

    bench/scale.py [--build build] [--ranks 2,4,...,256] [--events 100] [--repeats 5] [--poll-us 10000]
                   [--out FILE.json] [--fit-only FILE.json ...]

Runs bench/dump_bench.cpp (rank 0 asks for a signal dump; the others wait off the CPU, polling a barrier every
POLL_US) under `mpirun --oversubscribe -np P` for each P, with OOMFLIGHT_LOG_LEVEL=debug, and reads the line
"dump phases on rank R of P (wall/CPU ms): ..." that every rank logs at the end of each dump
(core/control/src/dump_timeline.hpp). For each phase it reports rank 0's wall time (rank 0 is the origin and lays
the archive out: each step between the ranks ends there only when the slowest rank reached it, so its wall time is
the critical path), rank 0's CPU time (its own work: an O(P) loop on rank 0 shows here), and the median CPU time of
the other ranks (the per-rank work, which a cluster runs in parallel). Medians over the repeats, the first repeat
dropped (it pays for the first touch of every buffer). Then a least-squares fit of each column to a + b*P, with
the residuals, and whether the phase grows with P (slope significant against the residuals).

On this machine (2 cores) every P > 2 is oversubscribed: wall time that grows with P there is mostly the cores
being shared, which is why the CPU columns exist (docs/scale.md separates the two).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

PHASE_LINE = re.compile(r"dump phases on rank (\d+) of (\d+) from (\d+) ns \(wall/CPU ms\): (.*)$")
WHOLE = re.compile(r"whole dump of (\d+) ranks x (\d+) events.*median ([\d.]+) s, slowest ([\d.]+) s.*archive ([\d.]+) MiB")
RSS = re.compile(r"peak resident memory per rank: median ([\d.]+) MiB, largest ([\d.]+) MiB")


def parse_phases(text):
    """[(name, wall_ms, cpu_ms)] from the part after the colon of a phase line."""
    out = []
    for part in text.split(", "):
        name, _, numbers = part.rpartition(" ")
        wall, cpu = numbers.split("/")
        out.append((name, float(wall), float(cpu)))
    return out


def run_one(build, ranks, events, repeats, poll_us):
    env = dict(os.environ, OOMFLIGHT_LOG_LEVEL="debug", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), os.path.join(build, "bench", "oomflight_dump_bench"),
           str(events), str(repeats), "0", "sleep", str(poll_us)]
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr[-3000:]}")
    per_rank = {}  # rank -> [phases of dump 0, dump 1, ...]
    starts = {}  # rank -> [monotonic ns at which each dump started there]
    for line in p.stderr.splitlines():
        m = PHASE_LINE.search(line)
        if m:
            per_rank.setdefault(int(m.group(1)), []).append(parse_phases(m.group(4)))
            starts.setdefault(int(m.group(1)), []).append(int(m.group(3)))
    whole = WHOLE.search(p.stdout)
    rss = RSS.search(p.stdout)
    if not whole or len(per_rank) != ranks or any(len(v) != repeats for v in per_rank.values()):
        raise SystemExit(f"unexpected output of {' '.join(cmd)}:\n{p.stdout}\n{p.stderr[-3000:]}")
    names = [n for n, _, _ in per_rank[0][0]]
    keep = slice(1, None) if repeats > 1 else slice(None)  # the first dump pays for first touches
    row = {"ranks": ranks, "events": events, "repeats": repeats, "whole_s": float(whole.group(3)),
           "slowest_s": float(whole.group(4)), "archive_mib": float(whole.group(5)),
           "rss_median_mib": float(rss.group(1)), "rss_max_mib": float(rss.group(2)), "phases": {}}
    # On one host the ranks share one monotonic clock: when, after rank 0 started the dump, the last rank saw the
    # trigger and posted its vote, and when the votes were complete on rank 0. The gap between the last two is the
    # vote's exchange itself; the rest of rank 0's "votes" is waiting for the slowest rank to get there.
    def at(rank, dump, upto):
        phases = per_rank[rank][dump]
        end = next(i for i, p in enumerate(phases) if p[0] == upto)
        return (starts[rank][dump] - starts[0][dump]) / 1e6 + sum(p[1] for p in phases[:end + 1])

    dumps = range(repeats)[keep]
    row["timeline"] = {
        "last rank sees the trigger": statistics.median(
            max((starts[r][d] - starts[0][d]) / 1e6 for r in per_rank) for d in dumps),
        "last rank posts its vote": statistics.median(max(at(r, d, "late request") for r in per_rank) for d in dumps),
        "votes complete on rank 0": statistics.median(at(0, d, "votes") for d in dumps),
    }
    for i, name in enumerate(names):
        root = per_rank[0][keep]
        others = [d[i][2] for r, dumps in per_rank.items() if r != 0 for d in dumps[keep]]
        row["phases"][name] = {
            "root_wall_ms": statistics.median(d[i][1] for d in root),
            "root_cpu_ms": statistics.median(d[i][2] for d in root),
            "others_cpu_ms": statistics.median(others) if others else 0.0,
        }
    return row


def fit(xs, ys):
    """Least squares y = a + b x: (a, b, residuals, R^2, standard error of b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:  # one world size: no slope to fit
        return my, 0.0, [y - my for y in ys], 1.0, float("nan")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    res = [y - (a + b * x) for x, y in zip(xs, ys)]
    ss_res = sum(r * r for r in res)
    ss_tot = sum((y - my) ** 2 for y in ys)
    r2 = 1 - ss_res / ss_tot if ss_tot > 0 else 1.0
    se_b = (ss_res / (n - 2) / sxx) ** 0.5 if n > 2 else float("nan")
    return a, b, res, r2, se_b


def report(rows):
    rows = sorted(rows, key=lambda r: r["ranks"])
    names = list(rows[0]["phases"])
    ps = [r["ranks"] for r in rows]
    print(f"\n### {rows[0]['events']} events per rank\n")
    print("| ranks | whole dump (median) | archive | peak RSS per rank (median / largest) |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['ranks']} | {r['whole_s']:.3f} s | {r['archive_mib']:.1f} MiB | "
              f"{r['rss_median_mib']:.1f} / {r['rss_max_mib']:.1f} MiB |")
    print("\nwhen, after rank 0 started the dump (ms; one host, one clock)\n")
    print("| step | " + " | ".join(str(p) for p in ps) + " | fit a + b·P | R² |")
    print("|---|" + "---:|" * len(ps) + "---|---:|")
    for name in rows[0].get("timeline", {}):
        ys = [r["timeline"][name] for r in rows]
        a, b, res, r2, se_b = fit(ps, ys)
        print(f"| {name} | " + " | ".join(f"{y:.2f}" for y in ys) + f" | {a:.2f} + {b * 1000:.1f} µs·P | {r2:.2f} |")
    for column, title in (("root_wall_ms", "rank 0's wall time, ms (the critical path)"),
                          ("root_cpu_ms", "rank 0's CPU time, ms (its own work)"),
                          ("others_cpu_ms", "the other ranks' CPU time, ms (median; per-rank work)")):
        print(f"\n{title}\n")
        print("| phase | " + " | ".join(str(p) for p in ps) + " | fit a + b·P | R² | residuals |")
        print("|---|" + "---:|" * len(ps) + "---|---:|---|")
        for name in names:
            ys = [r["phases"][name][column] for r in rows]
            a, b, res, r2, se_b = fit(ps, ys)
            grows = "grows with P" if b > 3 * se_b and b * ps[-1] > 0.5 else "flat"
            print(f"| {name} | " + " | ".join(f"{y:.3f}" for y in ys) +
                  f" | {a:.3f} + {b * 1000:.2f} µs·P ({grows}) | {r2:.2f} | " +
                  " ".join(f"{x:+.2f}" for x in res) + " |")


# The cluster the model is carried to (docs/scale.md gives each number's source; "assumed" ones have none better).
ASSUMED = {
    "ranks_per_node": 8,            # one rank per GPU, 8 GPUs a node
    "round_s": 102e-6,              # one round of a nonblocking collective: alpha (2 us, InfiniBand) + the relaying
                                    # rank's next MPI_Test, half of wait_for's 200 us pause on average
    "send_s": 1e-6,                 # posting and completing one small point-to-point message (assumed)
    "node_link_Bps": 25e9,          # one 200 Gb/s HDR InfiniBand link a node
    "poll_s": 10e-3,                # OOMFLIGHT_POLL_INTERVAL's default: a watcher off the origin's node sees the trigger
    "mds_create_per_s": 15e3,       # creates (and renames) in one shared folder, one Lustre MDT (Dell/Intel, mdtest)
    "mds_unlink_per_s": 100e3,      # unlinks, same source
    "mds_op_s": 1e-3,               # one metadata operation's latency (assumed)
    "fs_Bps": 1e12,                 # the file system's aggregate write bandwidth (assumed; Summit's Alpine: 2.5 TB/s)
    "ost_Bps": 2e9,                 # one Lustre OST (assumed)
    "rank_row_bytes": 552,          # sizeof(RankRow): the root reads every rank's row back
    "vote_bytes_before": 888,       # sizeof(Vote) before this change, gathered from every rank
}


def model(proto, full, ranks=16384, tree=None):
    """Predicted seconds per phase at `ranks`, from this machine's per-rank constants and ASSUMED.

    `tree` is "before" (every rank gathers every vote) or "after" (the votes reduced, rows placed by recursive
    doubling). Returns {scenario: {phase: seconds}} for a protocol-only dump (100 events a rank) and a full one
    (100k events), the latter with the archive striped over the whole file system or left on one OST (Lustre's
    default stripe count, 1)."""
    import math
    a = ASSUMED
    lg = math.ceil(math.log2(ranks))
    out = {}
    for name, rows in (("protocol-only", proto), ("full", full)):
        small = min(rows, key=lambda r: r["ranks"])  # 2 ranks: no core is shared, each rank's own work
        cpu = {k: v["others_cpu_ms"] / 1e3 for k, v in small["phases"].items()}
        root = {k: v["root_cpu_ms"] / 1e3 for k, v in small["phases"].items()}
        per_rank_bytes = small["archive_mib"] * 1048576 / small["ranks"]
        total_bytes = per_rank_bytes * ranks
        # rank 0's own O(P) loop over the done messages: its CPU slope, fitted over every P measured
        xs = [r["ranks"] for r in rows]
        done_slope = fit(xs, [r["phases"]["done messages"]["root_cpu_ms"] / 1e3 for r in rows])[1]
        if tree == "before":
            msgs = 2 * (ranks - 1)
            vote = msgs * a["send_s"] + ranks * a["vote_bytes_before"] * a["ranks_per_node"] / a["node_link_Bps"]
            place = 0.0  # the counts travelled with the votes
        else:
            vote = 2 * lg * a["round_s"]
            place = lg * a["round_s"]  # the prefix sum; the totals come with the votes
        # The archive's bandwidth: a folder striped wide by its site reaches the file system's; Lustre's default
        # layout (one stripe) one OST's, unless the archive asks for stripes (OOMFLIGHT_ARCHIVE_STRIPES=auto: one
        # per GiB, which the tree before this change did not).
        stripes = max(1, min(2000, math.ceil(total_bytes / 2**30)))
        default_Bps = a["ost_Bps"] if tree == "before" else min(a["fs_Bps"], stripes * a["ost_Bps"])
        for layout_name, file_Bps in (("folder striped wide", a["fs_Bps"]), ("Lustre's default layout", default_Bps)):
            if name == "protocol-only" and layout_name != "folder striped wide":
                continue
            phases = {
                "trigger (origin's sends, then a poll)": ranks * a["send_s"] + a["poll_s"],
                "freeze": cpu["freeze"],
                "safety copy": cpu["safety copy"] + 2 * ranks / a["mds_create_per_s"] + total_bytes / a["fs_Bps"],
                "votes": vote,
                "row placement": place,
                "layout": root["layout"] + a["mds_op_s"] + lg * a["round_s"],
                "rows and sync": cpu["rows and sync"] + total_bytes / file_Bps,
                "agreement": 2 * lg * a["round_s"],
                "verify and rename": root["verify and rename"] + ranks * a["rank_row_bytes"] / a["ost_Bps"]
                                     + 2 * a["mds_op_s"],
                "rename heard": lg * a["round_s"],
                "remove safety copies": ranks / a["mds_unlink_per_s"],
                "done messages (origin)": done_slope * ranks,
            }
            out[f"{name}" + ("" if name == "protocol-only" else f", archive {layout_name}")] = phases
    return out


def print_model(proto, full, ranks):
    before = model(proto, full, ranks, "before")
    after = model(proto, full, ranks, "after")
    print(f"\n### Predicted at {ranks} ranks (seconds)\n")
    scenarios = list(before)
    print("| phase | " + " | ".join(f"{s}: before | after" for s in scenarios) + " |")
    print("|---|" + "---:|---:|" * len(scenarios))
    for phase in before[scenarios[0]]:
        print(f"| {phase} | " + " | ".join(f"{before[s][phase]:.3f} | {after[s][phase]:.3f}" for s in scenarios) + " |")
    print("| **total** | " + " | ".join(f"**{sum(before[s].values()):.2f}** | **{sum(after[s].values()):.2f}**"
                                       for s in scenarios) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", default="2,4,8,16,32,64,128,256")
    ap.add_argument("--events", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--poll-us", type=int, default=10000)
    ap.add_argument("--out", help="also write the measured rows as JSON")
    ap.add_argument("--fit-only", nargs="*", help="report on JSON files written by --out instead of running")
    ap.add_argument("--model", nargs=2, metavar=("PROTOCOL_ONLY.json", "FULL.json"),
                    help="carry the measured constants to --model-ranks ranks (docs/scale.md)")
    ap.add_argument("--model-ranks", default="1024,16384")
    args = ap.parse_args()
    if args.model:
        rows = []
        for path in args.model:
            with open(path) as f:
                rows.append(json.load(f))
        for ranks in args.model_ranks.split(","):
            print_model(rows[0], rows[1], int(ranks))
        return
    if args.fit_only:
        for path in args.fit_only:
            with open(path) as f:
                report(json.load(f))
        return
    rows = [run_one(args.build, int(p), args.events, args.repeats, args.poll_us) for p in args.ranks.split(",")]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    report(rows)


if __name__ == "__main__":
    main()
