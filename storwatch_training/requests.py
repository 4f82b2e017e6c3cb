"""The agent's checkpoint requests as a training process reads them: the request file the agent places in a run's
directory, and the signal it sends to the run's writer.

Request file (the contract with the agent): when a policy rule asks for an emergency checkpoint (a node drain is
coming, the newest checkpoint is only on node-local storage), the agent creates or touches
``<run_dir>/.storwatch-checkpoint-request``. The training loop polls :func:`checkpoint_requested` cheaply (one stat,
every N steps); it is True while the request file is newer than the start of the last save recorded in that run
directory's event log (:func:`storwatch_training.saves.atomic_save`, or a framework save a callback recorded), so
the next save answers it. :func:`acknowledge_request` removes the file when the loop answers it another way. The
request file's content is free text for people (why the agent asked); only its mtime counts.

Signal: a rule with ``signal: true`` also sends the run's writer processes SIGUSR1 (or the signal the rule names),
and only a process that catches it (``SigCgt`` in ``/proc/PID/status``): the default action of SIGUSR1 ends a
process. :class:`CheckpointRequests` installs a handler that only counts the signal (then calls the handler it
replaced, when that was a Python function), and the next step boundary reads the count as a request.

:class:`CheckpointRequests` is what the framework callbacks share (``storwatch_training.transformers``,
``.lightning``, ``.accelerate``); a hand-written loop can use it the same way::

    requests = CheckpointRequests()
    requests.watch(run_dir)
    requests.install()
    for step, batch in enumerate(loader):
        ...
        if requests.pending(step):
            requests.answering()
            start = time.time()
            path = save(model, run_dir, step)  # any save into run_dir, a file or a directory
            requests.saved(path, start, time.time(), step)
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

from storwatch_training import saves
from storwatch_training.saves import SaveEvent, last_save_start, record_save

REQUEST_NAME = ".storwatch-checkpoint-request"
RUN_DIR_ENV = "STORWATCH_RUN_DIR"
DEFAULT_SIGNALS = (signal.SIGUSR1,)
"""What the callbacks catch unless told otherwise: the agent's default ``signal_name``."""

log = logging.getLogger(__name__)

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None
_RequestKey = tuple[int, int, int]
"""A request file as seen: its device, inode and mtime in nanoseconds (a renewal changes the mtime)."""


def _resolve_run_dir(run_dir: str | None) -> str | None:
    return run_dir or saves._last_run_dir or os.environ.get(RUN_DIR_ENV) or None


def checkpoint_requested(run_dir: str | None = None, *, event_log: str | None = None) -> bool:
    """Whether the agent asked for a checkpoint that no save has answered yet (see the module docstring).

    ``run_dir`` defaults to the directory of this process's last :func:`~storwatch_training.saves.atomic_save`, then
    ``$STORWATCH_RUN_DIR``.
    """
    directory = _resolve_run_dir(run_dir)
    if directory is None:
        return False
    try:
        requested = os.stat(os.path.join(directory, REQUEST_NAME)).st_mtime
    except OSError:
        return False
    started = last_save_start(directory, event_log)
    return started is None or requested > started


def acknowledge_request(run_dir: str | None = None) -> None:
    """Remove the request file: the loop has answered the request (or decided not to)."""
    directory = _resolve_run_dir(run_dir)
    if directory is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, REQUEST_NAME))


def _request_key(run_dir: str) -> _RequestKey | None:
    try:
        st = os.stat(os.path.join(run_dir, REQUEST_NAME))
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


@dataclass(frozen=True)
class Asked:
    """What had asked at one moment (:meth:`CheckpointRequests.asked`)."""

    signals: int
    """Signals caught by then."""
    requests: Mapping[str, _RequestKey]
    """Run directory -> the request file there then."""


