"""What the Python package's tests share: the built liboomflight and `oomflight` (passed by ctest as
OOMFLIGHT_LIBRARY, a real setting, and TEST_CLI), a scratch folder, and archives read with h5py."""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py

PYTHON_ROOT = Path(__file__).resolve().parent.parent  # python/, holding the package
CLI = os.environ.get("TEST_CLI", "")
# The real-torch tests: the package installed with its extension built against the torch environment's torch
# (test_torch_install.py puts it there; ctest passes the folder). Empty elsewhere.
TORCH_SITE = os.environ.get("TEST_TORCH_SITE", "")
MPIRUN_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
              "OMPI_MCA_rmaps_base_oversubscribe": "1"}


_scratch_dirs: list[Path] = []


def scratch() -> Path:
    """A fresh folder, removed when the test process exits."""
    path = Path(tempfile.mkdtemp(prefix="oomflight-py-"))
    _scratch_dirs.append(path)
    return path


@atexit.register
def _remove_scratch() -> None:
    for path in _scratch_dirs:
        shutil.rmtree(path, ignore_errors=True)


def copy_package_sources(root: Path) -> Path:
    """Copies what `pip install ./python` reads under `root`, laid out as in a clone: python/ (its cpp/ links kept as
    links) and the C++ tree they point to, without build leftovers; an install from the copy leaves nothing in the
    checkout. Returns root / "python"."""
    checkout = PYTHON_ROOT.parent
    leftovers = shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "_torch_plugin")
    shutil.copytree(PYTHON_ROOT, root / "python", symlinks=True, ignore=leftovers)
    for link in (PYTHON_ROOT / "cpp").iterdir():
        target = checkout / link.name
        if target.is_dir():
            shutil.copytree(target, root / link.name, ignore=leftovers)
        else:
            shutil.copy2(target, root / link.name)
    return root / "python"


def child_env(**extra: str) -> dict:
    """The environment for a child Python: this package first on PYTHONPATH, no stray OOMFLIGHT_* but the
    library's path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMFLIGHT_")}
    env["OOMFLIGHT_LIBRARY"] = os.environ["OOMFLIGHT_LIBRARY"]
    first = TORCH_SITE or str(PYTHON_ROOT)  # the installed package (with its extension) when there is one
    env["PYTHONPATH"] = first + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(MPIRUN_ENV)
    env.update(extra)
    return env


def run(args: list[str], cwd: Path, env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def read_archive(path: Path) -> dict:
    """The archive's root attributes, /ranks rows, /events columns and /batches rows (None where absent), with h5py
    alone."""
    with h5py.File(path, "r") as f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        ranks = f["ranks"][()]
        events = f["events"][()]
        batches = f["batches"][()] if "batches" in f else None
    return {"attrs": attrs, "ranks": ranks, "events": events, "batches": batches}


def archives(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.h5"))


PY = sys.executable


def frames_of(f: "h5py.File", stack_id: int) -> list[tuple[str, str, int]]:
    """The frames of a stack of an archive, innermost first, as (function, file, line)."""
    if stack_id < 0:
        return []
    strings = f["strings"][()]
    blob = f["string_data"][()].tobytes()

    def text(i: int) -> str:
        return blob[strings[i]["offset"]: strings[i]["offset"] + strings[i]["length"]].decode()

    st = f["stacks"][stack_id]
    # Indexed in memory: h5py reads a dataset at a list of rows in increasing row order, whatever the list's order
    # (a stack whose frames were interned out of order, an outer frame first seen in an earlier stack, came back
    # shuffled).
    rows = f["frames"][()][f["stack_frames"][st["frame_offset"]: st["frame_offset"] + st["frame_count"]]]
    return [(text(r["function"]), text(r["file"]), int(r["line"])) for r in rows]
