"""PyTorch: record every CUDA caching-allocator event of this process and dump every rank on an OOM.

    import oomflight.torch
    oomflight.torch.install()          # before or after CUDA is initialised; once

install() initialises oomflight (the OOMFLIGHT_* environment, with keyword overrides) and attaches the
extension (plugins/pytorch) once torch's CUDA is initialised: the allocator's trace tracker forwards each
TraceEntry to the ring, and its out-of-memory observer asks every rank for an oom dump with PyTorch's figures and
allocator state before torch raises OutOfMemoryError. Batches are marked at every optimizer step (torch's global
optimizer step hooks) unless the job marks them itself. Anything that cannot work here (no CUDA device, the
cudaMallocAsync backend, an old torch, no extension for this torch and no compiler) is logged once; without a
device oomflight still starts at once, so batches, metadata and on-demand dumps work on a CPU job too.

Call sites, by default: every event carries the allocating thread's Python frames in the archive, captured by the
extension itself (oomflight's own capture, a fraction of torch's cost: plugins/pytorch/python_stacks.hpp) and
symbolised when a dump freezes the history, off the allocator's lock. ``OOMFLIGHT_STACKS`` (or install's `stacks`)
chooses: ``python`` (the default), ``torch`` (torch's own contexts: its memory history with Python frames, which
costs several times more), or ``off``. Where the job records torch's memory history itself, its contexts are used
as they are (docs/pytorch.md, "Python stacks").

    python -m oomflight.torch --check  # what works here: torch, the extension, the hooks, the device
"""
from __future__ import annotations

import threading as _threading

import oomflight as _oomflight
from . import _capi, _extension

__all__ = ["install", "status", "stop_marking_batches", "check"]

_lock = _threading.Lock()
_state: dict = {
    "installed": False,        # install() ran
    "attached": False,         # the allocator hooks are attached
    "why_not": "",             # why they are not, once known
    "batch": -1,               # the last batch marked by the optimizer hook
    "auto_batches": True,      # the optimizer hook marks batches
    "stacks": "python",        # which call sites events carry (stacks_setting)
    "observer_dumps_seen": 0,
}


def _log(level: str, message: str) -> None:
    try:
        _oomflight.log(level, message)
    except Exception:  # noqa: BLE001 - logging must never break training
        import sys
        print(f"oomflight {level}: {message}", file=sys.stderr)


def _function_addresses() -> dict[str, int]:
    import ctypes

    lib = _capi.library()
    names = ("oomflight_abi_version", "oomflight_record", "oomflight_set_memory", "oomflight_request_dump",
             "oomflight_log", "oomflight_intern_stack", "oomflight_set_stack_resolver", "oomflight_set_metadata",
             "oomflight_join_store")
    out = {}
    for name in names:
        try:
            out[name] = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0
        except AttributeError:  # an older liboomflight (no deferred stacks): the extension goes without
            out[name] = 0
    return out


def _start() -> None:
    """oomflight.init() with install()'s settings, once; batch 0 starts here when the optimizer hook marks them
    (every event before the first optimizer step belongs to batch 0, and step N's hook starts batch N + 1)."""
    if not _oomflight.initialized():
        _oomflight.init(**_state.get("settings", {}))
        _oomflight._started_by = "oomflight.torch.install()"
        from . import _autostart

        _autostart.shutdown_at_normal_exit()
        if _state["auto_batches"] and not _oomflight._explicit_batches:
            _mark(0)


def _mark(batch: int) -> None:
    _state["batch"] = batch
    _capi.library().oomflight_mark_batch(batch)


