"""Lightning joins storwatch with one callback::

    from storwatch_training.lightning import StorwatchCallback

    trainer = L.Trainer(callbacks=[StorwatchCallback()], ...)

The run directory is the ``ModelCheckpoint``'s ``dirpath`` (Lightning's own: ``<default_root_dir>/lightning_logs/
version_N/checkpoints`` unless given; ``<default_root_dir>/checkpoints`` without a ModelCheckpoint), where the agent
places its request. At the end of each training batch the callback reads the request (the request file, or SIGUSR1
caught by the handler it installs for the training) and, when asked, saves at that very step with
``trainer.save_checkpoint``, named as the ModelCheckpoint names its own (``epoch=E-step=S.ckpt``; Lightning's
version suffix where that name is taken). Such a save is not one of the ModelCheckpoint's ``save_top_k``: it stays
until removed, and at a step where the ModelCheckpoint saves too, both are written.

Every save through the strategy's ``CheckpointIO`` (the requested ones, the ModelCheckpoint's, ``save_checkpoint``
calls of the user) is timed by a wrapper around it: from the call to its return, once Lightning has written the file
and moved it into place; the process that wrote it records the span in the directory's
``.storwatch-events.jsonl`` and removes the request the save answered. Saves that bypass the ``CheckpointIO``
(DeepSpeed, a sharded FSDP state) and those of an ``AsyncCheckpointIO`` (written in a thread after the call returns)
are not timed: requests are still answered.

In a job of several processes the decision is theirs together: any process asked means all save (Lightning's
``reduce_boolean_decision`` at each polled step).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO, CheckpointIO
from lightning.pytorch.utilities.types import STEP_OUTPUT

from storwatch_training.requests import DEFAULT_SIGNALS, CheckpointRequests

log = logging.getLogger(__name__)


class _TimedCheckpointIO(CheckpointIO):
    """The strategy's CheckpointIO, each save timed and recorded."""

    def __init__(self, inner: CheckpointIO, requests: CheckpointRequests) -> None:
        super().__init__()
        self.inner = inner
        self.requests = requests

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        self.requests.answering()
        start = time.time()
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        end = time.time()
        target = os.fspath(path)
        if "://" not in target:  # a remote store's object is no file the agent sees
            step = checkpoint.get("global_step")
            self.requests.saved(target, start, end, step if isinstance(step, int) else None)

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.inner.load_checkpoint(*args, **kwargs)

    def remove_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self.inner.remove_checkpoint(*args, **kwargs)

    def teardown(self) -> None:
        self.inner.teardown()


class StorwatchCallback(Callback):
    """Answers the agent's checkpoint requests at the next training batch's end and records every save's span."""

    def __init__(self, *, signals: Iterable[int | signal.Signals] = DEFAULT_SIGNALS, poll_every_steps: int = 1) -> None:
        """``signals``: those a handler is installed for while the Trainer fits (none: the request file alone);
        ``poll_every_steps``: read the request at every step divisible by it."""
        self.requests = CheckpointRequests(signals, poll_every_steps)
        self._timed: _TimedCheckpointIO | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or self._timed is not None:
            return
        current = trainer.strategy.checkpoint_io
        if isinstance(current, AsyncCheckpointIO):
            log.warning("storwatch: saves through AsyncCheckpointIO are not timed (they are written in a thread)")
        elif not isinstance(current, _TimedCheckpointIO):
            self._timed = _TimedCheckpointIO(current, self.requests)
            trainer.strategy.checkpoint_io = self._timed

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._timed is not None and trainer.strategy.checkpoint_io is self._timed:
            trainer.strategy.checkpoint_io = self._timed.inner
        self._timed = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Here, not in setup: each ModelCheckpoint resolves its dirpath in its own setup, which runs after this one's,
        # and Lightning installs its own handlers after setup (chained by ours).
        self.requests.watch(self._run_dir(trainer))
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.dirpath:
                self.requests.watch(os.fspath(callback.dirpath))
        self.requests.install()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.requests.uninstall()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.requests.uninstall()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step % self.requests.poll_every_steps:
            return
        asked = self.requests.pending(step)
        if trainer.world_size > 1:
            asked = trainer.strategy.reduce_boolean_decision(asked, all=False)
        if asked:
            self.requests.answering()
            trainer.save_checkpoint(self._checkpoint_path(trainer))

    @staticmethod
    def _model_checkpoint(trainer: pl.Trainer) -> ModelCheckpoint | None:
        callback = trainer.checkpoint_callback
        return callback if isinstance(callback, ModelCheckpoint) and callback.dirpath else None

    def _run_dir(self, trainer: pl.Trainer) -> str:
        callback = self._model_checkpoint(trainer)
        if callback is not None and callback.dirpath:
            return os.fspath(callback.dirpath)
        return os.path.join(trainer.default_root_dir, "checkpoints")

    def _checkpoint_path(self, trainer: pl.Trainer) -> str:
        """Where a requested save goes: the ModelCheckpoint's name for this step, with Lightning's version suffix
        (``-v1``...) where that name is taken."""
        callback = self._model_checkpoint(trainer)
        metrics: dict[str, Any] = dict(trainer.callback_metrics)
        metrics["epoch"] = torch.tensor(trainer.current_epoch)
        metrics["step"] = torch.tensor(trainer.global_step)

        def name(version: int | None) -> str:
            if callback is not None:
                return callback.format_checkpoint_name(metrics, ver=version)
            stem = f"epoch={trainer.current_epoch}-step={trainer.global_step}"
            return os.path.join(self._run_dir(trainer), stem + ("" if version is None else f"-v{version}") + ".ckpt")

        path, version = name(None), ModelCheckpoint.STARTING_VERSION
        while os.path.exists(path):
            path, version = name(version), version + 1
        return path
