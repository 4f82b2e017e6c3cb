"""One daemon thread that runs one job at a time, each waited for no longer than its deadline.

For calls into a library that may never return (a C call stuck in a driver) whose state lives in this process, so
they cannot go to a helper process: NVML's handles are valid only in the process that initialised it. A job still
running past its deadline strands the thread; the caller goes on, and no other job starts until that one returns,
so there is never more than this one thread, whatever the library does. A thread stuck in a C call cannot be
killed (Python cannot interrupt it, and a thread blocked in a driver's ioctl ignores signals); it is a daemon, so it
never keeps the process from exiting.

Calls that can hang in the kernel on a mount (statvfs, probes, checkpoint walks) do not come here: they go to
``storwatch.calls.blocking``, whose helper process holds the stuck threads, one call per mount in flight.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from storwatch.threadname import name_this_thread

T = TypeVar("T")

Outcome = tuple[Any, Exception | None]
"""A finished job: (its return value, None), or (None, the exception it raised)."""


class DeadlineWorker:
    """Runs jobs on one daemon thread, started on the first job (and again if it ever ended)."""

    def __init__(self, name: str) -> None:
        self.name = name
        """The thread's name (seen in a stack dump of a hung process)."""
        self._cond = threading.Condition()
        self._job: Callable[[], Any] | None = None
        self._busy = False
        self._outcome: Outcome | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    def run(
        self, job: Callable[[], T], timeout: float, wait_idle: bool = False
    ) -> tuple[T | None, Exception | None] | None:
        """Run ``job`` and wait at most ``timeout`` seconds: its (value, None) or (None, exception), or None when it
        has not returned, or when an earlier job has not (then ``job`` is not started; with ``wait_idle``, only
        after waiting for that one within the same ``timeout``). After :meth:`stop`, None at once."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while wait_idle and self._busy and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._busy or self._stopping:
                return None
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            self._job, self._busy, self._outcome = job, True, None
            self._cond.notify_all()
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self._outcome

    @property
    def busy(self) -> bool:
        """A job is running (within its deadline or past it)."""
        with self._cond:
            return self._busy

    def stop(self) -> None:
        """Start no more jobs; the thread ends once idle (a stuck job strands it until the job returns)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def _loop(self) -> None:
        name_this_thread()
        while True:
            with self._cond:
                while self._job is None and not self._stopping:
                    self._cond.wait()
                if self._job is None:
                    return
                job, self._job = self._job, None
            try:
                outcome: Outcome = (job(), None)
            except Exception as err:
                outcome = (None, err)
            with self._cond:
                self._outcome, self._busy = outcome, False
                self._cond.notify_all()


__all__ = ["DeadlineWorker", "Outcome"]
