"""oomflight for Python: a distributed GPU-memory flight recorder for mpirun jobs.

A thin layer over liboomflight's C API (ctypes; see _capi.py). Settings are keyword arguments with the
OOMFLIGHT_* variables' names in lower case (``max_entries=50000`` is OOMFLIGHT_MAX_ENTRIES=50000), parsed and
checked by the library itself, so a keyword and a variable fail with the same message.

    import oomflight
    oomflight.init(run_name="llama-8b", dump_timeout="10s")
    oomflight.mark_batch(0)
    ...
    with oomflight.capture_oom():      # an OOM that reaches here dumps every rank, then propagates unchanged
        train()

PyTorch: ``oomflight.torch.install()`` (or ``oomflight run -- python train.py``, which needs no change to the
script) records every CUDA caching-allocator event; see docs/pytorch.md.
"""
from __future__ import annotations

import ctypes as _ctypes
import datetime as _datetime
import os as _os
import sys as _sys
import threading as _threading
from typing import Iterable as _Iterable

from . import _capi
from ._capi import ConfigError, DumpError, DumpResult, OomflightError, StateError
from .oom import capture_oom, is_oom

__all__ = [
    "ConfigError", "DumpError", "DumpResult", "OomflightError", "StateError", "annotate", "capture_oom", "init",
    "initialized", "intern_stack", "is_oom", "library_path", "log", "mark_batch", "rank", "record",
    "request_dump", "set_memory", "settings_to_variables", "shutdown", "trigger_oom", "version",
]

_state_lock = _threading.Lock()
_initialized = False


def version() -> str:
    """The loaded liboomflight's version, "MAJOR.MINOR.PATCH"."""
    return _capi.library().oomflight_version().decode()


def library_path() -> str:
    """The path of the liboomflight this process loaded."""
    return _capi.library()._oomflight_path  # type: ignore[attr-defined]


def _setting_text(name: str, value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, _datetime.timedelta):
        return f"{round(value.total_seconds() * 1000)}ms"
    if isinstance(value, float) and name in ("OOMFLIGHT_DUMP_TIMEOUT", "OOMFLIGHT_POLL_INTERVAL"):
        return f"{round(value * 1000)}ms"  # seconds, as Python's own timeouts are given
    if isinstance(value, int) and name in ("OOMFLIGHT_DUMP_TIMEOUT", "OOMFLIGHT_POLL_INTERVAL"):
        return f"{value}s"
    return str(value)


def settings_to_variables(**settings: object) -> dict[str, str]:
    """Keyword settings as OOMFLIGHT_* (name, text) pairs: ``dump_timeout=3`` -> OOMFLIGHT_DUMP_TIMEOUT="3s".
    Durations may be strings ("250ms"), seconds (int or float) or _datetime.timedelta; booleans become 1/0. The
    names and texts are checked by the library (init), not here."""
    return {f"OOMFLIGHT_{key.upper()}": _setting_text(f"OOMFLIGHT_{key.upper()}", value)
            for key, value in settings.items()}


def init(**settings: object) -> None:
    """Starts recording: reads the OOMFLIGHT_* environment, with `settings` (keyword names of those variables,
    lower case) overriding it. Under mpirun this joins the job's control plane and is collective: every rank must
    call it. Raises ConfigError (an unknown or malformed setting, named with its value), StateError (already
    initialised), MemoryError (the history does not fit) or OomflightError (MPI could not start).

    Once oomflight.torch.install() has started oomflight by itself (`oomflight run` does at `import torch`), a
    later init() without settings is a no-op, and one with settings raises StateError saying where to give them."""
    global _initialized
    if _initialized and _started_by:
        if not settings:
            return
        raise StateError(-2, f"oomflight was already started by {_started_by}: give settings there (keywords of "
                              "install(), or OOMFLIGHT_* variables), not to a later init()")
    variables = settings_to_variables(**settings)
    names = (_ctypes.c_char_p * max(1, len(variables)))(*[k.encode() for k in variables])
    values = (_ctypes.c_char_p * max(1, len(variables)))(*[v.encode() for v in variables.values()])
    with _state_lock:
        _capi.check(_capi.library().oomflight_init_settings(names, values, len(variables)))
        _initialized = True
    global _given_settings
    _given_settings = variables
    global _caller_stacks
    _caller_stacks = (variables.get("OOMFLIGHT_STACKS") or _os.environ.get("OOMFLIGHT_STACKS", "")) != "off"
    _stack_ids.clear()  # a new session's stack table


