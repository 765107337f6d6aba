"""What `oomflight run` starts in a Python process (through _bootstrap/sitecustomize.py):

- the out-of-memory classifier on the exception that reaches the top (sys.excepthook), which dumps every rank
  once for an OOM the allocator hook did not already dump, then prints the job's traceback as before;
- oomflight.torch.install() as soon as the job imports torch (a post-import hook; torch is never imported by
  oomflight itself), which attaches the allocator hooks once CUDA is initialised;
- at an uncaught exception, the end of the session as an error ends it (oomflight_end(1): every other rank is told
  at once that this one left, nothing waits for them, MPI is not finalised), before the interpreter's finalisation.

Every other ending is the library's: at the process's exit it ends the session as the exit status says (a clean
return or sys.exit(0) leaves with the others and finalises the MPI oomflight started; sys.exit(2) leaves at once),
because only the C library's exit handler is told the status (docs/protocol.md, "Leaving").
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

    if not STATE["uncaught"] or not oomflight.initialized():
        return  # the library's exit handler ends it, knowing the status
    try:
        oomflight._end(1)
    except Exception as e:  # noqa: BLE001
        print(f"oomflight warn: end: {e}", file=sys.stderr)


def shutdown_at_normal_exit() -> None:
    """At an uncaught exception, ends the session as an error exit at interpreter exit (the other ranks learn at
    once); once (oomflight run, and the trainer callbacks and oomflight.torch.install when they start oomflight).
    Every other exit is ended by the library, which knows the exit status."""
    if STATE["exit_hooked"]:
        return
    STATE["exit_hooked"] = True
    _excepthook_wrapper()
    atexit.register(_at_exit)


def _is_torchrun_agent() -> bool:
    """torchrun (or python -m torch.distributed.run / .launch) itself: it starts the workers and is no rank. The
    workers, which inherit the environment, start oomflight each."""
    import os

    argv = getattr(sys, "orig_argv", sys.argv)
    if sys.argv and os.path.basename(sys.argv[0]) == "torchrun":
        return True
    if sys.argv and sys.argv[0].replace(os.sep, "/").endswith(("torch/distributed/run.py",
                                                                "torch/distributed/launch.py")):
        return True  # python -m torch.distributed.run on a Python without sys.orig_argv (3.9)
    return any(a == "-m" and b in ("torch.distributed.run", "torch.distributed.launch")
               for a, b in zip(argv, argv[1:]))


def start() -> None:
    if STATE["started"]:
        return
    STATE["started"] = True
    if _is_torchrun_agent():
        return
    shutdown_at_normal_exit()
    if "torch" in sys.modules:
        _hook_torch()
    else:
        sys.meta_path.insert(0, _AfterTorchImport())
