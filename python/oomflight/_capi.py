"""ctypes binding of liboomflight's C API (core/capi/include/oomflight/oomflight.h, ABI version 1).

The C API is the one stable boundary: this module declares each function's argument and result types once, and
turns every negative return code into an exception that carries the library's own message
(oomflight_last_error), so Python reports exactly what C reports.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import threading
from pathlib import Path

ABI_VERSION = 1  # OOMFLIGHT_ABI_VERSION this module was written against

# enum oomflight_action: PyTorch's TraceEntry action names, with the archive's values (never renumbered).
ACTIONS = {
    "alloc": 0,
    "free_requested": 1,
    "free_completed": 2,
    "segment_alloc": 3,
    "segment_free": 4,
    "segment_map": 5,
    "segment_unmap": 6,
    "oom": 7,
    "snapshot": 8,
    "step": 9,
}
# enum oomflight_dump_kind
DUMP_KINDS = {"oom": 0, "snapshot": 1, "signal": 2, "exit": 3, "headroom": 4}
# enum oomflight_dump_status
DUMP_STATUSES = {0: "archive", 1: "rank_local", 2: "failed", 3: "disabled"}
# enum oomflight_log_level
LOG_LEVELS = {"trace": 0, "debug": 1, "info": 2, "warn": 3, "error": 4}


class OomflightError(RuntimeError):
    """A C API call failed; `code` is the negative OOMFLIGHT_E* value and the message is the library's."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class ConfigError(OomflightError, ValueError):
    """A setting is unknown or malformed (OOMFLIGHT_ECONFIG); the message names the variable and the value."""


class StateError(OomflightError):
    """Not initialised, initialised twice, or shut down (OOMFLIGHT_ESTATE)."""


class DumpError(OomflightError):
    """A dump wrote no archive (OOMFLIGHT_EDUMP); `result` says what was written instead."""

    def __init__(self, code: int, message: str, result: "DumpResult | None" = None):
        super().__init__(code, message)
        self.result = result


# enum oomflight_status -> exception class
_ERRORS = {
    -1: ConfigError,
    -2: StateError,
    -3: ValueError,
    -4: DumpError,
    -6: OomflightError,
    -7: MemoryError,
    -8: OomflightError,
    -9: OomflightError,
    -10: OomflightError,
}
EDROPPED = -5
EDISABLED = -8


class Frame(ctypes.Structure):
    _fields_ = [("function", ctypes.c_char_p), ("file", ctypes.c_char_p), ("line", ctypes.c_int32)]


class Memory(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("reserved0", ctypes.c_uint32),
        ("allocated_bytes", ctypes.c_uint64),
        ("reserved_bytes", ctypes.c_uint64),
        ("peak_allocated_bytes", ctypes.c_uint64),
        ("peak_reserved_bytes", ctypes.c_uint64),
        ("device_capacity_bytes", ctypes.c_uint64),
        ("device_free_bytes", ctypes.c_uint64),
        ("memory_cap_bytes", ctypes.c_uint64),  # since 0.2.1
    ]


class DumpRequest(ctypes.Structure):
    # The 0.2 layout (48 bytes): the library reads the allocator-state fields of 0.3 only from callers whose
    # struct_size includes them, and Python jobs have no allocator state to give (PyTorch's is the plugin's).
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("kind", ctypes.c_int32),
        ("reason", ctypes.c_char_p),
        ("requested_bytes", ctypes.c_uint64),
        ("device_free_bytes", ctypes.c_uint64),
        ("device", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        ("batch", ctypes.c_int64),
    ]


class DumpResultStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("status", ctypes.c_int32),
        ("ranks_written", ctypes.c_int32),
        ("world_size", ctypes.c_int32),
        ("batch", ctypes.c_int64),
        ("seconds", ctypes.c_double),
    ]


# The header's static_asserts, checked again on this side of the boundary.
assert ctypes.sizeof(Memory) == 64 and ctypes.sizeof(DumpRequest) == 48
assert ctypes.sizeof(DumpResultStruct) == 32 and ctypes.sizeof(Frame) == 24


class DumpResult:
    """What a dump wrote, as this rank sees it (struct oomflight_dump_result, plus the path)."""

    def __init__(self, raw: DumpResultStruct, path: str):
        self.status = DUMP_STATUSES.get(raw.status, str(raw.status))
        self.ranks_written = raw.ranks_written
        self.world_size = raw.world_size
        self.batch = raw.batch
        self.seconds = raw.seconds
        self.path = path

    def __repr__(self) -> str:
        return (f"DumpResult(status={self.status!r}, path={self.path!r}, ranks_written={self.ranks_written}, "
                f"world_size={self.world_size}, batch={self.batch}, seconds={self.seconds:.3f})")