_BYTES = 1 << 63  # a figure of bytes is below 2^63 (oomflight.h): above, it is a negative number gone unsigned
_INT32 = 1 << 31


def _number(function: str, name: str, value: object, low: int, high: int, what: str = "") -> int:
    """`value` as an int in low .. high - 1, else an error naming the function, the argument and the value, in the C
    API's words: ctypes would wrap a negative or oversized int silently (-1 becomes 2^64 - 1, 2^32 becomes device 0).
    Accepts what __index__ gives an int (numpy's integers); TypeError for anything else (a bool or a float too)."""
    if isinstance(value, (bool, float)) or not hasattr(value, "__index__"):
        raise TypeError(f"{function}: {name} must be an int, not {type(value).__name__} ({value!r})")
    number = value.__index__()  # type: ignore[attr-defined]
    if low <= number < high:
        return number
    why = "is negative" if low == 0 and number < 0 else f"is outside {low} .. {high - 1}"
    raise ValueError(f"{function}: {name} {number} {why}" + (f" ({what})" if what else ""))


def _bytes(function: str, name: str, value: object) -> int:
    return _number(function, name, value, 0, _BYTES, "a figure of bytes is 0 .. 2^63 - 1")


_started_by = ""  # what started oomflight by itself (oomflight.torch.install); "" when the job called init()
_given_settings: dict[str, str] = {}  # the session's keyword settings, as OOMFLIGHT_* texts (the rest: the environment)


def initialized() -> bool:
    """True between init() and shutdown()."""
    return _initialized


