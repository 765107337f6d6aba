"""A Lightning callback: oomflight's recorder for a Lightning Trainer (lightning or pytorch_lightning).

    from oomflight.integrations.lightning import OomflightCallback
    trainer = L.Trainer(..., callbacks=[OomflightCallback(skip_batches=1, interval="2ba")])

At setup it initialises oomflight (the run named after the Trainer's logger, "NAME-version_N", unless a setting or
OOMFLIGHT_RUN_NAME names it) and installs the CUDA allocator hooks; at every on_train_batch_start it marks the
batch with the Trainer's own count of training batches across epochs (fit_loop.epoch_loop.total_batch_idx:
batch_idx restarts each epoch); skip_batches and interval are Composer's MemorySnapshot schedule (one archive of
all ranks per window); an out-of-memory exception that Lightning reports through on_exception is dumped (once)
before Lightning re-raises it.
"""
from __future__ import annotations

import oomflight
from oomflight.oom import dump_for
from ._common import settings_from, start

try:
    from lightning.pytorch import Callback as _Base
except ImportError:
    try:
        from pytorch_lightning import Callback as _Base
    except ImportError:  # usable (and testable) without Lightning
        _Base = object

__all__ = ["OomflightCallback"]


def _run_name(trainer) -> str | None:
    logger = getattr(trainer, "logger", None)
    if logger is None:
        return None
    try:
        version = logger.version
        return f"{logger.name}-version_{version}" if isinstance(version, int) else f"{logger.name}-{version}"
    except Exception:  # noqa: BLE001 - a logger that cannot name itself leaves the run unnamed
        return None


def _total_batch_idx(trainer, batch_idx: int) -> int:
    try:
        return int(trainer.fit_loop.epoch_loop.total_batch_idx)
    except AttributeError:  # not a Lightning Trainer: the epoch's own index
        return int(batch_idx)


class OomflightCallback(_Base):
    def __init__(self, max_entries: int | None = None, folder: str | None = None, overwrite: bool | None = None,
                 skip_batches: int | None = None, interval: "str | int | None" = None, install_torch: bool = True,
                 **settings: object) -> None:
        self._settings = settings_from(dict(settings, max_entries=max_entries, folder=folder, overwrite=overwrite,
                                            skip_batches=skip_batches, interval=interval))
        self._install_torch = install_torch

    def setup(self, trainer, pl_module, stage: str | None = None) -> None:
        start(self._settings, _run_name(trainer), self._install_torch)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        oomflight.mark_batch(_total_batch_idx(trainer, batch_idx))

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        dump_for(exception)
