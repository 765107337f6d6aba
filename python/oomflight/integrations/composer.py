"""A Composer callback: oomflight's recorder for a Composer Trainer.

    from oomflight.integrations.composer import OomflightCallback
    trainer = Trainer(..., callbacks=[OomflightCallback(skip_batches=1, interval="2ba")])

It takes the arguments that Composer's OOMObserver and MemorySnapshot share with oomflight (max_entries, folder,
overwrite, skip_batches, interval; same meanings) plus any oomflight setting as a keyword. At FIT_START it
initialises oomflight with the Trainer's run name and installs the CUDA allocator hooks; at every BATCH_START it
marks the batch with the Trainer's own count (state.timestamp.batch). Unlike OOMObserver and MemorySnapshot, where
each rank writes its own file, an OOM on any rank, and each snapshot window (batches [skip_batches, skip_batches +
interval)), give one archive of all ranks.
"""
from __future__ import annotations

import oomflight
from ._common import settings_from, start

try:  # Composer dispatches events by name (Callback.run_event -> getattr(self, event.value))
    from composer.core import Callback as _Base
except ImportError:  # usable (and testable) without Composer
    _Base = object

__all__ = ["OomflightCallback"]


def _int(value) -> int:
    return int(getattr(value, "value", value))


class OomflightCallback(_Base):
    def __init__(self, max_entries: int | None = None, folder: str | None = None, overwrite: bool | None = None,
                 skip_batches: int | None = None, interval: "str | int | None" = None, install_torch: bool = True,
                 **settings: object) -> None:
        self._settings = settings_from(dict(settings, max_entries=max_entries, folder=folder, overwrite=overwrite,
                                            skip_batches=skip_batches, interval=interval))
        self._install_torch = install_torch

    def fit_start(self, state, logger) -> None:
        start(self._settings, getattr(state, "run_name", None), self._install_torch)

    def batch_start(self, state, logger) -> None:
        oomflight.mark_batch(_int(state.timestamp.batch))
