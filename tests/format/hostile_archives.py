"""Hostile and damaged archives through `oomflight report`: every one is refused with exit 1 and a message that
names what is wrong, never a signal, never a bare std::bad_alloc, never a report of nonsense as if it were valid.
A damaged copy that still reads as an archive also goes through `report --html` and the three exports, which must
succeed on it.

Usage: hostile_archives.py OOMFLIGHT_CLI FIXTURE_DIR

The cases are crafted from the checked-in v1 fixture (tests/data/v1) with h5py at test time: overflowing offsets,
ids out of range, a world that does not hold its ranks, a dataset declaring 1e10 rows, a file cut short, a file
whose writer never finished, and 300 copies with random bit flips (a fixed seed, so a failure reproduces).
"""
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile

import h5py
import numpy as np

CLI, FIXTURES = sys.argv[1], sys.argv[2]
SOURCE = os.path.join(FIXTURES, "oom-4ranks-2origins.h5")
failures = []


def report(path, timeout=60):
    return subprocess.run([CLI, "report", path], capture_output=True, text=True, errors="replace", timeout=timeout)


def craft(work, name, mutate):
    path = os.path.join(work, name + ".h5")
    shutil.copyfile(SOURCE, path)
    with h5py.File(path, "r+") as f:
        mutate(f)
    return path


def expect_refused(path, *words):
    r = report(path)
    name = os.path.basename(path)
    text = r.stderr + r.stdout
    if r.returncode < 0:
        failures.append(f"{name}: report died of signal {-r.returncode}")
    elif r.returncode != 1:
        failures.append(f"{name}: exit {r.returncode}, expected 1\n{text[:400]}")
    elif "bad_alloc" in text:
        failures.append(f"{name}: a bare std::bad_alloc\n{text[:400]}")
    else:
        missing = [w for w in words if w not in text]
        if missing:
            failures.append(f"{name}: message lacks {missing}: {r.stderr.strip()[:400]}")
    print(f"{name}: exit {r.returncode}: {r.stderr.strip()[:160]}")


def set_rank_field(field, value, row=0):
    def mutate(f):
        ranks = f["ranks"][...]
        ranks[field][row] = value
        f["ranks"][...] = ranks
    return mutate


def set_attr(name, value):
    def mutate(f):
        f.attrs[name] = value
    return mutate


def replace_dataset(name, data=None, shape=None, dtype=None):
    def mutate(f):
        old_dtype = f[name].dtype
        del f[name]
        if data is not None:
            f.create_dataset(name, data=data)
        else:
            f.create_dataset(name, shape=shape, dtype=dtype or old_dtype)
    return mutate