def _attach() -> None:
    """Runs once CUDA is initialised (torch.cuda._lazy_call), or at once if it already is. The extension comes
    through _extension.load_soon: a build at first use runs on a thread of its own, and the hooks are attached from
    there once it is done (never a compiler on the thread that initialises CUDA)."""
    import torch

    with _lock:
        if _state["attached"] or _state.get("attaching"):
            return
        try:
            _start()
        except Exception as e:  # noqa: BLE001 - never into training
            # Not about the allocator's events: oomflight did not start at all (a setting that does not parse, or
            # that differs between an MPI job's ranks), and its error says so.
            _state["why_not"] = str(e)
            _log("warn", f"not recording: {e}")
            return
        try:
            backend = torch.cuda.memory.get_allocator_backend()
            if backend != "native":
                raise _extension.PluginError(f"the {backend} allocator backend has no trace hooks "
                                             "(PYTORCH_CUDA_ALLOC_CONF=backend:native is needed)")
        except Exception as e:  # noqa: BLE001 - never into training
            _state["why_not"] = str(e)
            _log("warn", f"not recording CUDA allocator events: {e}")
            return
        _state["attaching"] = True
    _extension.load_soon(torch, _attach_with, _log)


def _attach_with(module, error: str) -> None:
    """The hooks attached with the extension `module` (or why not, `error`)."""
    import torch

    with _lock:
        _state["attaching"] = False
        if _state["attached"]:
            return
        try:
            if module is None:
                raise _extension.PluginError(error)
            seeds = []
            devices = min(torch.cuda.device_count(), 64)
            for device in range(devices):
                stats = torch.cuda.memory_stats(device)
                seeds.append((device, int(stats.get("allocated_bytes.all.current", 0)),
                              int(stats.get("reserved_bytes.all.current", 0)),
                              int(torch.cuda.get_device_properties(device).total_memory)))
            why = module.attach(_function_addresses(), seeds, True, devices, _state["stacks"])
            if why:
                raise _extension.PluginError(why)
            _state["attached"] = True
            _state["module"] = module
            if hasattr(module, "stop_reclaimer"):  # an extension built before 0.2.1 has none
                import atexit

                # Before the interpreter finalises: its thread may take the GIL to drop a context.
                atexit.register(module.stop_reclaimer)
            if _state["stacks"] == "torch":
                # Contexts for allocations and frees, Python frames only (cheap to gather); torch's own trace
                # buffer kept to one entry: oomflight's ring is the history.
                torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                                         max_entries=1)
            _log("debug", f"attached to the CUDA caching allocator of torch {torch.__version__} "
                          f"({_extension.how_loaded()})")
        except Exception as e:  # noqa: BLE001 - never into training
            _state["why_not"] = str(e)
            _log("warn", f"not recording CUDA allocator events: {e}")


def _own_store(dist):
    """The job's default store as oomflight's transport, and the job's own store to hold with it: on a TCPStore
    (torchrun's agent store, the one init_process_group makes), a client of its own on the same endpoint, so that
    oomflight's round trips never wait behind the job's own; under oomflight's prefix, with the elastic restart round
    in it (a new round's dumps never see the keys of the round before). The job's store is held as long as
    oomflight uses its client (released at destroy_process_group, or at the session's end): where it hosts the
    server (rank 0 of a plain env:// job), the server then outlives Python's finalisation until this rank has left,
    so that the others' last round trips still find it."""
    import datetime
    import os

    base = dist.distributed_c10d._get_default_store()
    while isinstance(base, dist.PrefixStore):
        base = base.underlying_store
    job_store = base
    if isinstance(base, dist.TCPStore):
        # Its timeout bounds the connection and a read; oomflight never waits on a key (a check comes first).
        base = dist.TCPStore(base.host, base.port, is_master=False, timeout=datetime.timedelta(seconds=10),
                             wait_for_workers=False)
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    # Each init_process_group of the process is a store of its own (every rank re-initialises alike): a job that
    # destroys its process group and makes another (on torchrun's agent store, which outlives both) never meets the
    # keys of the one before.
    generation = _state.get("generation", 0)
    return dist.PrefixStore(f"oomflight/{run}/{restart}/{generation}/", base), job_store


