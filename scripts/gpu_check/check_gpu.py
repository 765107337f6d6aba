"""oomflight's checks on a real GPU (docs/pytorch.md, "The GPU check"), run by scripts/gpu_check/run.sh after the
extension was built against the machine's torch. Each check prints one line and adds itself to OUT/summary.json:

  single   one process, torch's memory history on with Python contexts, oomflight.torch.install(): oomflight's
           events against torch.cuda.memory._snapshot()["device_traces"], entry for entry (action, address,
           size, stream, innermost frames)
  capped   one process capped with set_per_process_memory_fraction, allocating until torch raises a real
           OutOfMemoryError: an archive of one rank, origin 0, whose state rows equal _snapshot()["segments"]
  ranks    examples/pytorch/train.py under mpirun -np 4 on the one GPU (gloo), rank 2 capped: one archive of 4
           ranks, origin 2, whose origin state rows equal rank 2's own snapshot at the error
  steps    the example's median step time, one process, without and with `oomflight run`
  stack_cost  what call sites cost a step (issue 32): a 12-layer transformer (d 768, batch 8 x 1,024 tokens), 80
           steps a run, alternating no recorder, `oomflight run` with its default (oomflight's own Python stacks) and
           `oomflight run` with OOMFLIGHT_STACKS=torch (torch's history with Python stacks), 3 rounds: each run's
           median and p10 step time and allocations a step
  lightning_oom  a Lightning Trainer.fit with OomflightCallback on 2 ranks under mpirun, rank 1 capped until a
           real cudaMalloc failure that nothing catches, 10 runs (alternately the callback alone and under
           `oomflight run`): exit status 1 every time (never a signal), one archive of both ranks naming rank 1,
           and the job over within 20 s of the failure (issue 29: a SIGSEGV after torch's traceback in 2 of 3 runs,
           and 45 s of the survivor's leave agreement)
  torchrun_oom  the example, unchanged, under `oomflight run -- python -m torch.distributed.run` with 2 workers on
           the one GPU (gloo; issue 33: the ranks join through the job's c10d store), rank 1 capped: one archive of
           both ranks, origin 1, whose report names train.py's lines, and the job's own OutOfMemoryError
  allocator_confs  the example's snapshot under expandable_segments:True, max_split_size_mb:64 and
           roundup_power2_divisions:4 (issue 41), saved to OUT/allocator, and the allocator model's fidelity on each
  nccl_headroom  issue 42 under `oomflight run -- torchrun` with NCCL (one worker: NCCL refuses two ranks on one
           GPU): the memory outside the caching allocator per batch (NVML), non-zero before NCCL's communicator and
           larger after it; then 4 GiB kept a step: one headroom archive (OOMFLIGHT_HEADROOM_DUMP=0.5) before the
           real OOM's archive, and the report's growing call site

Usage: check_gpu.py OUT [CHECK...]   (all by default)"""
import glob
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TRAIN = ROOT / "examples/pytorch/train.py"
ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "oom", "snapshot", "step"]  # the archive's numbering (docs/archive-format.md)


