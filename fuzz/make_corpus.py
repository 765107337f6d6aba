#!/usr/bin/python3
"""Writes the fuzz targets' seed corpus (fuzz/corpus/), checked in so that CI runs the same inputs every time.

Usage: fuzz/make_corpus.py   (Debian's python3: it needs h5py and numpy)

pickle/: a small snapshot as PyTorch writes it (protocol 4, the memo sharing frames), and the hostile cases the
reader must refuse: cycles, a memo bomb, code-loading opcodes, a torch.save zip, gzip, protocol 0, truncations.
archive/: the checked-in v1 fixture (tests/data/v1) in archive_fuzz.cpp's input layout, and the crafted cases of
tests/format/hostile_archives.py (offsets that wrap, ranks outside the world, duplicate ranks, no rows, ...).
"""
import gzip
import os
import pickle
import struct

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "tests", "data", "v1", "oom-4ranks-2origins.h5")
DATASETS = ["ranks", "events", "stacks", "stack_frames", "frames", "strings", "string_data", "batches", "context",
            "collectives", "communicators"]
# CollectiveRow and CommunicatorRow (archive_schema.hpp), 72 bytes each; the op member is an enumeration in the
# file, a byte here.
COLLECTIVE = np.dtype({"names": ["rank", "peer", "t_ns", "comm_id", "seq", "count", "bytes", "stream", "batch", "op",
                                 "datatype", "phase", "flags"],
                       "formats": ["<i4", "<i4", "<i8", "<u8", "<u8", "<u8", "<u8", "<u8", "<i8", "u1", "u1", "u1",
                                   "u1"],
                       "offsets": [0, 4, 8, 16, 24, 32, 40, 48, 56, 64, 65, 66, 67], "itemsize": 72})
COMMUNICATOR = np.dtype({"names": ["rank", "comm_rank", "comm_size", "comm_id", "name"],
                         "formats": ["<i4", "<i4", "<i4", "<u8", "S48"], "offsets": [0, 4, 8, 16, 24],
                         "itemsize": 72})
WORLD = 0x6f6f6d776f726c64
# BatchRow (core/format/include/oomflight/format/archive_schema.hpp), 104 bytes; the v1 fixture has no /batches.
BATCH = np.dtype([("rank", "<i4"), ("device", "<i4"), ("batch", "<i8"), ("start_t_ns", "<i8"), ("end_t_ns", "<i8")] +
                 [(name, "<u8") for name in ("allocated_bytes", "reserved_bytes", "peak_allocated_bytes",
                                             "peak_reserved_bytes", "device_capacity_bytes", "device_free_bytes",
                                             "alloc_events", "free_events", "oom_events")] +
                 [("outside_allocator_bytes", "<i8")])  # since 0.3 (issue 42): -1 unknown


