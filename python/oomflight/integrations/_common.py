"""What the trainer callbacks share: settings from Composer-style arguments, and start-up."""
from __future__ import annotations

import oomflight

# Arguments of Composer's MemorySnapshot / OOMObserver that oomflight has too (same meaning).
_OVERLAP = ("max_entries", "folder", "overwrite")
# Composer's schedule arguments: interval-scoped snapshots are not built yet (issue 8).
_SCHEDULE = ("skip_batches", "interval")


def settings_from(kwargs: dict) -> dict:
    """oomflight.init keyword settings from a callback's arguments; None means "the environment's"."""
    for name in _SCHEDULE:
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"{name}: scheduled snapshots are not available in this oomflight yet; "
                                      "only out-of-memory dumps are taken")
    return {k: v for k, v in kwargs.items() if v is not None and k not in _SCHEDULE}


def start(settings: dict, run_name: str | None, install_torch: bool) -> None:
    """Initialises oomflight (once per process) and installs the torch hooks without the optimizer-step batch
    marks: the callback marks batches from the trainer's own count."""
    if run_name and "run_name" not in settings:
        settings = dict(settings, run_name=run_name)
    if not oomflight.initialized():
        oomflight.init(**settings)
    if install_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            return
        from oomflight import torch as oomflight_torch

        oomflight_torch.install(mark_batches=False)
