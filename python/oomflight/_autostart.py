"""What `oomflight run` starts in a Python process (through _bootstrap/sitecustomize.py):

- the out-of-memory classifier on the exception that reaches the top (sys.excepthook), which dumps every rank
  once for an OOM the allocator hook did not already dump, then prints the job's traceback as before;
- oomflight.torch.install() as soon as the job imports torch (a post-import hook; torch is never imported by
  oomflight itself), which attaches the allocator hooks once CUDA is initialised;
- at a normal exit, oomflight.shutdown() (not after an uncaught exception: MPI_Finalize would wait for ranks that
  are going down).
"""
from __future__ import annotations

import atexit
import importlib.abc
import sys

STATE = {"started": False, "torch_hooked": False, "uncaught": False, "exit_hooked": False}


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Calls oomflight.torch.install() right after `import torch` completes, then steps aside."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # find torch's own spec with the other finders
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            _hook_torch()

        loader.exec_module = exec_module
        return spec


def _hook_torch() -> None:
    if STATE["torch_hooked"]:
        return
    STATE["torch_hooked"] = True
    try:
        from oomflight import torch as oomflight_torch

        oomflight_torch.install()
    except Exception as e:  # noqa: BLE001
        print(f"oomflight warn: not recording CUDA allocator events: {e}", file=sys.stderr)


def _excepthook_wrapper() -> None:
    from oomflight.oom import install_excepthook

    previous = sys.excepthook

    def note_uncaught(exc_type, exc, tb):
        STATE["uncaught"] = True
        previous(exc_type, exc, tb)

    sys.excepthook = note_uncaught
    install_excepthook()  # runs first: the dump, then the job's traceback through note_uncaught


def _at_exit() -> None:
    import oomflight

    if STATE["uncaught"] or not oomflight.initialized():
        return
    try:
        oomflight.shutdown()
    except Exception as e:  # noqa: BLE001
        print(f"oomflight warn: shutdown: {e}", file=sys.stderr)


def shutdown_at_normal_exit() -> None:
    """oomflight.shutdown() at a normal exit, not after an uncaught exception; once (oomflight run, and the trainer
    callbacks and oomflight.torch.install when they start oomflight)."""
    if STATE["exit_hooked"]:
        return
    STATE["exit_hooked"] = True
    _excepthook_wrapper()
    atexit.register(_at_exit)


def start() -> None:
    if STATE["started"]:
        return
    STATE["started"] = True
    shutdown_at_normal_exit()
    if "torch" in sys.modules:
        _hook_torch()
    else:
        sys.meta_path.insert(0, _AfterTorchImport())
