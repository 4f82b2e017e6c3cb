"""Accelerate joins storwatch with one object and one call at the end of each step (Accelerate has no loop of its own
to hook into)::

    from storwatch_training.accelerate import StorwatchCheckpoints

    checkpoints = StorwatchCheckpoints(accelerator)
    for step, batch in enumerate(loader):
        ...
        optimizer.step()
        optimizer.zero_grad()
        checkpoints.step_end(step)

The run directory is where ``accelerator.save_state()`` saves: ``<project_dir>/checkpoints`` with
``ProjectConfiguration(automatic_checkpoint_naming=True)``, else the ``save_dir`` given
(``StorwatchCheckpoints(accelerator, save_dir="ckpt")``: a requested save goes to ``ckpt/checkpoint_<step>``). The
agent places its request there. ``step_end`` reads the request (the request file, or SIGUSR1 caught by the handler
installed here) and, when asked, calls ``accelerator.save_state`` at once.

Every ``save_state`` of this accelerator (the requested ones and the loop's own) is timed: this object wraps the
accelerator's ``save_state`` (an attribute of that one instance; :meth:`StorwatchCheckpoints.close` puts it back),
from the call to its return (in a job of several processes, to the moment every process has returned). The process
that writes the checkpoint records the span in the ``.storwatch-events.jsonl`` beside the checkpoint's directory
(and watches that directory for requests from then on) and removes the request the save answered.

In a job of several processes the decision is theirs together: any process asked means all save (one small
reduction at each polled step).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

from storwatch_training.requests import DEFAULT_SIGNALS, CheckpointRequests

_CHECKPOINT_NAME = re.compile(r"checkpoint_(\d+)")
"""Accelerate's automatic checkpoint names."""


class StorwatchCheckpoints:
    """Answers the agent's checkpoint requests at :meth:`step_end` and records every ``save_state``'s span."""

    def __init__(
        self,
        accelerator: Any,
        save_dir: str | os.PathLike[str] | None = None,
        *,
        signals: Iterable[int | signal.Signals] = DEFAULT_SIGNALS,
        poll_every_steps: int = 1,
    ) -> None:
        """``accelerator``: the job's ``accelerate.Accelerator``; ``save_dir``: where requested saves go without
        automatic checkpoint naming; ``signals``: those a handler is installed for until :meth:`close` (none: the
        request file alone); ``poll_every_steps``: read the request at every step divisible by it.

        Raises ValueError when there is nowhere to save: no ``save_dir`` and no automatic checkpoint naming."""
        self.accelerator = accelerator
        self.save_dir = None if save_dir is None else os.path.abspath(os.fspath(save_dir))
        if self.save_dir is None and not self._automatic():
            raise ValueError(
                "StorwatchCheckpoints needs somewhere to save: give save_dir, or an Accelerator with "
                "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)"
            )
        self.requests = CheckpointRequests(signals, poll_every_steps)
        self.requests.watch(self.run_dir)
        self.step = 0
        """The last step :meth:`step_end` was told of (or counted)."""
        self._saving_at: int | None = None
        """The step of the save :meth:`step_end` is making (a save the loop makes itself has no step known here)."""
        self._save_state: Callable[..., Any] = accelerator.save_state
        accelerator.save_state = self._timed_save_state
        self.requests.install()

    def _automatic(self) -> bool:
        config = self.accelerator.project_configuration
        return bool(config.automatic_checkpoint_naming and config.project_dir)

    @property
    def run_dir(self) -> str:
        """Where requested saves go, and the agent's requests are read."""
        if self._automatic():
            return os.path.join(os.path.abspath(self.accelerator.project_configuration.project_dir), "checkpoints")
        assert self.save_dir is not None
        return self.save_dir

    def step_end(self, step: int | None = None) -> bool:
        """At the end of a step (``step``: its number, else one more than the last): save at once when the agent
        asked; whether it saved. Every process of the job calls it."""
        self.step = self.step + 1 if step is None else step
        if self.step % self.requests.poll_every_steps:
            return False
        asked = self.requests.pending(self.step)
        if self.accelerator.num_processes > 1:
            asked = self._any_process(asked)
        if not asked:
            return False
        self._saving_at = self.step
        if self._automatic():
            self.accelerator.save_state()
        else:
            self.accelerator.save_state(self._free_dir(os.path.join(self.run_dir, f"checkpoint_{self.step}")))
        return True

    def _any_process(self, asked: bool) -> bool:
        import torch

        flag = torch.tensor([1 if asked else 0], device=self.accelerator.device)
        return bool(self.accelerator.reduce(flag, reduction="sum").item() > 0)

    @staticmethod
    def _free_dir(path: str) -> str:
        candidate, n = path, 1
        while os.path.exists(candidate):
            candidate, n = f"{path}-{n}", n + 1
        return candidate

    def _writes(self) -> bool:
        if self.accelerator.project_configuration.save_on_each_node:
            return bool(self.accelerator.is_local_main_process)
        return bool(self.accelerator.is_main_process)

    def _timed_save_state(self, output_dir: str | None = None, *args: Any, **kwargs: Any) -> Any:
        requested = self._saving_at
        self._saving_at = None
        self.requests.answering()
        start = time.time()
        config = self.accelerator.project_configuration
        limit = config.total_limit if self._automatic() else None
        if limit is not None:
            self._remove_past_limit(limit)
            config.total_limit = None
        try:
            location = self._save_state(output_dir, *args, **kwargs)
        finally:
            if limit is not None:
                config.total_limit = limit
        if self.accelerator.num_processes > 1:
            self.accelerator.wait_for_everyone()  # the checkpoint is whole once every process has written its part
        end = time.time()
        if self._writes() and location is not None:
            self.requests.saved(os.fspath(location), start, end, requested)
        return location

    def _remove_past_limit(self, limit: int) -> None:
        """Accelerate's ``total_limit``, kept here: the oldest ``checkpoint_N`` directories removed (by the main
        process) so that the one about to be saved makes ``limit``. Accelerate's own takes every entry of the
        directory for a checkpoint and fails on a file without a number in its name: the event log, the agent's
        request."""
        if not self.accelerator.is_main_process:
            return
        try:
            names = os.listdir(self.run_dir)
        except OSError:
            return
        folders = sorted(
            (int(m.group(1)), name)
            for name in names
            if (m := _CHECKPOINT_NAME.fullmatch(name)) and os.path.isdir(os.path.join(self.run_dir, name))
        )
        for _, name in folders[: max(len(folders) + 1 - limit, 0)]:
            shutil.rmtree(os.path.join(self.run_dir, name))

    def close(self) -> None:
        """Put back the accelerator's own ``save_state`` and the signal handlers that were there."""
        if self.accelerator.__dict__.get("save_state") == self._timed_save_state:
            del self.accelerator.save_state
        self.requests.uninstall()

    def __enter__(self) -> StorwatchCheckpoints:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
