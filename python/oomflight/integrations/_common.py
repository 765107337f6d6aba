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


# The defaults of the settings the callbacks name (`oomflight config` prints them all; python.torch_trainers checks
# these against it), so that a callback argument equal to the default in force is not reported as not applied.
DEFAULTS = {"OOMFLIGHT_MAX_ENTRIES": "100000", "OOMFLIGHT_FOLDER": "{run_name}/oomflight", "OOMFLIGHT_OVERWRITE": "0"}
_BOOLEANS = {"OOMFLIGHT_ENABLED", "OOMFLIGHT_OVERWRITE", "OOMFLIGHT_KEEP_RANK_FILES", "OOMFLIGHT_DUMP_ON_EXIT"}
_named = False  # the warning was given (once a process)


def _normal(name: str, text: str | None) -> str | None:
    """A setting's text as the library reads it, for comparing: booleans as 1/0 (parse_bool's words), a folder
    without a trailing '/'."""
    if text is None:
        return text
    if name == "OOMFLIGHT_FOLDER":
        return text.rstrip("/") or text
    if name not in _BOOLEANS:
        return text
    low = text.strip().lower()
    return "1" if low in ("1", "true", "yes", "on") else "0" if low in ("0", "false", "no", "off") else text


def _say_what_is_not_applied(settings: dict) -> None:
    """oomflight already runs in this process (`oomflight run` started it at `import torch`, the job called init(),
    or this callback did for an earlier fit): its settings were read then, and the callback's cannot change them
    now (the history's size, the schedule every rank agreed on). Each one that differs from what is in force (the
    session's keyword settings, else the environment, else the default) is named once a process, with the variable
    that gives it, rather than dropped in silence."""
    global _named
    if _named:
        return
    in_force = dict(DEFAULTS)
    in_force.update({k: v for k, v in os.environ.items() if k.startswith("OOMFLIGHT_")})
    in_force.update(oomflight._given_settings)
    wanted = oomflight.settings_to_variables(**settings)
    ignored = [(name, text) for name, text in wanted.items()
               if _normal(name, text) != _normal(name, in_force.get(name))]
    if not ignored:
        return
    _named = True
    listed = " ".join(f"{name}={text}" for name, text in ignored)
    oomflight.log("warn", f"the trainer callback's settings are not applied: oomflight was already started in this "
                          f"process (by `oomflight run` or an earlier init) with other settings; to use them, set "
                          f"{listed} in every rank's environment (export them before the launcher; mpirun -x "
                          f"NAME on other nodes)")
