"""The out-of-memory classifier applied to exceptions (as gpumemprof's capture_oom does), and the dump it asks
for. The classification is the library's own (oomflight_is_oom): PyTorch, XLA, CUDA, HIP, NCCL and host
out-of-memory errors, by exception type name and message."""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator

from . import _capi

_dumped_lock = threading.Lock()
_dumped: set[int] = set()  # id() of exceptions already dumped for: one dump per error, however often it is seen


def _type_name(exc: BaseException) -> str:
    t = type(exc)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def is_oom(exc: BaseException | str, message: str | None = None) -> bool:
    """True when `exc` (an exception, or a type name with `message`) is an out-of-memory error."""
    if isinstance(exc, BaseException):
        type_name, message = _type_name(exc), str(exc)
    else:
        type_name = exc
    lib = _capi.library()
    return bool(lib.oomflight_is_oom(type_name.encode(), (message or "").encode("utf-8", "replace")))


def mark_dumped(exc: BaseException) -> None:
    """Notes that the dump for `exc` was already taken (the torch plugin's OOM observer dumps before the
    exception is raised), so that capture_oom and the exit hook do not dump it a second time."""
    with _dumped_lock:
        _dumped.add(id(exc))


def dump_for(exc: BaseException) -> "object | None":
    """Asks for an oom dump of every rank for `exc` if it is an out-of-memory error not dumped yet; returns the
    DumpResult, or None when nothing was asked. Never raises: the job's own error must reach the user."""
    from . import initialized, request_dump  # late: this module is imported by the package's __init__

    try:
        if not initialized() or not is_oom(exc):
            return None
        with _dumped_lock:
            if id(exc) in _dumped or _recently_dumped_by_observer():
                _dumped.add(id(exc))
                return None
            _dumped.add(id(exc))
        return request_dump("oom", reason=f"{_type_name(exc)}: {exc}")
    except Exception as e:  # noqa: BLE001 - reporting must never replace the job's exception
        print(f"oomflight: could not dump for {_type_name(exc)}: {e}", file=sys.stderr)
        return None


def _recently_dumped_by_observer() -> bool:
    # The torch plugin's OOM observer dumps inside the allocator, before torch raises; it says so here.
    try:
        from . import torch as oomflight_torch
    except Exception:  # noqa: BLE001
        return False
    return oomflight_torch._take_observer_dump()


@contextlib.contextmanager
def capture_oom() -> Iterator[None]:
    """Context manager: an out-of-memory exception leaving the block first triggers an oom dump of every rank
    (unless the allocator hook already took it), then propagates unchanged (same object, same traceback). Other
    exceptions pass untouched."""
    try:
        yield
    except BaseException as exc:
        dump_for(exc)
        raise


def install_excepthook() -> None:
    """Applies the classifier to the exception that reaches the top of the program (sys.excepthook), then calls
    the previous hook so the job's own traceback is printed as before. Idempotent."""
    previous = sys.excepthook
    if getattr(previous, "_oomflight", False):
        return

    def hook(exc_type, exc, tb):
        dump_for(exc)
        previous(exc_type, exc, tb)

    hook._oomflight = True  # type: ignore[attr-defined]
    sys.excepthook = hook