def in_child(function: str, path) -> object:
    """Runs one of this file's h5py readers in a Python that has not loaded liboomflight: the library's parallel
    HDF5 1.10 (gpu-check/lib), loaded into the global symbol scope, would otherwise stand in for the HDF5 that the
    machine's h5py was built against ("h5py is running against HDF5 1.10.8 ...", then "Not a datatype")."""
    code = (f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import check_gpu; "
            f"print(json.dumps(check_gpu.{function}({str(path)!r})))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"{function}({path}): {r.stderr[-2000:]}")
    return json.loads(r.stdout.splitlines()[-1])


def tuples(rows):
    """JSON's lists back into the tuples the comparisons expect (nested: an event's frame)."""
    return [tuple(tuple(x) if isinstance(x, list) else x for x in row) for row in rows]


def archive_events(path):
    """(action name, addr, size, stream, innermost frame or None) of rank 0's events, step marks left out."""
    import h5py

    with h5py.File(path, "r") as f:
        strings, blob = f["strings"][()], f["string_data"][()].tobytes()

        def text(i):
            return blob[strings[i]["offset"]: strings[i]["offset"] + strings[i]["length"]].decode()

        def innermost(stack_id):
            if stack_id < 0:
                return None
            st = f["stacks"][stack_id]
            if st["frame_count"] == 0:
                return None
            row = f["frames"][f["stack_frames"][st["frame_offset"]]]
            return (text(row["function"]), text(row["file"]), int(row["line"]))

        out = []
        for e in f["events"][()]:
            action = ACTIONS[int(e["action"])]
            if action != "step":
                out.append((action, int(e["addr"]), int(e["size"]), int(e["stream"]), innermost(int(e["stack_id"]))))
        return out


def torch_events(trace):
    def innermost(entry):
        frames = entry.get("frames") or []
        python = [f for f in frames if f["filename"].endswith(".py")]
        f = python[0] if python else None
        return (f["name"], f["filename"], int(f["line"])) if f else None

    return [(e["action"], int(e["addr"]), int(e["size"]), int(e["stream"]), innermost(e)) for e in trace]


def check_single(out: Path) -> dict:
    import torch

    import oomflight
    import oomflight.torch as ot

    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100000)
    assert ot.install(run_name="gpu-single", folder=str(out / "single"), mark_batches=True), ot.status()
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(5):
        model(torch.randn(256, 1024, device="cuda")).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    trace = torch_events(torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()])
    ours = tuples(in_child("archive_events", oomflight.request_dump("signal").path))
    # The tracker was attached after history began: compare from oomflight's first event on, the two ends aligned.
    # One side may end with entries the other lacks (the first GPU run compared 376 entries shifted by one: torch's
    # trace ended with an entry oomflight's did not): try dropping up to 3 from the end of either, keep the best.
    def aligned(a_list, b_list):
        n = min(len(a_list), len(b_list))
        return a_list[len(a_list) - n:], b_list[len(b_list) - n:]

    candidates = []
    for d in range(4):
        for side, (a_list, b_list) in (("torch", (ours, trace[:len(trace) - d])), ("oomflight", (ours[:len(ours) - d], trace))):
            a_al, b_al = aligned(a_list, b_list)
            candidates.append((sum(1 for a, b in zip(a_al, b_al) if a[:4] == b[:4]) - d, d, side))
    _, dropped, side = max(candidates)
    tail = (trace if side == "torch" else ours)[len(trace if side == "torch" else ours) - dropped:] if dropped else []
    ours, trace = aligned(ours[:len(ours) - dropped] if side == "oomflight" and dropped else ours,
                          trace[:len(trace) - dropped] if side == "torch" and dropped else trace)
    n = len(ours)
    same = sum(1 for a, b in zip(ours, trace) if a[:4] == b[:4])
    same_frames = sum(1 for a, b in zip(ours, trace) if a[:4] == b[:4] and a[4] == b[4])
    with_frames = sum(1 for a in ours if a[4] is not None)
    first_diff = next((i for i, (a, b) in enumerate(zip(ours, trace)) if a != b), None)
    ok = n > 100 and same == n and same_frames == n
    return {"ok": ok, "entries_compared": n, "dropped_from_the_end": {"side": side if dropped else None,
                                                                      "entries": [list(e[:4]) for e in tail]},
            "same_action_addr_size_stream": same, "same_innermost_frame": same_frames,
            "events_with_frames": with_frames, "first_difference": None if first_diff is None else
            {"index": first_diff, "oomflight": ours[first_diff], "torch": trace[first_diff]},
            "counters": ot.status().get("counters")}


def state_rows(path):
    import h5py

    with h5py.File(path, "r") as f:
        segments = [(int(s["address"]), int(s["total_size"]), int(s["stream"])) for s in f["state_segments"][()]]
        blocks = [(int(b["address"]), int(b["size"]), int(b["state"])) for b in f["state_blocks"][()]]
    return sorted(segments), sorted(blocks)