def write(kind, name, data):
    path = os.path.join(HERE, "corpus", kind, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def small_snapshot():
    frames = [{"filename": "train.py", "line": 12, "name": "forward"}, {"filename": "torch/nn.py", "line": 3,
                                                                        "name": "linear"}]
    trace = []
    for i in range(6):
        trace.append({"action": "alloc", "addr": 0x7f0000000000 + 512 * i, "size": 512, "stream": 0,
                      "time_us": 1000 + i, "frames": frames})
    trace.append({"action": "free_requested", "addr": 0x7f0000000000, "size": 512, "stream": 0, "frames": frames})
    trace.append({"action": "free_completed", "addr": 0x7f0000000000, "size": 512, "stream": 0, "frames": frames})
    trace.append({"action": "oom", "addr": 0, "size": 1 << 30, "stream": 0, "frames": []})
    segment = {"device": 0, "address": 0x7f0000000000, "total_size": 2 << 20, "allocated_size": 2560,
               "active_size": 2560, "stream": 0, "segment_type": "large", "is_expandable": False,
               "blocks": [{"address": 0x7f0000000000 + 512, "size": 2560, "requested_size": 2560,
                           "state": "active_allocated", "frames": frames}]}
    return {"segments": [segment], "device_traces": [trace], "allocator_settings": {}}


def pickles():
    good = pickle.dumps(small_snapshot(), protocol=4)
    write("pickle", "snapshot-protocol4", good)
    write("pickle", "snapshot-protocol2", pickle.dumps(small_snapshot(), protocol=2))
    write("pickle", "snapshot-truncated", good[: len(good) // 2])
    loop = []
    loop.append(loop)
    write("pickle", "cycle-self", pickle.dumps(loop, protocol=4))
    a, b = [], []
    a.append(b)
    b.append(a)
    write("pickle", "cycle-ancestor", pickle.dumps(a, protocol=4))
    d = {}
    d["self"] = d
    write("pickle", "cycle-dict", pickle.dumps(d, protocol=4))
    entry = {"action": "alloc", "addr": 1, "size": 2, "frames": []}
    write("pickle", "memo-bomb", pickle.dumps({"segments": [], "device_traces": [[entry] * 500] * 500}, protocol=4))
    write("pickle", "code-global", b"\x80\x02cposix\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03.")
    write("pickle", "torch-save-zip", b"PK\x03\x04" + bytes(26))
    write("pickle", "gzip", gzip.compress(good))
    write("pickle", "protocol0", pickle.dumps([1, "a"], protocol=0))
    write("pickle", "deep", b"\x80\x04" + b"]" * 3000 + b"a" * 2999 + b".")


def encode(attrs, rows, flags=1):
    out = bytearray([flags])
    out += struct.pack("<ii", attrs["schema_version"], attrs["world_size"])
    for key in ("origin_ranks", "ranks_present"):
        values = list(attrs[key])
        out += bytes([len(values)]) + b"".join(struct.pack("<i", v) for v in values)
    for name in DATASETS:
        data = rows[name]
        out += struct.pack("<H", len(data)) + data.tobytes()
    return bytes(out)


def archives():
    with h5py.File(FIXTURE, "r") as f:
        base_attrs = {"schema_version": 1, "world_size": int(f.attrs["world_size"]),
                      "origin_ranks": f.attrs["origin_ranks"], "ranks_present": f.attrs["ranks_present"]}
        base_rows = {name: f[name][...] for name in DATASETS if name in f}
    # The fixture's /ranks rows predate the collective counts (0.2.1) and the memory cap and the figures' source
    # (issue 30) and the memory outside the allocator (issue 42): the fuzz target writes today's rows (RankRow: 4
    # bytes of padding after numbers_from_message's 4, then outside_allocator_bytes).
    old = base_rows["ranks"]
    added = [("collectives_recorded", "<u8", 0), ("collectives_overwritten", "<u8", 8),
             ("collectives_in_flight", "<u8", 16), ("memory_cap_bytes", "<u8", 24), ("numbers_from_message", "<u4", 32),
             ("outside_allocator_bytes", "<i8", 40)]
    ranks = np.zeros(len(old), dtype=np.dtype({
        "names": list(old.dtype.names) + [n for n, _, _ in added],
        "formats": [old.dtype.fields[n][0] for n in old.dtype.names] + [f for _, f, _ in added],
        "offsets": [old.dtype.fields[n][1] for n in old.dtype.names] + [old.dtype.itemsize + o for _, _, o in added],
        "itemsize": old.dtype.itemsize + 48}))
    for name in old.dtype.names:
        ranks[name] = old[name]
    ranks["outside_allocator_bytes"] = -1  # unknown, as an archive written without NVML says
    base_rows["ranks"] = ranks
    # Ranks 0, 1 and 3 wait in allreduce #1 on the world communicator, which rank 2 (an origin) never entered.
    collectives = np.zeros(9, dtype=COLLECTIVE)
    collectives["rank"] = [0, 0, 0, 1, 1, 1, 2, 2, 3]
    collectives["seq"] = [0, 0, 1, 0, 0, 1, 0, 0, 1]
    collectives["phase"] = [0, 1, 0, 0, 1, 0, 0, 1, 0]
    collectives["t_ns"] = [10, 20, 30] * 3
    collectives["comm_id"], collectives["peer"], collectives["datatype"], collectives["bytes"] = WORLD, -1, 7, 8 << 20
    base_rows["collectives"] = collectives
    communicators = np.zeros(4, dtype=COMMUNICATOR)
    communicators["rank"] = communicators["comm_rank"] = [0, 1, 2, 3]
    communicators["comm_size"], communicators["comm_id"], communicators["name"] = 4, WORLD, b"world"
    base_rows["communicators"] = communicators
    batches = np.zeros(8, dtype=BATCH)
    batches["rank"] = [0, 0, 1, 1, 2, 2, 3, 3]
    batches["batch"] = [0, 1] * 4
    batches["peak_allocated_bytes"] = 1 << 30
    batches["device_capacity_bytes"] = 40 << 30
    batches["outside_allocator_bytes"] = -1
    base_rows["batches"] = batches
    # ContextRow, 24 bytes: rank 1's first two strings as a key/value pair.
    context_dtype = np.dtype({"names": ["rank", "kind", "batch", "key", "value"],
                              "formats": ["<i4", "u1", "<i8", "<u4", "<u4"], "offsets": [0, 4, 8, 16, 20],
                              "itemsize": 24})
    context = np.zeros(1, dtype=context_dtype)
    context["rank"], context["kind"] = 1, 1
    context["key"], context["value"] = int(base_rows["ranks"]["string_offset"][1]), int(base_rows["ranks"]["string_offset"][1]) + 1
    base_rows["context"] = context

    def case(name, flags=1, attrs=None, **fields):
        a = dict(base_attrs, **(attrs or {}))
        rows = {k: v.copy() for k, v in base_rows.items()}
        for key, value in fields.items():
            if key in rows:
                rows[key] = value
            else:
                field, row = key.rsplit("__", 1)
                rows["ranks"][field][int(row)] = value
        write("archive", name, encode(a, rows, flags))

    case("valid")
    case("valid-v01-no-mark", flags=4)
    case("no-complete-mark", flags=0)
    case("complete-zero", flags=3)
    case("event-offset-wraps", event_offset__0=np.uint64(2**64 - 1), event_count__0=np.uint64(2))
    case("string-offset-wraps", string_offset__1=np.uint64(2**64 - 8), string_count__1=np.uint64(16))
    # Found by the fuzzer: times at the ends of int64 overflowed in the report's arithmetic (UBSan).
    case("times-at-int64-ends", freeze_t_ns__2=np.int64(2**63 - 1), anchor_monotonic_ns__2=np.int64(-2**63),
         anchor_realtime_ns__2=np.int64(2**63 - 1))
    # Found by the fuzzer: an address or size above 2^63 became a 9-byte LONG1 in the memory_viz export, which the
    # strict reader refused to read back; and sizes near 2^64 overflowed the exporters' sums.
    big = base_rows["events"].copy()
    big["addr"][:4] = np.uint64(2**64 - 4096)
    big["size"][:4] = np.uint64(2**64 - 1)
    case("sizes-above-2-63", events=big)
    case("rank-outside-world", rank__3=7)
    unknown = batches.copy()
    unknown["rank"][0] = 9
    case("batches-rank-unknown", batches=unknown)
    shuffled = batches.copy()
    shuffled["rank"] = [0, 1, 0, 1, 2, 2, 3, 3]
    case("batches-not-grouped", batches=shuffled)
    foreign = context.copy()
    foreign["value"] = 0  # rank 0's string
    case("context-string-of-another-rank", context=foreign)
    case("duplicate-rank", rank__1=0)
    case("origins-outside", attrs={"origin_ranks": [7, -1]})
    case("world-zero", attrs={"world_size": 0})
    case("newer-schema", attrs={"schema_version": 99})
    case("no-ranks", attrs={"ranks_present": []}, ranks=base_rows["ranks"][:0])
    events = base_rows["events"].copy()
    events["stack_id"][0] = 1000
    case("stack-id-outside", events=events)
    frames = base_rows["stack_frames"].copy()
    frames[0] = 4000000000
    case("frame-outside", stack_frames=frames)
    strings = base_rows["strings"].copy()
    strings["offset"][0] = 2**63
    case("string-outside", strings=strings)
    bad_op = collectives.copy()
    bad_op["op"][4] = 200
    case("collective-op-outside", collectives=bad_op)
    not_grouped = collectives.copy()
    not_grouped["rank"][8] = 0
    case("collectives-not-grouped", collectives=not_grouped)
    bad_comm = communicators.copy()
    bad_comm["comm_rank"][3] = 4
    case("communicator-rank-outside", communicators=bad_comm)
    # Issue 30: rows that made the analysis quadratic. Rank 0 enters 4,096 operations, each on a communicator of its
    # own (one verdict each); rank 1 has 2,048 ends whose starts never came, then 2,048 starts.
    distinct = np.zeros(4096, dtype=COLLECTIVE)
    distinct["comm_id"] = np.arange(1, 4097, dtype=np.uint64)
    distinct["t_ns"] = np.arange(4096) + 10
    distinct["peer"], distinct["datatype"] = -1, 7
    case("collectives-distinct-communicators", collectives=distinct)
    orphans = np.zeros(4096, dtype=COLLECTIVE)
    orphans["rank"] = 1
    orphans["comm_id"], orphans["peer"], orphans["datatype"] = WORLD, -1, 7
    orphans["seq"] = np.arange(4096, dtype=np.uint64)
    orphans["phase"][:2048] = 1
    orphans["t_ns"] = np.arange(4096) + 10
    case("collectives-orphan-ends", collectives=orphans)
    # Found by the fuzzer: an operation in flight whose start is INT64_MIN overflowed the HTML report's
    # `end - start` (the time it had been in flight); every duration now wraps (seconds_between).
    extreme = base_rows["collectives"].copy()
    extreme["t_ns"][extreme["phase"] == 0] = np.int64(-2**63)
    case("collective-times-at-int64-min", collectives=extreme)


if __name__ == "__main__":
    pickles()
    archives()