class CheckpointRequests:
    """The agent's requests to this process, read at its step boundaries: a request file in a watched run directory
    that no save has answered, or a signal caught since the last save began.

    A save answers every request that was there when it began (:meth:`answering`), whichever directory it writes:
    the answer is the process's state, saved. Which requests a save answered is remembered by the request file's
    identity (device, inode, mtime), never by comparing this process's clock with the file's mtime (a shared
    filesystem's server keeps its own clock): a request renewed after the save began asks again. The writer that
    recorded the save removes each answered request (:meth:`saved`) unless it was renewed meanwhile.

    Nothing here raises into the training loop: a request that cannot be read is no request, and a save that cannot
    be recorded is logged (``storwatch_training.requests``) and skipped."""

    def __init__(self, signals: Iterable[int] = DEFAULT_SIGNALS, poll_every_steps: int = 1) -> None:
        """``signals``: those a handler is installed for (none: the request file alone); ``poll_every_steps``: the
        request files and the signal count are read at every step divisible by it (each read is one ``stat`` per
        run directory, and in a job of several processes one small collective: raise it when steps are very
        short)."""
        if poll_every_steps < 1:
            raise ValueError(f"poll_every_steps must be 1 or more, not {poll_every_steps}")
        self.signals = tuple(signal.Signals(s) for s in signals)
        self.poll_every_steps = poll_every_steps
        self._lock = threading.Lock()  # never taken by the signal handler
        self._run_dirs: dict[str, None] = {}
        self._caught = 0
        """Signals caught: written by the handler only."""
        self._answered_signals = 0
        self._answered: dict[str, _RequestKey] = {}
        """Run directory -> the request file a save began after (answered)."""
        self._previous: dict[signal.Signals, _Handler] = {}

    @property
    def run_dirs(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._run_dirs)

    def watch(self, run_dir: str | os.PathLike[str]) -> None:
        """Read requests in ``run_dir`` too (the framework's own output directory)."""
        path = os.path.abspath(os.fspath(run_dir))
        with self._lock:
            self._run_dirs.setdefault(path, None)

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def install(self) -> bool:
        """Catch ``signals`` with a handler that only counts them (then calls the handler it replaced, when that was
        a Python function). Only the main thread may install handlers: elsewhere, nothing is installed, the request
        file alone asks, and False is returned."""
        if self._previous:
            return True
        if threading.current_thread() is not threading.main_thread():
            log.warning("storwatch: not in the main thread, so no signal handler: the request file alone asks")
            return False
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._catch)
        return True

    def uninstall(self) -> None:
        """Put back the handlers that ``install`` replaced (where ours is still the one installed)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._catch:
                signal.signal(sig, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()

    def _catch(self, signum: int, frame: FrameType | None) -> None:
        self._caught += 1
        previous = self._previous.get(signal.Signals(signum))
        if callable(previous):
            previous(signum, frame)

    def pending(self, step: int | None = None) -> bool:
        """At a step boundary (every ``poll_every_steps``-th ``step``): whether the agent asked for a checkpoint that
        no save has answered."""
        if step is not None and step % self.poll_every_steps:
            return False
        if self._caught > self._answered_signals:
            return True
        return any(self._asked_in(d) for d in self.run_dirs)

    def _asked_in(self, run_dir: str) -> bool:
        key = _request_key(run_dir)
        with self._lock:
            if key is None or self._answered.get(run_dir) == key:
                return False
        started = last_save_start(run_dir)  # a save recorded before this process began may have answered it
        return started is None or key[2] / 1e9 > started

    def answering(self) -> None:
        """A save begins (in any process of the job): it answers every signal caught and every request there now."""
        self.answered(self.asked())

    def asked(self) -> Asked:
        """What has asked so far: the signals caught, and the request files there now (:meth:`answered` takes it
        once a save that began after this look has been made)."""
        caught = self._caught
        return Asked(caught, {d: key for d in self.run_dirs if (key := _request_key(d)) is not None})

    def answered(self, asked: Asked) -> None:
        """A save began after ``asked`` was taken: everything in it is answered."""
        with self._lock:
            self._answered_signals = max(self._answered_signals, asked.signals)
            self._answered.update(asked.requests)

    def saved(self, path: str, start: float, end: float, step: int | None) -> SaveEvent | None:
        """The process that wrote a save records it (:func:`~storwatch_training.saves.record_save`) and removes the
        requests it answered; None when it could not be recorded (logged)."""
        try:
            event = record_save(path, start, end, step)
        except OSError as err:
            log.warning("storwatch: the save %s was not recorded in its event log: %s", path, err)
            return None
        self.watch(os.path.dirname(event.path))
        with self._lock:
            answered = dict(self._answered)
        for run_dir, key in answered.items():
            # Only the request the save answered: one renewed since (its mtime changed) asks again. The agent could
            # renew it between this look and the unlink; its renewals come seconds apart at the least.
            if _request_key(run_dir) == key:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(run_dir, REQUEST_NAME))
        return event