def archive_summary(path):
    """Origins, ranks, the reason, and the state rows of an archive (run in a child: in_child)."""
    import h5py

    with h5py.File(path, "r") as f:
        origins = [int(x) for x in f.attrs["origin_ranks"]]
        ranks = sorted(int(row["rank"]) for row in f["ranks"][()])
        reason = f.attrs["reason"].decode() if isinstance(f.attrs["reason"], bytes) else str(f.attrs["reason"])
        rows = f["ranks"][()]
        names = rows.dtype.names
        # The origin's figures: the device's capacity and free memory as the driver gives them, the cap apart
        # (archives before issue 30's fix have no memory_cap_bytes).
        figures = [{"capacity": int(r["device_capacity_bytes"]), "free": int(r["device_free_bytes"]),
                    "cap": int(r["memory_cap_bytes"]) if "memory_cap_bytes" in names else None}
                   for r in rows if int(r["is_origin"])]
    segments, blocks = state_rows(path)
    return {"origins": origins, "ranks": ranks, "reason": reason, "segments": segments, "blocks": blocks,
            "figures": figures}


def snapshot_rows(snapshot, device):
    states = {"active_allocated": 0, "active_pending_free": 1, "inactive": 2}
    segments, blocks = [], []
    for s in snapshot["segments"]:
        if s["device"] != device:
            continue
        segments.append((int(s["address"]), int(s["total_size"]), int(s["stream"])))
        address = int(s["address"])
        for b in s["blocks"]:
            blocks.append((address, int(b["size"]), states[b["state"]]))
            address += int(b["size"])
    return sorted(segments), sorted(blocks)