def main():
    work = tempfile.mkdtemp(prefix="oomflight-hostile-")
    try:
        # The untouched fixture reads: the cases below fail because of their damage, not of the copy.
        ok = report(SOURCE)
        if ok.returncode != 0:
            failures.append(f"the fixture itself does not read: {ok.stderr}")

        expect_refused(craft(work, "wrapping-offset", lambda f: (set_rank_field("event_offset", 2**64 - 16)(f),
                                                                  set_rank_field("event_count", 32)(f))),
                       "/ranks", "event_offset")
        expect_refused(craft(work, "events-past-end", set_rank_field("event_count", 10**6)), "/events")
        expect_refused(craft(work, "stack-range-wraps", lambda f: (set_rank_field("stack_offset", 2**63)(f),
                                                                    set_rank_field("stack_count", 2**63)(f))),
                       "stack_offset")
        expect_refused(craft(work, "rank-outside-world", set_rank_field("rank", 7)), "rank 7")
        expect_refused(craft(work, "negative-rank", set_rank_field("rank", -3)), "rank -3")
        expect_refused(craft(work, "duplicate-ranks", set_rank_field("rank", 1, row=0)), "twice")
        expect_refused(craft(work, "origins-outside-world",
                             set_attr("origin_ranks", np.array([7, -1], dtype="<i4"))), "origin_ranks")
        expect_refused(craft(work, "world-size-zero", set_attr("world_size", np.int32(0))), "world_size")
        expect_refused(craft(work, "negative-skipped-windows",
                             set_attr("snapshot_windows_skipped", np.int64(-4))), "snapshot_windows_skipped")

        def no_rank_rows(f):
            dtype = f["ranks"].dtype
            del f["ranks"]
            f.create_dataset("ranks", shape=(0,), dtype=dtype)
        expect_refused(craft(work, "no-rank-rows", no_rank_rows), "/ranks")

        def huge_events(f):
            dtype = f["events"].dtype
            del f["events"]
            f.create_dataset("events", shape=(10**10,), dtype=dtype)  # declared, never written
        expect_refused(craft(work, "1e10-events", huge_events), "/events", "declares")

        def bad_string_offset(f):
            rows = f["strings"][...]
            rows["offset"][0] = 2**64 - 1
            f["strings"][...] = rows
        expect_refused(craft(work, "string-offset-wraps", bad_string_offset), "/strings")

        def bad_stack_frame(f):
            f["stack_frames"][...] = np.full(f["stack_frames"].shape, 2**32 - 1, dtype="<u4")
        expect_refused(craft(work, "stack-frame-out-of-range", bad_stack_frame), "/stack_frames")

        def bad_frame_string(f):
            rows = f["frames"][...]
            rows["function"][0] = 10**9
            f["frames"][...] = rows
        expect_refused(craft(work, "frame-string-out-of-range", bad_frame_string), "/frames")

        def bad_stack_id(f):
            rows = f["events"][...]
            rows["stack_id"][0] = 2**31 - 1
            f["events"][...] = rows
        expect_refused(craft(work, "stack-id-out-of-range", bad_stack_id), "/events", "stack_id")

        def bad_action(f):
            rows = f["events"][...]
            rows["action"][0] = 200
            f["events"][...] = rows
        expect_refused(craft(work, "unknown-action", bad_action), "/events", "action")

        def bad_state_block(f):
            dt = np.dtype({"names": ["rank", "stack_id", "address", "size", "requested_size", "state"],
                           "formats": ["<i4", "<i4", "<u8", "<u8", "<u8", "u1"],
                           "offsets": [0, 4, 8, 16, 24, 32], "itemsize": 40})
            rows = np.zeros(1, dtype=dt)
            rows["rank"], rows["stack_id"], rows["size"] = 0, 1000000, 512
            f.create_dataset("state_blocks", data=rows)
        expect_refused(craft(work, "state-block-stack", bad_state_block), "/state_blocks row 0", "stack_id 1000000")

        def segment_rows(stack_id, segment_type):
            dt = np.dtype({"names": ["rank", "device", "address", "total_size", "stream", "is_expandable",
                                     "segment_type", "stack_id", "segment_pool_id"],
                           "formats": ["<i4", "<i4", "<u8", "<u8", "<u8", "u1", "u1", "<i4", ("<u8", (2,))],
                           "offsets": [0, 4, 8, 16, 24, 32, 33, 36, 40], "itemsize": 56})
            rows = np.zeros(1, dtype=dt)
            rows["total_size"], rows["stack_id"], rows["segment_type"] = 2 << 20, stack_id, segment_type
            return rows

        def bad_state_segment_stack(f):
            f.create_dataset("state_segments", data=segment_rows(1000000, 0))
        expect_refused(craft(work, "state-segment-stack", bad_state_segment_stack), "/state_segments row 0",
                       "stack_id 1000000")

        def bad_state_segment_type(f):
            f.create_dataset("state_segments", data=segment_rows(-1, 7))
        expect_refused(craft(work, "state-segment-type", bad_state_segment_type), "/state_segments row 0",
                       "segment_type 7")

        ops = ["allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "send", "recv", "gather",
               "scatter", "barrier", "other"]

        def collective_rows(rank, op, phase=0):
            op_type = h5py.enum_dtype({name: i for i, name in enumerate(ops)}, basetype="u1")
            dt = np.dtype({"names": ["rank", "peer", "t_ns", "comm_id", "seq", "count", "bytes", "stream", "batch",
                                     "op", "datatype", "phase", "flags"],
                           "formats": ["<i4", "<i4", "<i8", "<u8", "<u8", "<u8", "<u8", "<u8", "<i8", op_type, "u1",
                                       "u1", "u1"],
                           "offsets": [0, 4, 8, 16, 24, 32, 40, 48, 56, 64, 65, 66, 67], "itemsize": 72})
            rows = np.zeros(1, dtype=dt)
            rows["rank"], rows["op"], rows["phase"], rows["peer"], rows["datatype"] = rank, op, phase, -1, 7
            return rows

        expect_refused(craft(work, "collective-op", lambda f: f.create_dataset("collectives",
                                                                              data=collective_rows(0, 200))),
                       "/collectives row 0", "op 200")
        expect_refused(craft(work, "collective-phase", lambda f: f.create_dataset("collectives",
                                                                                 data=collective_rows(0, 0, 9))),
                       "/collectives row 0", "phase 9")
        expect_refused(craft(work, "collective-rank", lambda f: f.create_dataset("collectives",
                                                                                data=collective_rows(9, 0))),
                       "/collectives row 0", "rank 9 is not in /ranks")

        def bad_communicator(f):
            dt = np.dtype({"names": ["rank", "comm_rank", "comm_size", "comm_id", "name"],
                           "formats": ["<i4", "<i4", "<i4", "<u8", "S48"], "offsets": [0, 4, 8, 16, 24],
                           "itemsize": 72})
            rows = np.zeros(1, dtype=dt)
            rows["comm_rank"], rows["comm_size"], rows["name"] = 5, 2, b"world"
            f.create_dataset("communicators", data=rows)
        expect_refused(craft(work, "communicator-rank", bad_communicator), "/communicators row 0", "rank 5 of size 2")

        def not_finished(f):
            f.attrs["producer"] = np.bytes_(b"oomflight 0.2.0")
        expect_refused(craft(work, "no-complete-mark", not_finished), "incomplete archive")
        expect_refused(craft(work, "complete-is-zero", set_attr("complete", np.int32(0))), "incomplete archive")

        cut = os.path.join(work, "cut-short.h5")
        with open(SOURCE, "rb") as src, open(cut, "wb") as dst:
            data = src.read()
            dst.write(data[: len(data) // 2])
        r = report(cut)
        if r.returncode != 1:
            failures.append(f"cut-short.h5: exit {r.returncode}")

        text = os.path.join(work, "text.h5")
        with open(text, "w") as out:
            out.write("not an archive\n")
        expect_refused(text, "not an HDF5 file")

        # Random damage: any outcome but a crash, a hang or a bare bad_alloc is acceptable (a flip in padding
        # leaves a valid archive, which reads with exit 0).
        original = open(SOURCE, "rb").read()
        rng = random.Random(20261123)
        crashes = 0
        for i in range(300):
            damaged = bytearray(original)
            for _ in range(rng.randint(1, 8)):
                k = rng.randrange(len(damaged))
                damaged[k] ^= 1 << rng.randrange(8)
            path = os.path.join(work, "flip.h5")
            with open(path, "wb") as out:
                out.write(damaged)
            r = report(path)
            if r.returncode == 0:
                # Read as an archive: every other reader of it must survive it too (the page, the exports, whatif,
                # diff against the undamaged file).
                for extra in (["report", path, "--html", os.path.join(work, "flip.html")],
                              ["export", path, "--format", "memory_viz", "-o", os.path.join(work, "flip-mv")],
                              ["export", path, "--format", "perfetto", "-o", os.path.join(work, "flip.json")],
                              ["export", path, "--format", "folded", "-o", os.path.join(work, "flip.folded")],
                              ["whatif", path, "--fidelity"],
                              ["whatif", path, "--alloc-conf", "max_split_size_mb:64", "--device-memory", "1GiB"],
                              ["diff", SOURCE, path]):
                    x = subprocess.run([CLI, *extra], capture_output=True, text=True, errors="replace", timeout=60)
                    if x.returncode != 0 or "bad_alloc" in x.stderr:
                        r = x
                        break
            if r.returncode < 0 or r.returncode > 1 or "bad_alloc" in r.stderr:
                crashes += 1
                keep = os.path.join(work, f"crash-{i}.h5")
                shutil.copyfile(path, keep)
                failures.append(f"bit flips #{i}: exit {r.returncode} "
                                f"({signal.Signals(-r.returncode).name if r.returncode < 0 else r.stderr[:200]})")
        print(f"300 bit-flipped copies: {crashes} crashed")
    finally:
        if not failures:
            shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("\n".join(["FAILED:"] + failures), file=sys.stderr)
        print(f"(the damaged files are kept in {work})", file=sys.stderr)
        return 1
    print("every hostile archive was refused with a clear message")
    return 0


if __name__ == "__main__":
    sys.exit(main())
