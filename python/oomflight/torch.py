"""PyTorch: record every CUDA caching-allocator event of this process and dump every rank on an OOM.

    import oomflight.torch
    oomflight.torch.install()          # before or after CUDA is initialised; once

install() initialises oomflight (the OOMFLIGHT_* environment, with keyword overrides) and attaches the
extension (plugins/pytorch) once torch's CUDA is initialised: the allocator's trace tracker forwards each
TraceEntry to the ring, and its out-of-memory observer asks every rank for an oom dump with PyTorch's figures
before torch raises OutOfMemoryError. Batches are marked at every optimizer step (torch's global optimizer step
hooks) unless the job marks them itself. Anything that cannot work here (no CUDA, the cudaMallocAsync backend,
an old torch, no compiler) is logged once and training goes on unwatched.
"""
from __future__ import annotations

import ctypes
import threading

import oomflight
from . import _capi, _extension

_lock = threading.Lock()
_state = {
    "installed": False,        # install() ran
    "attached": False,         # the allocator hooks are attached
    "why_not": "",             # why they are not, once known
    "batch": -1,               # the last batch marked by the optimizer hook
    "auto_batches": True,      # the optimizer hook marks batches
    "observer_dumps_seen": 0,
}


def _log(level: str, message: str) -> None:
    try:
        oomflight.log(level, message)
    except Exception:  # noqa: BLE001 - logging must never break training
        import sys
        print(f"oomflight {level}: {message}", file=sys.stderr)


def _function_addresses() -> dict[str, int]:
    lib = _capi.library()
    names = ("oomflight_abi_version", "oomflight_record", "oomflight_set_memory", "oomflight_request_dump",
             "oomflight_log")
    return {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0 for name in names}


def _attach() -> None:
    """Runs once CUDA is initialised (torch.cuda._lazy_call), or at once if it already is."""
    import torch

    with _lock:
        if _state["attached"]:
            return
        try:
            if not oomflight.initialized():
                oomflight.init(**_state.get("settings", {}))
            backend = torch.cuda.memory.get_allocator_backend()
            if backend != "native":
                raise _extension.PluginError(f"the {backend} allocator backend has no trace hooks "
                                             "(PYTORCH_CUDA_ALLOC_CONF=backend:native is needed)")
            module = _extension.load(torch)
            seeds = []
            for device in range(min(torch.cuda.device_count(), 64)):
                stats = torch.cuda.memory_stats(device)
                seeds.append((device, int(stats.get("allocated_bytes.all.current", 0)),
                              int(stats.get("reserved_bytes.all.current", 0)),
                              int(torch.cuda.get_device_properties(device).total_memory)))
            why = module.attach(_function_addresses(), seeds)
            if why:
                raise _extension.PluginError(why)
            _state["attached"] = True
            _state["module"] = module
            _log("debug", f"attached to the CUDA caching allocator of torch {torch.__version__}")
        except Exception as e:  # noqa: BLE001 - never into training
            _state["why_not"] = str(e)
            _log("warn", f"not recording CUDA allocator events: {e}")


def _optimizer_step_hook(optimizer, args, kwargs) -> None:
    if not _state["auto_batches"] or oomflight._explicit_batches or not oomflight.initialized():
        return
    _state["batch"] += 1
    try:
        _capi.library().oomflight_mark_batch(_state["batch"])
    except Exception:  # noqa: BLE001
        pass


def stop_marking_batches() -> None:
    """The job marks batches itself (oomflight.mark_batch, or a Composer / Lightning callback): the optimizer
    hook stops marking them."""
    _state["auto_batches"] = False


def install(*, mark_batches: bool = True, **settings: object) -> bool:
    """Installs the hooks in this process; idempotent. `settings` as oomflight.init's (used when install
    initialises oomflight). Returns True when the hooks are (or will be, at CUDA init) attached; False with a
    logged reason when they cannot be (then nothing changes for the job)."""
    import torch

    with _lock:
        if _state["installed"]:
            return not _state["why_not"]
        _state["installed"] = True
        _state["settings"] = settings
        _state["auto_batches"] = mark_batches
    try:
        _extension.check_toolchain(torch)
    except _extension.PluginError as e:
        _state["why_not"] = str(e)
        _log("warn", f"not recording CUDA allocator events: {e}")
        return False
    if mark_batches and hasattr(torch.optim.optimizer, "register_optimizer_step_post_hook"):
        torch.optim.optimizer.register_optimizer_step_post_hook(_optimizer_step_hook)
    # After CUDA's initialisation: a tracker attached before it is silently dropped, and oomflight's MPI is
    # initialised only once the job has chosen its device (docs/pytorch.md).
    if torch.cuda.is_initialized():
        _attach()
    else:
        torch.cuda._lazy_call(_attach)
    return True


def status() -> dict:
    """What install() achieved: installed, attached, why_not, and the extension's counters."""
    out = {k: _state[k] for k in ("installed", "attached", "why_not", "batch", "auto_batches")}
    module = _state.get("module")
    if module is not None:
        out.update(module.counters())
    return out


def _take_observer_dump() -> bool:
    """True once per dump the OOM observer took (oom.dump_for then does not dump the same error again)."""
    module = _state.get("module")
    if module is None:
        return False
    taken = module.counters().get("observer_dumps", 0)
    if taken > _state["observer_dumps_seen"]:
        _state["observer_dumps_seen"] = taken
        return True
    return False
