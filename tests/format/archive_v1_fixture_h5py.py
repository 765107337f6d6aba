#!/usr/bin/env python3
"""Reads the schema-v1 fixtures (tests/data/v1) with h5py alone, as docs/archive-format.md tells a user to, and
checks every documented dataset, field and attribute. Usage: archive_v1_fixture_h5py.py FIXTURE_DIR"""
import sys

import h5py
import numpy as np

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


RANK_FIELDS = ["rank", "local_rank", "device", "is_origin", "pid", "batch", "allocated_bytes", "reserved_bytes",
               "peak_allocated_bytes", "peak_reserved_bytes", "device_capacity_bytes", "device_free_bytes",
               "oom_requested_bytes", "event_offset", "event_count", "events_recorded", "overwritten", "dropped",
               "unreadable", "stack_offset", "stack_count", "frame_offset", "frame_count", "string_offset",
               "string_count", "freeze_t_ns", "anchor_monotonic_ns", "anchor_realtime_ns", "host", "reason"]
EVENT_FIELDS = ["t_ns", "addr", "size", "stream", "batch", "stack_id", "device", "action"]
ACTIONS = {"alloc": 0, "free_requested": 1, "free_completed": 2, "segment_alloc": 3, "segment_free": 4,
           "segment_map": 5, "segment_unmap": 6, "oom": 7, "snapshot": 8, "step": 9}


def check_layout(f, name):
    for attr in ["schema_version", "producer", "run_name", "kind", "created_at_utc", "reason", "origin_ranks",
                 "world_size", "ranks_present"]:
        check(attr in f.attrs, f"{name}: root attribute {attr}")
    check(int(f.attrs["schema_version"]) == 1, f"{name}: schema_version 1")
    for ds in ["events", "ranks", "stacks", "stack_frames", "frames", "strings", "string_data"]:
        check(ds in f, f"{name}: dataset /{ds}")
    check(list(f["ranks"].dtype.names) == RANK_FIELDS, f"{name}: /ranks fields {f['ranks'].dtype.names}")
    check(list(f["events"].dtype.names) == EVENT_FIELDS, f"{name}: /events fields {f['events'].dtype.names}")
    check(f["events"].dtype.itemsize == 48, f"{name}: events are 48 bytes")
    check(h5py.check_enum_dtype(f["events"].dtype["action"]) == ACTIONS, f"{name}: action enumeration")
    check(list(f["stacks"].dtype.names) == ["frame_offset", "frame_count"], f"{name}: /stacks fields")
    check(list(f["frames"].dtype.names) == ["function", "file", "line"], f"{name}: /frames fields")
    check(list(f["strings"].dtype.names) == ["offset", "length"], f"{name}: /strings fields")
    check(f["stack_frames"].dtype == np.uint32 and f["string_data"].dtype == np.uint8, f"{name}: blob types")


def strings_of(f):
    rows = f["strings"][:]
    blob = f["string_data"][:].tobytes()
    return lambda i: blob[rows[i]["offset"]: rows[i]["offset"] + rows[i]["length"]].decode()


def frames_of(f, stack_id):
    s = strings_of(f)
    st = f["stacks"][stack_id]
    ids = f["stack_frames"][st["frame_offset"]: st["frame_offset"] + st["frame_count"]]
    return [(s(fr["function"]), s(fr["file"]), int(fr["line"])) for fr in f["frames"][:][ids]]  # in memory: h5py reads listed rows in increasing order


def check_rank(f, name, row, origin):
    rank = int(row["rank"])
    count = 1 + (20 if name.startswith("oom-4") else 5) + 10 * rank + (1 if origin else 0)
    check(int(row["event_count"]) == count, f"{name}: rank {rank} event_count {row['event_count']} != {count}")
    check(int(row["events_recorded"]) == count, f"{name}: rank {rank} events_recorded")
    check(int(row["is_origin"]) == int(origin), f"{name}: rank {rank} is_origin")
    check(int(row["oom_requested_bytes"]) == (4096 * (rank + 1) if origin else 0), f"{name}: rank {rank} request")
    check(int(row["device_capacity_bytes"]) == 4_000_000, f"{name}: rank {rank} capacity")
    check(int(row["reserved_bytes"]) == 2_000_000, f"{name}: rank {rank} reserved")
    check(text(row["reason"]) == (f"driver: out of memory on rank {rank}" if origin else ""), f"{name}: reason")
    ev = f["events"][row["event_offset"]: row["event_offset"] + row["event_count"]]
    check(ev[0]["action"] == ACTIONS["step"], f"{name}: rank {rank} starts with a step event")
    allocs = ev[ev["action"] == ACTIONS["alloc"]]
    check(np.all(allocs["size"] == 1000 + rank), f"{name}: rank {rank} alloc sizes")
    check(frames_of(f, allocs[0]["stack_id"]) == [("train_step", "driver.py", rank + 1)],
          f"{name}: rank {rank} stack {frames_of(f, allocs[0]['stack_id'])}")
    if origin:
        check(ev[-1]["action"] == ACTIONS["oom"] and ev[-1]["size"] == 4096 * (rank + 1) and ev[-1]["addr"] == 77,
              f"{name}: rank {rank} ends with its oom event")
    # The anchors put every rank on one UTC axis.
    utc = int(row["freeze_t_ns"]) - int(row["anchor_monotonic_ns"]) + int(row["anchor_realtime_ns"])
    check(1_790_000_000e9 < utc < 1_800_000_000e9, f"{name}: rank {rank} freeze time {utc} is in November 2026")


def main(folder):
    with h5py.File(f"{folder}/oom-4ranks-2origins.h5", "r") as f:
        name = "oom-4ranks-2origins.h5"
        check_layout(f, name)
        check(text(f.attrs["kind"]) == "oom", f"{name}: kind")
        check(text(f.attrs["run_name"]) == "v1-fixture", f"{name}: run_name")
        check(text(f.attrs["producer"]) == "oomflight 0.1.0", f"{name}: producer")
        check(list(f.attrs["origin_ranks"]) == [2, 3], f"{name}: origin_ranks")
        check(list(f.attrs["ranks_present"]) == [0, 1, 2, 3], f"{name}: ranks_present")
        check(int(f.attrs["world_size"]) == 4, f"{name}: world_size")
        check(text(f.attrs["reason"]).splitlines() == ["rank 2: driver: out of memory on rank 2",
                                                        "rank 3: driver: out of memory on rank 3"], f"{name}: reason")
        ranks = f["ranks"][:]
        check(list(ranks["rank"]) == [0, 1, 2, 3], f"{name}: ranks in order")
        check(list(ranks["event_offset"]) == [0, 21, 52, 94], f"{name}: event offsets")
        for row in ranks:
            check_rank(f, name, row, int(row["rank"]) >= 2)
    with h5py.File(f"{folder}/rank-local-rank1-of-4.h5", "r") as f:
        name = "rank-local-rank1-of-4.h5"
        check_layout(f, name)
        check(list(f.attrs["ranks_present"]) == [1] and int(f.attrs["world_size"]) == 4, f"{name}: one rank of 4")
        check(list(f.attrs["origin_ranks"]) == [1], f"{name}: origin_ranks")
        ranks = f["ranks"][:]
        check(len(ranks) == 1, f"{name}: one /ranks row")
        check_rank(f, name, ranks[0], True)
    for failure in failures:
        print("FAILED:", failure)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