def _join_job_store() -> None:
    """Once torch.distributed is initialised in a job that no MPI launcher started (torchrun, Lightning's or
    Composer's launcher): oomflight's ranks become torch's, and an OOM on any rank dumps every rank into one archive
    through the job's c10d store (docs/protocol.md, "Jobs without MPI"). The extension comes through
    _extension.load_soon: with a build at first use, the join happens on the builder's thread once it is done, and
    init_process_group returns at once. Never raises: a job that cannot join is recorded rank by rank, as before,
    with one warning."""
    import os

    import torch
    import torch.distributed as dist

    if _state.get("joined") or not dist.is_initialized():
        return
    _state["joined"] = True
    try:
        lib = _capi.library()
        if lib.oomflight_launched_by_mpi():
            return  # the MPI job's ranks already (and its MPI starts once CUDA has, as install() arranged)
        world = dist.get_world_size()
        if world < 2:
            return
        with _lock:
            _start()  # no MPI to initialise after the device is chosen: start now if CUDA has not started it
        rank = dist.get_rank()
        local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
        if not 0 <= local_rank < world:
            local_rank = 0
        generation = _state.get("generation", 0)
    except Exception as e:  # noqa: BLE001 - never into training
        _log("warn", f"not coordinating dumps with the job's other ranks (each rank dumps alone): {e}")
        return

    def join_with(module, error: str) -> None:
        with _join_lock:
            if _state.get("generation", 0) != generation or not dist.is_initialized():
                return  # the job let go of that process group meanwhile (destroy_process_group)
            try:
                if module is None:
                    raise RuntimeError(error)
                store, job_store = _own_store(dist)
                why = module.join_store(_function_addresses()["oomflight_join_store"], store, rank, world,
                                        local_rank, job_store)
                if why:
                    raise RuntimeError(f"{why}: {_capi.last_error()}")
                _state["store_joined"] = True
                restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
                if restart is not None:
                    lib.oomflight_set_metadata(b"oomflight.restart_round", restart.encode())
                _log("debug", f"joined the job's c10d store as rank {rank} of {world}")
            except Exception as e:  # noqa: BLE001 - never into training
                _log("warn", f"not coordinating dumps with the job's other ranks (each rank dumps alone): {e}")

    _extension.load_soon(torch, join_with, _log)


_join_lock = _threading.Lock()  # a join on the builder's thread and a leave on the job's never cross


def _leave_job_store(why: str) -> None:
    """The job lets go of its store (destroy_process_group): oomflight stops using it at once and drops its
    reference (oomflight_leave_store), so that the store ends as it would without oomflight (a FileStore's file is
    removed); the next init_process_group joins the new one. Never raises, never waits for another rank."""
    with _join_lock:
        if not _state.get("joined"):
            return
        _state["joined"] = False
        _state["generation"] = _state.get("generation", 0) + 1  # a join still to come (first-use build) is void
        if not _state.pop("store_joined", False):
            return
        try:
            lib = _capi.library()
            if lib.oomflight_leave_store(why.encode()) == 0:
                _log("debug", f"left the job's c10d store ({why})")
        except Exception as e:  # noqa: BLE001 - never into the job's teardown
            _log("warn", f"leaving the job's store: {e}")


def _destroys_default_group(dist, args, kwargs) -> bool:
    """Whether destroy_process_group(group) ends the default process group, and with it the job's store: no group,
    None, or the default group itself (a subgroup's end leaves the store as it is)."""
    group = kwargs.get("group", args[0] if args else None)
    if group is None:
        return True
    try:
        return group is dist.GroupMember.WORLD or group is dist.distributed_c10d._get_default_group()
    except Exception:  # noqa: BLE001 - no default group any more: nothing of it to leave
        return False