def check_capped(out: Path) -> dict:
    code = f"""
import json, torch, oomflight, oomflight.torch as ot
torch.cuda.memory._record_memory_history(max_entries=100000)
ot.install(run_name="gpu-capped", folder={str(out / "capped")!r})
torch.cuda.set_per_process_memory_fraction(0.02)
kept = []
try:
    while True:
        kept.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError as e:
    import pickle
    pickle.dump(torch.cuda.memory._snapshot(), open({str(out / "capped.pickle")!r}, "wb"))
    free, total = torch.cuda.mem_get_info(0)
    print(json.dumps({{"error": str(e).splitlines()[0], "path": oomflight._capi.library().oomflight_last_dump_path().decode(),
                      "total_memory": torch.cuda.get_device_properties(0).total_memory, "free": free}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 or not r.stdout.strip():
        return {"ok": False, "stderr": r.stderr[-3000:]}
    result = json.loads(r.stdout.splitlines()[-1])
    summary = in_child("archive_summary", result["path"])
    origins, ranks, reason = summary["origins"], summary["ranks"], summary["reason"]
    with open(out / "capped.pickle", "rb") as fh:
        snap = pickle.load(fh)
    ours, theirs = (tuples(summary["segments"]), tuples(summary["blocks"])), snapshot_rows(snap, 0)
    # Issue 30: the device's capacity is the device's (not the 2% cap torch hands its observer), the cap is apart.
    figures = summary["figures"][0] if summary["figures"] else {}
    cap_apart = (figures.get("capacity") == result["total_memory"] and figures.get("cap") is not None
                 and 0 < figures["cap"] < figures["capacity"] and " allowed; " in reason)
    ok = origins == [0] and ranks == [0] and ours == theirs and cap_apart
    return {"ok": ok, "archive": result["path"], "torch_error": result["error"], "reason": reason,
            "origins": origins, "segments": [len(ours[0]), len(theirs[0])], "blocks": [len(ours[1]), len(theirs[1])],
            "state_equal": ours == theirs, "figures": figures, "total_memory": result["total_memory"],
            "cap_apart_from_capacity": cap_apart}


def run_job(cmd, cwd, timeout=600):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def check_ranks(out: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix="oomflight-ranks-"))
    snapshots = out / "snapshots"
    r = run_job(["mpirun", "--oversubscribe", "-np", "4", "oomflight", "run", "--run-name", "capped4", "--",
                 sys.executable, str(TRAIN), "--cap-rank", "2", "--cap-gib", "1.5", "--steps", "30",
                 "--snapshot-dir", str(snapshots)], work)
    archives = sorted(glob.glob(str(work / "capped4/oomflight/oom.*.h5")))
    result = {"rc": r.returncode, "archives": [Path(a).name for a in archives], "log_tail": (r.stdout + r.stderr)[-3000:]}
    if len(archives) != 1:
        return {"ok": False, **result}
    summary = in_child("archive_summary", archives[0])
    origins, ranks = summary["origins"], summary["ranks"]
    oom_pickle = snapshots / "rank2.oom.pickle"
    state_equal = None
    if oom_pickle.exists():
        with open(oom_pickle, "rb") as fh:
            snap = pickle.load(fh)
        state_equal = (tuples(summary["segments"]), tuples(summary["blocks"])) == snapshot_rows(snap, 0)
    ok = r.returncode != 0 and origins == [2] and ranks == [0, 1, 2, 3] and state_equal is True
    return {"ok": ok, **result, "origins": origins, "ranks": ranks, "origin_state_equals_rank2_snapshot": state_equal}


def check_steps(out: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix="oomflight-steps-"))
    base = [sys.executable, str(TRAIN), "--steps", "40"]
    times = {}
    for name, cmd in (("without", base), ("with", ["oomflight", "run", "--run-name", "steps", "--"] + base),
                      ("without_again", base)):
        r = run_job(cmd, work)
        m = re.search(r"median step ([0-9.]+) ms", r.stdout)
        times[name] = float(m.group(1)) if m else None
        if not m:
            times[name + "_log"] = (r.stdout + r.stderr)[-2000:]
    ok = all(times.get(k) for k in ("without", "with", "without_again"))
    return {"ok": ok, "median_step_ms": times}


def check_stack_cost(out: Path, rounds: int = 3) -> dict:
    work = Path(tempfile.mkdtemp(prefix="oomflight-stack-cost-"))
    model = [sys.executable, str(TRAIN), "--steps", "80", "--layers", "12", "--dim", "768", "--batch", "8",
             "--seq", "1025"]
    variants = {"none": ([], {}), "oomflight_default": (["oomflight", "run", "--run-name", "cost", "--"], {}),
                "torch_stacks": (["oomflight", "run", "--run-name", "cost", "--"], {"OOMFLIGHT_STACKS": "torch"})}
    runs = {name: [] for name in variants}
    for i in range(rounds):
        for name, (prefix, extra) in variants.items():
            env = dict(os.environ, PYTHONUNBUFFERED="1", **extra)
            r = subprocess.run(prefix + model, cwd=work, env=env, capture_output=True, text=True, timeout=600)
            m = re.search(r"median step ([0-9.]+) ms over \d+ steps \(p10 ([0-9.]+) ms; (\d+) allocations", r.stdout)
            entry = {"round": i, "rc": r.returncode}
            if m:
                entry.update(median_ms=float(m.group(1)), p10_ms=float(m.group(2)), allocations=int(m.group(3)))
            else:
                entry["log_tail"] = (r.stdout + r.stderr)[-2000:]
            runs[name].append(entry)
            print(f"stack_cost round {i} {name}: {entry.get('median_ms')} ms median, {entry.get('p10_ms')} ms p10",
                  flush=True)

    def middle(values):
        values = sorted(v for v in values if v is not None)
        return values[len(values) // 2] if values else None

    summary = {name: {"median_of_medians_ms": middle(e.get("median_ms") for e in rs),
                      "median_of_p10s_ms": middle(e.get("p10_ms") for e in rs),
                      "allocations_a_step": middle(e.get("allocations") for e in rs)} for name, rs in runs.items()}
    ok = all(e.get("median_ms") for rs in runs.values() for e in rs)
    return {"ok": ok, "summary": summary, "runs": runs}


LIGHTNING_OOM = """
import os, sys, time
from pathlib import Path
import torch, pytorch_lightning as pl
from pytorch_lightning.plugins.environments import LightningEnvironment
from torch.utils.data import DataLoader, TensorDataset
from oomflight.integrations.lightning import OomflightCallback