def rank() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) without MPI."""
    r, size = _ctypes.c_int(-1), _ctypes.c_int(-1)
    _capi.check(_capi.library().oomflight_rank(_ctypes.byref(r), _ctypes.byref(size)))
    return r.value, size.value


def record(action: str | int, device: int, addr: int, size: int, stream: int = 0, stack_id: int = -1) -> bool:
    """Records one event now. `action` is a PyTorch trace action name ("alloc", "free_requested",
    "free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom", "snapshot") or
    "step"; sizes and addresses in bytes. Returns False when the ring dropped the event (counted in the archive).
    Without a `stack_id` (intern_stack's), the event carries its caller's Python frames, as the PyTorch
    extension's events do, unless OOMFLIGHT_STACKS is off. Raises ValueError for an unknown action, a device
    outside 0 .. 32767, a negative size, address or stream, or a size of 2^63 or more (each named with its value),
    TypeError for a figure that is not an int."""
    code = _capi.ACTIONS.get(action) if isinstance(action, str) else action
    if code is None:
        raise ValueError(f"record: unknown action {action!r}; one of {', '.join(_capi.ACTIONS)}")
    code = _number("record", "action", code, 0, _INT32)
    device = _number("record", "device", device, 0, 32768)
    # An oom event carries the device's free bytes in addr; any other event an address.
    addr = (_bytes("record", "addr (an oom event's free bytes)", addr) if code == _capi.ACTIONS["oom"]
            else _number("record", "addr", addr, 0, 1 << 64))
    size = _bytes("record", "size", size)
    stream = _number("record", "stream", stream, 0, 1 << 64)
    stack_id = _number("record", "stack_id", stack_id, -_INT32, _INT32)
    if stack_id == -1 and _caller_stacks:
        stack_id = _caller_stack(_sys._getframe(1))
    return _capi.check(_capi.library().oomflight_record(code, device, addr, size, stream, stack_id)) == 0


_caller_stacks = True  # record() gives events its caller's frames (OOMFLIGHT_STACKS is not off)
_stack_ids: dict = {}  # (code, instruction offset) of each frame, innermost first -> interned stack id
_MAX_CACHED_STACKS = 65536


def _caller_stack(frame) -> int:
    """The stack from `frame` outwards (at most 128 frames), interned in liboomflight once per distinct stack
    (the key is each frame's code object and instruction offset, as the extension's capture keeps them), or -1."""
    walk = []
    while frame is not None and len(walk) < 128:
        walk.append(frame)
        frame = frame.f_back
    key = tuple((f.f_code, f.f_lasti) for f in walk)
    found = _stack_ids.get(key)
    if found is not None:
        return found
    frames = (_capi.Frame * len(walk))(*[
        _capi.Frame(_text(getattr(f.f_code, "co_qualname", f.f_code.co_name)), _text(f.f_code.co_filename),
                    f.f_lineno or 0) for f in walk])
    interned = _ctypes.c_int32(-1)
    if _capi.library().oomflight_intern_stack(frames, len(walk), _ctypes.byref(interned)) != 0:
        return -1
    if len(_stack_ids) < _MAX_CACHED_STACKS:
        _stack_ids[key] = interned.value
    return interned.value


def _text(name: str) -> bytes:
    """A function or file name as the C API stores it: UTF-8 exactly as Python holds it, a lone surrogate (a file
    name of undecodable bytes) written as backslashreplace writes it ("\\udcff") and a NUL as "\\x00", so that
    nothing is dropped or cut (the extension's own capture writes names alike: plugins/pytorch/python_thread.hpp)."""
    return str(name).encode("utf-8", "backslashreplace").replace(b"\0", b"\\x00")


_explicit_batches = False  # the job marks batches itself: oomflight.torch's optimizer hook stands down


def mark_batch(batch: int) -> None:
    """Starts batch `batch` (>= 0): later events carry it, and a step event marks the boundary. Once the job
    calls this, oomflight.torch stops marking batches at optimizer steps."""
    batch = _number("mark_batch", "batch", batch, 0, _BYTES)
    global _explicit_batches
    _explicit_batches = True
    _capi.check(_capi.library().oomflight_mark_batch(batch))


def annotate(**metadata: object) -> None:
    """Sets metadata of this rank, stored with the current batch in every later archive (its /context dataset):
    annotate(epoch=3, lr=1e-4, seq_len=4096). Values are stored as text (str()); a key that looks secret (KEY,
    TOKEN, SECRET, PASSWORD, CREDENTIAL, AUTH, ...) has its value stored as "<redacted>"."""
    lib = _capi.library()
    for key, value in metadata.items():
        _capi.check(lib.oomflight_set_metadata(str(key).encode(), str(value).encode()))


def intern_stack(frames: _Iterable[tuple[str, str, int]]) -> int:
    """Interns a stack, innermost frame first, as (function, file, line) tuples; returns its id for record().
    Takes a lock: intern each distinct stack once."""
    frames = [(f, file, _number("intern_stack", f"frame {i}'s line", line, 0, _INT32))
              for i, (f, file, line) in enumerate(frames)]
    array = (_capi.Frame * max(1, len(frames)))(
        *[_capi.Frame(_text(f), _text(file), line) for f, file, line in frames])
    stack_id = _ctypes.c_int32(-1)
    _capi.check(_capi.library().oomflight_intern_stack(array, len(frames), _ctypes.byref(stack_id)))
    return stack_id.value


def set_memory(device: int, *, allocated: int = 0, reserved: int = 0, peak_allocated: int = 0,
               peak_reserved: int = 0, capacity: int = 0, free: int = 0, cap: int = 0) -> None:
    """Publishes one device's memory figures in bytes (torch.cuda.memory_allocated / memory_reserved meanings;
    capacity and free as cudaMemGetInfo reports them; cap: the process's own limit below the capacity, as
    torch.cuda.set_per_process_memory_fraction sets it, 0 for none); a dump reports the last figures of its device.
    Raises ValueError naming the argument and its value for a negative figure (or one of 2^63 or more), a free or
    cap above the capacity, or a device outside 0 .. 63; nothing is published then."""
    device = _number("set_memory", "device", device, 0, 64)
    figures = {name: _bytes("set_memory", name, value) for name, value in (
        ("allocated", allocated), ("reserved", reserved), ("peak_allocated", peak_allocated),
        ("peak_reserved", peak_reserved), ("capacity", capacity), ("free", free), ("cap", cap))}
    m = _capi.Memory(_ctypes.sizeof(_capi.Memory), 0, *figures.values())
    _capi.check(_capi.library().oomflight_set_memory(device, _ctypes.byref(m)))


def _dump_result() -> _capi.DumpResultStruct:
    return _capi.DumpResultStruct(_ctypes.sizeof(_capi.DumpResultStruct), 2, 0, 0, -1, 0.0)


def _finish_dump(code: int, raw: _capi.DumpResultStruct) -> DumpResult:
    result = DumpResult(raw, _capi.library().oomflight_last_dump_path().decode())
    if code in (0, _capi.EDISABLED):
        return result
    if code == -4:  # EDUMP: a rank-local file or nothing; the result says which, and that is not an exception
        return result
    _capi.check(code)
    return result


def request_dump(kind: str = "signal", *, reason: str = "", device: int = -1, batch: int = -1,
                 requested_bytes: int = 0, device_free_bytes: int = 0) -> DumpResult:
    """Asks every rank to dump now (kind "oom", "snapshot", "signal", "exit" or "headroom") and blocks until the
    archive is closed or the fallback written. Returns the DumpResult: status "archive", "rank_local", "failed" or
    "disabled", and the path. Raises ValueError for a bad kind or device, StateError before init()."""
    if kind not in _capi.DUMP_KINDS:
        raise ValueError(f"request_dump: kind {kind!r} is not one of {', '.join(_capi.DUMP_KINDS)}")
    device = _number("request_dump", "device", device, -1, 64, "-1: the device last published")
    batch = _number("request_dump", "batch", batch, -1, _BYTES, "-1: the current batch")
    requested_bytes = _bytes("request_dump", "requested_bytes", requested_bytes)
    device_free_bytes = _bytes("request_dump", "device_free_bytes", device_free_bytes)
    req = _capi.DumpRequest(_ctypes.sizeof(_capi.DumpRequest), _capi.DUMP_KINDS[kind], reason.encode(),
                            requested_bytes, device_free_bytes, device, 0, batch)
    raw = _dump_result()
    code = _capi.library().oomflight_request_dump(_ctypes.byref(req), _ctypes.byref(raw))
    return _finish_dump(code, raw)


def trigger_oom(device: int, reason: str, requested_bytes: int = 0, device_free_bytes: int = 0) -> DumpResult:
    """Records an oom event on `device` (size = requested bytes, addr = device free bytes) and asks for an oom
    dump of every rank: what oomflight_trigger_oom does, with the DumpResult returned."""
    device = _number("trigger_oom", "device", device, 0, 64)
    requested_bytes = _bytes("trigger_oom", "requested_bytes", requested_bytes)
    device_free_bytes = _bytes("trigger_oom", "device_free_bytes", device_free_bytes)
    record("oom", device, device_free_bytes, requested_bytes)
    return request_dump("oom", reason=reason, device=device, requested_bytes=requested_bytes,
                        device_free_bytes=device_free_bytes)


def log(level: str, message: str) -> None:
    """One line in oomflight's log format on stderr ("oomflight[rank N] level: message")."""
    if level not in _capi.LOG_LEVELS:
        raise ValueError(f"log: level {level!r} is not one of {', '.join(_capi.LOG_LEVELS)}")
    _capi.check(_capi.library().oomflight_log(_capi.LOG_LEVELS[level], message.encode("utf-8", "replace")))


def shutdown() -> None:
    """Ends the session as a normal end (oomflight_shutdown): the watcher keeps answering the other ranks' dumps
    until every rank has ended its session (or one left without them, or OOMFLIGHT_DUMP_TIMEOUT), then stops; after
    this rank's own OOM dump it does not wait. Not needed at exit: the library ends the session by itself as the
    exit status says, and finalises the MPI that init() started at a successful exit. Raises StateError when not
    initialised."""
    global _initialized, _started_by
    with _state_lock:
        _initialized = False
        _started_by = ""
        _capi.check(_capi.library().oomflight_shutdown())


def _end(exit_status: int) -> None:
    """Ends the session as a process exiting with `exit_status` would (oomflight_end): non-zero leaves at once,
    telling every other rank, waiting for none. A session that something else ended already (the job's own
    MPI_Finalize) is no error here."""
    global _initialized, _started_by
    with _state_lock:
        _initialized = False
        _started_by = ""
        code = _capi.library().oomflight_end(exit_status)
        if code != -2:  # OOMFLIGHT_ESTATE: ended already
            _capi.check(code)