def _hook_process_group() -> None:
    """Joins the job's store right after torch.distributed.init_process_group (or now, if it ran already), and
    leaves it right before destroy_process_group ends the default group."""
    try:
        import functools

        import torch.distributed as dist

        if not dist.is_available():
            return
        c10d = dist.distributed_c10d
        original = c10d.init_process_group
        if not getattr(original, "_oomflight", False):
            @functools.wraps(original)
            def init_process_group(*args, **kwargs):
                result = original(*args, **kwargs)
                _join_job_store()
                return result

            init_process_group._oomflight = True
            c10d.init_process_group = init_process_group
            dist.init_process_group = init_process_group
        destroy = c10d.destroy_process_group
        if not getattr(destroy, "_oomflight", False):
            @functools.wraps(destroy)
            def destroy_process_group(*args, **kwargs):
                if _destroys_default_group(dist, args, kwargs):
                    _leave_job_store("destroy_process_group")
                return destroy(*args, **kwargs)

            destroy_process_group._oomflight = True
            c10d.destroy_process_group = destroy_process_group
            dist.destroy_process_group = destroy_process_group
        if dist.is_initialized():
            _join_job_store()
    except Exception as e:  # noqa: BLE001
        _log("warn", f"not watching torch.distributed's start: {e}")


def _optimizer_step_hook(optimizer, args, kwargs) -> None:
    if not _state["auto_batches"] or _oomflight._explicit_batches or not _oomflight.initialized():
        return
    try:
        _mark(_state["batch"] + 1)
    except Exception:  # noqa: BLE001
        pass


def stop_marking_batches() -> None:
    """The job marks batches itself (oomflight.mark_batch, or a Composer / Lightning callback): the optimizer
    hook stops marking them."""
    _state["auto_batches"] = False


STACKS = ("python", "torch", "off")


def stacks_setting(stacks: bool | str | None = None) -> str:
    """Which call sites events carry: `stacks` when given (True is "torch", False "off", as before 0.2.1), else
    OOMFLIGHT_STACKS, else "python". Raises ValueError naming the values for any other."""
    import os

    if stacks is None:
        stacks = os.environ.get("OOMFLIGHT_STACKS", "") or "python"
    elif stacks is True:
        stacks = "torch"
    elif stacks is False:
        stacks = "off"
    if stacks not in STACKS:
        raise ValueError(f"stacks: {stacks!r} is not one of {', '.join(STACKS)} (OOMFLIGHT_STACKS)")
    return stacks


def install(*, mark_batches: bool = True, stacks: bool | str | None = None, **settings: object) -> bool:
    """Installs the hooks in this process; idempotent. `settings` as oomflight.init's (used when install
    initialises oomflight). Returns True when the allocator hooks are (or will be, at CUDA init) attached; False
    with one logged warning when they cannot be. Without a CUDA device oomflight starts at once and records
    batches and metadata (and dumps on demand) with no allocator events. `stacks` (stacks_setting(): by default
    OOMFLIGHT_STACKS, else "python"): "python" captures the allocating thread's Python stack for every event in the
    extension; "torch" turns torch's memory history on with Python contexts once the hooks attach
    (``_record_memory_history(context="all", stacks="python", max_entries=1)``); "off" records no call sites.
    Where the job records memory history itself, its contexts are used as they are. Raises ValueError for a
    `stacks` that is none of these."""
    import torch

    mode = stacks_setting(stacks)
    with _lock:
        if _state["installed"]:
            return not _state["why_not"]
        _state["installed"] = True
        _state["settings"] = settings
        _state["auto_batches"] = mark_batches
        _state["stacks"] = mode
    if mark_batches:
        # torch.optim's namespace does not keep the submodule as an attribute (2.11): import it by name.
        import importlib

        optimizer = importlib.import_module("torch.optim.optimizer")
        if hasattr(optimizer, "register_optimizer_step_post_hook"):
            optimizer.register_optimizer_step_post_hook(_optimizer_step_hook)
    _hook_process_group()
    try:
        _extension.check_torch(torch)
        if not torch.cuda.is_available():
            raise _extension.PluginError(
                f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False): the caching "
                "allocator's hooks are not attached; batches, metadata and on-demand dumps are still recorded")
    except _extension.PluginError as e:
        _state["why_not"] = str(e)
        _log("warn", f"not recording CUDA allocator events: {e}")
        with _lock:
            try:
                _start()  # no CUDA initialisation to wait for: start now
            except Exception as e:  # noqa: BLE001 - never into training
                # oomflight did not start at all (a setting that does not parse, or that differs between an MPI
                # job's ranks): its error says so, not as a failure of the allocator's hooks.
                _state["why_not"] = str(e)
                _log("warn", f"not recording: {e}")
        return False
    # After CUDA's initialisation: a tracker attached before it reaches no device allocator, and oomflight's MPI
    # is initialised only once the job has chosen its device (docs/pytorch.md).
    if torch.cuda.is_initialized():
        _attach()
    else:
        torch.cuda._lazy_call(_attach)
    return True


