"""A Lightning callback: oomflight's recorder for a Lightning Trainer (lightning or pytorch_lightning).

    from oomflight.integrations.lightning import OomflightCallback
    trainer = L.Trainer(..., callbacks=[OomflightCallback()])

At setup it initialises oomflight and installs the CUDA allocator hooks; it marks a batch at every
on_train_batch_start, counting training batches across epochs from 0 (batch_idx restarts each epoch); and an
out-of-memory exception that Lightning reports through on_exception is dumped (once) before Lightning re-raises it.
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


class OomflightCallback(_Base):
    def __init__(self, max_entries: int | None = None, folder: str | None = None, overwrite: bool | None = None,
                 install_torch: bool = True, **settings: object) -> None:
        self._settings = settings_from(dict(settings, max_entries=max_entries, folder=folder, overwrite=overwrite))
        self._install_torch = install_torch
        self._batch = -1

    def setup(self, trainer, pl_module, stage: str | None = None) -> None:
        start(self._settings, None, self._install_torch)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self._batch += 1
        oomflight.mark_batch(self._batch)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        dump_for(exception)