_SIGNATURES = {
    "oomflight_abi_version": ([], ctypes.c_int),
    "oomflight_version": ([], ctypes.c_char_p),
    "oomflight_launched_by_mpi": ([], ctypes.c_int),
    "oomflight_init": ([], ctypes.c_int),
    "oomflight_init_settings": ([ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t],
                                ctypes.c_int),
    "oomflight_rank": ([ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
    "oomflight_record": ([ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                          ctypes.c_int32], ctypes.c_int),
    "oomflight_mark_batch": ([ctypes.c_int64], ctypes.c_int),
    "oomflight_set_metadata": ([ctypes.c_char_p, ctypes.c_char_p], ctypes.c_int),
    "oomflight_intern_stack": ([ctypes.POINTER(Frame), ctypes.c_size_t, ctypes.POINTER(ctypes.c_int32)],
                               ctypes.c_int),
    "oomflight_set_memory": ([ctypes.c_int, ctypes.POINTER(Memory)], ctypes.c_int),
    "oomflight_request_dump": ([ctypes.POINTER(DumpRequest), ctypes.POINTER(DumpResultStruct)], ctypes.c_int),
    "oomflight_trigger_oom": ([ctypes.c_int, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64], ctypes.c_int),
    "oomflight_is_oom": ([ctypes.c_char_p, ctypes.c_char_p], ctypes.c_int),
    "oomflight_log": ([ctypes.c_int, ctypes.c_char_p], ctypes.c_int),
    "oomflight_shutdown": ([], ctypes.c_int),
    "oomflight_end": ([ctypes.c_int], ctypes.c_int),
    "oomflight_leave_store": ([ctypes.c_char_p], ctypes.c_int),
    "oomflight_last_error": ([], ctypes.c_char_p),
    "oomflight_last_dump_path": ([], ctypes.c_char_p),
}

_LIBRARY_NAMES = ("liboomflight.so.0.2", "liboomflight.so")  # the soname follows 0.MINOR (core/CMakeLists.txt)


def _candidates() -> list[str]:
    """Where liboomflight may be, in the order tried (docs/pytorch.md)."""
    found: list[str] = []
    explicit = os.environ.get("OOMFLIGHT_LIBRARY", "")
    if explicit:
        return [explicit]  # set on purpose (oomflight run sets it): never silently load another one
    here = Path(__file__).resolve().parent
    for libdir in ("lib", "lib64"):  # a pip install's own build, beside this file (cmake/wheel.cmake)
        found.append(str(here / libdir / "liboomflight.so"))
    exe = shutil.which("oomflight")
    if exe:
        prefix = Path(exe).resolve().parent.parent
        for libdir in ("lib", "lib64", "core"):  # an install prefix, or a build tree (build/bin, build/core)
            for name in _LIBRARY_NAMES:
                found.append(str(prefix / libdir / name))
    for name in _LIBRARY_NAMES:  # a source checkout: python/oomflight -> build/core
        found.append(str(here.parent.parent / "build" / "core" / name))
    by_loader = ctypes.util.find_library("oomflight")
    if by_loader:
        found.append(by_loader)
    return found


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    """Loads liboomflight once (RTLD_GLOBAL, so that the torch plugin resolves the same copy) and checks its ABI.

    Raises OSError naming every place tried when none holds the library, and ImportError for an ABI mismatch."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            if os.sep in path and not os.path.exists(path):
                tried.append(f"{path} (absent)")
                continue
            try:
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                tried.append(f"{path} ({e})")
                continue
            for name, (argtypes, restype) in _SIGNATURES.items():
                try:
                    fn = getattr(lib, name)
                except AttributeError as e:
                    raise ImportError(f"{path} has no {name}: it is older than this package "
                                      f"(liboomflight {_version(lib)}); reinstall oomflight") from e
                fn.argtypes = argtypes
                fn.restype = restype
            abi = lib.oomflight_abi_version()
            if abi != ABI_VERSION:
                raise ImportError(f"{path} has C ABI version {abi}, this package needs {ABI_VERSION}")
            lib._oomflight_path = path  # type: ignore[attr-defined]
            _lib = lib
            return lib
        raise OSError("cannot find liboomflight; set OOMFLIGHT_LIBRARY to its path or put `oomflight` on PATH. "
                      "Tried: " + "; ".join(tried))


def _version(lib: ctypes.CDLL) -> str:
    try:
        fn = lib.oomflight_version
        fn.restype = ctypes.c_char_p
        return fn().decode()
    except AttributeError:
        return "unknown"


def last_error() -> str:
    return library().oomflight_last_error().decode("utf-8", "replace")


def check(code: int) -> int:
    """Returns `code` when it is not an error; raises the matching exception with the library's message."""
    if code >= 0 or code == EDROPPED:
        return code
    cls = _ERRORS.get(code, OomflightError)
    message = last_error()
    if cls in (ValueError, MemoryError):
        raise cls(message)
    raise cls(code, message)