rank = int(os.environ["OMPI_COMM_WORLD_RANK"])  # two independent trainers (no mpi4py detection), one GPU

class Grows(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(64, 64)
        self.kept = []
    def training_step(self, batch, batch_idx):
        if rank == 1 and batch_idx == 3:
            torch.cuda.set_per_process_memory_fraction(0.02)
            Path("failing.1").write_text(repr(time.time()))
            while True:  # a real cudaMalloc failure, uncaught: torch.OutOfMemoryError ends the rank
                self.kept.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = DataLoader(TensorDataset(torch.randn(64, 64), torch.randn(64, 64)), batch_size=8)
trainer = pl.Trainer(max_epochs=1, accelerator="gpu", devices=1, enable_checkpointing=False, logger=False,
                     enable_progress_bar=False, enable_model_summary=False, plugins=[LightningEnvironment()],
                     callbacks=[OomflightCallback(folder="out", run_name="lightning-oom")])
trainer.fit(Grows(), data)
"""


def check_lightning_oom(out: Path, runs: int = 10) -> dict:
    lightning = ROOT / "gpu-check" / "python"
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=f"{lightning}:{os.environ.get('PYTHONPATH', '')}".rstrip(":"))
    results = []
    for i in range(runs):
        work = Path(tempfile.mkdtemp(prefix=f"oomflight-lightning-{i}-"))
        (work / "train.py").write_text(LIGHTNING_OOM)
        under_run = i % 2 == 1
        rank = (["oomflight", "run", "--"] if under_run else []) + [sys.executable, "train.py"]
        start = time.time()
        r = subprocess.run(["mpirun", "--oversubscribe", "-np", "2", *rank], cwd=work, env=env, capture_output=True,
                           text=True, timeout=600)
        ended = time.time()
        log = r.stdout + r.stderr
        failing = work / "failing.1"
        # The callback's folder, or `oomflight run`'s default ({run_name}/oomflight: its import hook starts oomflight
        # before the callback's setup).
        archives = sorted(str(p) for p in work.rglob("*.h5"))
        summary = in_child("archive_summary", archives[0]) if len(archives) == 1 else {}
        result = {"run": i, "under_oomflight_run": under_run, "rc": r.returncode,
                  "seconds_after_failure": round(ended - float(failing.read_text()), 1) if failing.exists() else None,
                  "archives": [Path(a).name for a in archives], "origins": summary.get("origins"),
                  "ranks": summary.get("ranks"),
                  "crash": any(w in log for w in ("Segmentation fault", "signal 11", "core dumped", "Aborted")),
                  "waited": "within OOMFLIGHT_DUMP_TIMEOUT" in log}
        result["ok"] = (r.returncode == 1 and not result["crash"] and not result["waited"] and
                        result["origins"] == [1] and result["ranks"] == [0, 1] and
                        result["seconds_after_failure"] is not None and result["seconds_after_failure"] < 20)
        if not result["ok"]:
            result["log_tail"] = log[-3000:]
        results.append(result)
        print(f"lightning_oom run {i}: rc {r.returncode}, {result['seconds_after_failure']} s after the failure, "
              f"{'ok' if result['ok'] else 'FAILED'}", flush=True)
    return {"ok": all(x["ok"] for x in results), "exit_codes": [x["rc"] for x in results], "runs": results}


def check_torchrun_oom(out: Path) -> dict:
    """Issue 33 on a GPU: the example, unchanged, under `oomflight run -- torchrun` (2 workers sharing the GPU: gloo,
    the c10d store of torchrun's agent), rank 1 capped: one archive of both ranks naming rank 1, whose call sites
    name train.py's lines (issue 32), and the job's own OutOfMemoryError."""
    work = Path(tempfile.mkdtemp(prefix="oomflight-torchrun-"))
    r = run_job(["oomflight", "run", "--run-name", "torchrun2", "--", sys.executable, "-m", "torch.distributed.run",
                 "--standalone", "--nproc-per-node", "2", str(TRAIN), "--cap-rank", "1", "--cap-gib", "1.5",
                 "--steps", "30"], work)
    log = r.stdout + r.stderr
    archives = sorted(a for a in glob.glob(str(work / "**/oom.*.h5"), recursive=True) if ".rank" not in a)
    result = {"rc": r.returncode, "archives": [str(Path(a).relative_to(work)) for a in archives],
              "log_tail": log[-3000:]}
    if len(archives) != 1:
        return {"ok": False, **result}
    summary = in_child("archive_summary", archives[0])
    report = subprocess.run(["oomflight", "report", archives[0]], capture_output=True, text=True).stdout
    names_lines = "train.py:" in report
    ok = (r.returncode != 0 and summary["origins"] == [1] and summary["ranks"] == [0, 1] and names_lines
          and "torch.OutOfMemoryError" in log)
    return {"ok": ok, **result, "origins": summary["origins"], "ranks": summary["ranks"],
            "report_names_train_py_lines": names_lines, "report_head": report[:3000]}


ALLOC_CONFS = {"expandable": "expandable_segments:True", "max_split_64": "max_split_size_mb:64",
               "roundup_4": "roundup_power2_divisions:4"}


def check_allocator_confs(out: Path) -> dict:
    """Issue 41 on a GPU: the example's snapshot (as examples/pytorch/snapshots' was made) under three
    PYTORCH_CUDA_ALLOC_CONF settings, each in a process of its own (the allocator reads the setting at CUDA's first
    use), saved to OUT/allocator/<name>.pickle (to commit into examples/pytorch/snapshots), and the model's fidelity
    on each: `oomflight whatif --fidelity`. max_split_size_mb and roundup_power2_divisions are modelled: every
    allocation and segment event as recorded is the target; expandable segments are not modelled yet, so that case
    only records its snapshot and what --fidelity says of it (the counts are the next session's measure)."""
    result = {}
    ok = True
    for name, conf in ALLOC_CONFS.items():
        work = out / "allocator" / name
        work.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
        r = subprocess.run([sys.executable, str(TRAIN), "--steps", "3", "--snapshot-dir", str(work)],
                           capture_output=True, text=True, env=env, timeout=600)
        pickles = sorted(work.glob("*.pickle"))
        entry = {"conf": conf, "rc": r.returncode, "snapshots": [p.name for p in pickles],
                 "log_tail": (r.stdout + r.stderr)[-1500:]}
        if r.returncode != 0 or not pickles:
            ok = False
            result[name] = entry
            continue
        saved = out / "allocator" / f"{name}.pickle"
        step1 = [p for p in pickles if p.name.endswith(".step1.pickle")]
        saved.write_bytes((step1 or pickles)[-1].read_bytes())  # after the second step, as the committed one
        f = subprocess.run(["oomflight", "whatif", str(saved), "--fidelity"], capture_output=True, text=True)
        entry["fidelity"] = (f.stdout + f.stderr).strip()
        m = re.search(r"fidelity: (\d+) of (\d+) allocations at the recorded address, (\d+) of (\d+) segment events",
                      f.stdout)
        if m is None:
            ok = False
        else:
            a, b, c, d = map(int, m.groups())
            entry["allocations"] = [a, b]
            entry["segment_events"] = [c, d]
            if name != "expandable":
                ok = ok and b > 100 and a == b and c == d
        result[name] = entry
    return {"ok": ok, **result}


NCCL_HEADROOM_JOB = '''
import time, torch, torch.distributed as dist, oomflight
dist.init_process_group("nccl")
torch.cuda.set_device(0)
x = torch.ones(1 << 20, device="cuda")
oomflight.mark_batch(0)
time.sleep(1.2)  # NVML is sampled at a batch's start, at most once a second
oomflight.mark_batch(1)  # batch 0's row: before NCCL's communicator
dist.all_reduce(x)  # NCCL makes its communicator (its buffers, outside the caching allocator)
torch.cuda.synchronize()
time.sleep(1.2)
oomflight.mark_batch(2)  # batch 1's row: after it
kept = []


def keep():
    kept.append(torch.empty(4 << 30, dtype=torch.uint8, device="cuda"))


for step in range(3, 1000):
    keep()
    oomflight.mark_batch(step)
'''


def batch_outside(path):
    import h5py

    with h5py.File(path, "r") as f:
        return [[int(b["batch"]), int(b["outside_allocator_bytes"])] for b in f["batches"][()]]


def check_nccl_headroom(out: Path) -> dict:
    """Issue 42, items 1, 4 and 5 on a GPU: NVML's count of the process less reserved, per batch, before and after
    NCCL's communicator; the headroom archive before the real OOM's; the report naming the growing call site."""
    work = Path(tempfile.mkdtemp(prefix="oomflight-nccl-headroom-"))
    (work / "job.py").write_text(NCCL_HEADROOM_JOB)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OOMFLIGHT_HEADROOM_DUMP="0.5")
    r = subprocess.run(["oomflight", "run", "--run-name", "headroom", "--", sys.executable, "-m",
                        "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "job.py"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=600)
    log = r.stdout + r.stderr
    headroom = sorted(glob.glob(str(work / "**/headroom.*.h5"), recursive=True))
    oom = sorted(a for a in glob.glob(str(work / "**/oom.*.h5"), recursive=True) if ".rank" not in a)
    result = {"rc": r.returncode, "headroom": [Path(a).name for a in headroom], "oom": [Path(a).name for a in oom],
              "log_tail": log[-3000:]}
    if len(headroom) != 1 or len(oom) != 1:
        return {"ok": False, **result}
    rows = in_child("batch_outside", oom[0])
    before = next((o for b, o in rows if b == 0), -1)
    after = next((o for b, o in rows if b == 1), -1)
    report = subprocess.run(["oomflight", "report", oom[0]], capture_output=True, text=True).stdout
    headroom_batch = int(re.search(r"headroom\.(\d+)", Path(headroom[0]).name).group(1))
    oom_batch = int(re.search(r"oom\.(\d+)", Path(oom[0]).name).group(1))
    ok = (r.returncode != 0 and 0 < before < after and headroom_batch < oom_batch
          and "keep (" in report and "torch.OutOfMemoryError" in log)
    return {"ok": ok, **result, "outside_before_nccl": before, "outside_after_nccl": after, "batches": rows,
            "headroom_batch": headroom_batch, "oom_batch": oom_batch, "report_head": report[:4000]}


CHECKS = {"single": check_single, "capped": check_capped, "ranks": check_ranks, "steps": check_steps,
          "stack_cost": check_stack_cost, "lightning_oom": check_lightning_oom, "torchrun_oom": check_torchrun_oom,
          "allocator_confs": check_allocator_confs, "nccl_headroom": check_nccl_headroom}


def main() -> int:
    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    names = sys.argv[2:] or list(CHECKS)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    import torch

    if not torch.cuda.is_available():
        summary["machine"] = {"torch": torch.__version__, "device": None, "python": sys.version.split()[0]}
        summary_path.write_text(json.dumps(summary, indent=1))
        print(f"check_gpu.py: torch {torch.__version__} sees no CUDA device: these checks need one", file=sys.stderr)
        return 2
    summary["machine"] = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                          "python": sys.version.split()[0]}
    for name in names:
        start = time.monotonic()
        try:
            summary[name] = CHECKS[name](out)
        except Exception as e:  # noqa: BLE001 - a failed check is a result, the others still run
            import traceback

            summary[name] = {"ok": False, "exception": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc()[-4000:]}
        summary[name]["seconds"] = round(time.monotonic() - start, 1)
        print(f"{name}: {'ok' if summary[name]['ok'] else 'FAILED'} ({summary[name]['seconds']} s)", flush=True)
        summary_path.write_text(json.dumps(summary, indent=1, default=str))
    return 0 if all(summary[n]["ok"] for n in names) else 1


if __name__ == "__main__":
    sys.exit(main())