def status() -> dict:
    """What install() achieved: installed, attached, why_not, batch, auto_batches, how the extension was loaded,
    and its counters (forwarded, unmapped, not_recorded, observer_dumps, devices)."""
    out = {k: _state[k] for k in ("installed", "attached", "why_not", "batch", "auto_batches", "stacks")}
    module = _state.get("module")
    if module is not None:
        out["extension"] = getattr(module, "__file__", "")
        out["loaded"] = _extension.how_loaded()
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


def check(out=None) -> int:
    """The diagnostic of ``python -m oomflight.torch --check``: prints what works here (the package, liboomflight,
    torch, the extension and how it was built, the hooks, the device, what was verified without one) and returns
    0 when the extension and liboomflight load, else 1 with what is missing."""
    import sys
    from pathlib import Path

    out = out or sys.stdout
    ok = True

    def say(text: str) -> None:
        print(text, file=out)

    say(f"oomflight package: {Path(_oomflight.__file__).parent}")
    try:
        say(f"liboomflight: {_oomflight.version()} at {_oomflight.library_path()}")
    except (OSError, ImportError) as e:
        ok = False
        say(f"liboomflight: MISSING: {e}")
    try:
        import torch
    except ImportError as e:
        say(f"torch: MISSING: {e}")
        return 1
    say(f"torch: {torch.__version__} (CUDA {torch.version.cuda}) at {Path(torch.__file__).parent}")
    try:
        module = _extension.load(torch)
        info = module.build_info()
        say(f"extension: {module.__file__}")
        say(f"  {_extension.how_loaded()}, compiled against torch {info['torch_version']}")
        say(f"hooks: {info['hooks']}; allocator backend {torch.cuda.memory.get_allocator_backend()}")
        result = module.self_test()
        actions = sum(1 for k, v in result.items() if k.startswith("recorded_") and v == 1)
        say(f"verified without a device: {actions} of 9 torch TraceEntry actions recorded by name through the "
            f"trace callback; the OOM observer sent {result['dumps']} dump request of {result['request_size']} "
            f"bytes (0.3: with the allocator state) carrying {result['segments']} segment and {result['blocks']} "
            "block from a SnapshotInfo")
        if actions != 9 or result["dumps"] != 1 or result["segments"] != 1:
            ok = False
            say(f"  SELF-TEST FAILED: {result}")
    except _extension.PluginError as e:
        ok = False
        say(f"extension: MISSING: {e}")
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(d) for d in range(torch.cuda.device_count())]
        say(f"device: {len(names)} CUDA device(s): {', '.join(names)}; the hooks attach at CUDA initialisation")
    else:
        say("device: none (torch.cuda.is_available() is False): the hooks cannot attach here; batches, metadata "
            "and on-demand dumps still work")
    say("ok" if ok else "NOT OK: see the lines marked MISSING or FAILED")
    return 0 if ok else 1


def _main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m oomflight.torch",
                                     description="oomflight's PyTorch hooks: what works in this environment")
    parser.add_argument("--check", action="store_true", help="print the diagnostic; exit 0 when the extension "
                        "and liboomflight load, 1 otherwise")
    args = parser.parse_args(argv)
    if not args.check:
        parser.print_help()
        return 2
    return check()


if __name__ == "__main__":
    import sys as _sys

    # Run as a script, this file is __main__, not oomflight.torch: use the package's module so that its state is
    # the one install() would use.
    from oomflight import torch as _package_module

    _sys.exit(_package_module._main(_sys.argv[1:]))
