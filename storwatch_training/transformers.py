"""The Hugging Face Trainer joins storwatch with one callback::

    from storwatch_training.transformers import StorwatchCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[StorwatchCallback()])

The run directory is the Trainer's ``output_dir`` (where its ``checkpoint-N/`` directories go, and where the agent
places its request). At each step's end the callback reads the agent's request (the request file, or SIGUSR1 caught
by the handler it installs for the training) and, when asked, has the Trainer save at that very step, as its own
``save_steps`` would; after every save, the requested ones and the Trainer's own, the process that wrote it records
the save's span in ``output_dir/.storwatch-events.jsonl`` and removes the request the save answered.

The span: it begins when the last callback before the save returned (the step's end, or the logging or evaluation
the Trainer does at that step before saving) and ends at ``on_save``, which the Trainer calls once the checkpoint's
files are written and closed (after removing checkpoints past ``save_total_limit``, which counts in the span); in a
job of several processes, once every process has reached ``on_save`` (each writes its own RNG state).

In a job of several processes all of them take part in a save, so the decision is theirs together: any process
asked means all save (one small all-reduce at each polled step). A save that ``save_strategy="best"`` cancels after
an evaluation at the same step is asked for again at the next step.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from storwatch_training.requests import DEFAULT_SIGNALS, Asked, CheckpointRequests


def _several_processes() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _any_process(asked: bool, device: Any) -> bool:
    """Whether any process of the job was asked (all-reduce, max), or ``asked`` alone in a one-process job."""
    if not _several_processes():
        return asked
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if asked else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


class StorwatchCallback(TrainerCallback):
    """Answers the agent's checkpoint requests at the next step's end and records every save's span."""

    def __init__(self, *, signals: Iterable[int | signal.Signals] = DEFAULT_SIGNALS, poll_every_steps: int = 1) -> None:
        """``signals``: those a handler is installed for while the Trainer trains (none: the request file alone);
        ``poll_every_steps``: read the request at every step divisible by it."""
        self.requests = CheckpointRequests(signals, poll_every_steps)
        self._before_save: float | None = None
        """When the last callback before a save returned: the save's start."""
        self._asked: Asked | None = None
        """What had asked when the Trainer last decided to save (or evaluated, after which it may decide): what
        its save answers, once ``on_save`` shows it was made (``save_strategy="best"`` may cancel it)."""

    def _mark(self, control: TrainerControl, evaluated: bool = False) -> None:
        if control.should_save or evaluated:
            self._asked = self.requests.asked()
        self._before_save = time.time()

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if args.output_dir is not None:
            self.requests.watch(args.output_dir)
        self.requests.install()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.requests.uninstall()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        step = state.global_step
        if step % self.requests.poll_every_steps == 0:
            asked = _any_process(self.requests.pending(step), args.device)
            if asked:
                control.should_save = True
        self._mark(control)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._mark(control)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._mark(control)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._mark(control, evaluated=True)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if _several_processes():
            import torch.distributed as dist

            dist.barrier()  # each process writes its own part (its RNG state): the checkpoint is whole once all did
        end = time.time()
        start, self._before_save = self._before_save, None
        asked, self._asked = self._asked, None
        self.requests.answered(asked if asked is not None else self.requests.asked())  # in every process
        if not args.should_save or args.output_dir is None:
            return  # another process wrote it
        path = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if os.path.isdir(path):  # a hyperparameter search saves below a trial's own directory instead
            self.requests.saved(path, end if start is None else start, end, state.global_step)
