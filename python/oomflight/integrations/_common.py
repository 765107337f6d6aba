"""What the trainer callbacks share: settings from Composer-style arguments, and start-up."""
from __future__ import annotations

import os

import oomflight

# Arguments of Composer's MemorySnapshot / OOMObserver that oomflight has too (same meaning).
_OVERLAP = ("max_entries", "folder", "overwrite")


def interval_text(value: object) -> str:
    """Composer's interval as oomflight's OOMFLIGHT_INTERVAL text: a time string ("2ba") as it is, a Composer Time
    (its to_timestring()), an int as that many batches. Units other than batches are refused by the library, with
    the value named."""
    if isinstance(value, bool):
        raise ValueError(f"interval: {value!r} is not a number of batches")
    if isinstance(value, int):
        return f"{value}ba"
    to_timestring = getattr(value, "to_timestring", None)
    return to_timestring() if callable(to_timestring) else str(value)


def settings_from(kwargs: dict) -> dict:
    """oomflight.init keyword settings from a callback's arguments; None means "the environment's". skip_batches
    and interval are Composer's MemorySnapshot schedule: OOMFLIGHT_SKIP_BATCHES and OOMFLIGHT_INTERVAL (one window of
    batches [skip_batches, skip_batches + interval), written by every rank as one archive of kind snapshot)."""
    settings = {k: v for k, v in kwargs.items() if v is not None}
    if "interval" in settings:
        settings["interval"] = interval_text(settings["interval"])
    return settings


def start(settings: dict, run_name: str | None, install_torch: bool) -> None:
    """Initialises oomflight (once per process) and installs the torch hooks without the optimizer-step batch
    marks: the callback marks batches from the trainer's own count. The trainer's run name is used unless a
    setting or OOMFLIGHT_RUN_NAME (`oomflight run --run-name`) names the run. A process the callback started ends its
    session as its exit says: the library's exit handler (a status-0 exit leaves with the other ranks and finalises
    MPI, which mpirun needs; any other leaves at once), and an uncaught exception at once (docs/pytorch.md)."""
    if oomflight.initialized():
        _say_what_is_not_applied(settings)
    else:
        if run_name and "run_name" not in settings and not os.environ.get("OOMFLIGHT_RUN_NAME"):
            settings = dict(settings, run_name=run_name)
        oomflight.init(**settings)
        from oomflight import _autostart

        _autostart.shutdown_at_normal_exit()
    if install_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            return
        from oomflight import torch as oomflight_torch

        oomflight_torch.install(mark_batches=False)


def _say_what_is_not_applied(settings: dict) -> None:
    """oomflight already runs in this process (`oomflight run` started it at `import torch`, or the job called
    init()): its settings were read then, and the callback's cannot change them now (the history's size, the
    schedule every rank agreed on). Each one that differs from what the session took from the environment is named
    once, with the variable that gives it, rather than dropped in silence."""
    variables = oomflight.settings_to_variables(**settings)
    ignored = [(name, text) for name, text in variables.items() if os.environ.get(name) != text]
    if not ignored:
        return
    listed = " ".join(f"{name}={text}" for name, text in ignored)
    oomflight.log("warn", f"the trainer callback's settings are not applied: oomflight was already started in this "
                          f"process (by `oomflight run` or an earlier init) with the environment's; to use them, set "
                          f"{listed} in every rank's environment (export them before the launcher; mpirun -x "
                          f"NAME on other nodes)")
