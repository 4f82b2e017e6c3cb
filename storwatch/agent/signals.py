"""Signals as the agent's main thread sees them: the handlers only note a signal; the main thread acts on it.

SIGTERM/SIGINT stop the agent (within a few seconds whatever the mounts or another thread do: the main thread that acts
on them waits on nothing that could hang, and stop() has a deadline); SIGHUP reloads the configuration file, on a
thread of its own.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
from types import FrameType


class SignalInbox:
    """SIGTERM, SIGINT and SIGHUP as the main thread sees them: each handler only notes its signal in a flag, and
    ``signal.set_wakeup_fd`` wakes the thread waiting in ``wait``; logging, stopping and reloading happen there.

    A handler runs in the main thread between two bytecodes, wherever that thread is: one that logged or set a
    threading.Event could run while the main thread held that very lock (inside Event.wait) and wait on it forever,
    which two signals close together did. Installed when made, from the main thread; ``close`` puts back what was
    there before (or SIG_IGN after ``ignore_all``)."""

    def __init__(self) -> None:
        self.stop_signal = 0
        """The last SIGTERM or SIGINT received, 0 for none."""
        self.hup = False
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._old_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._old = {sig: signal.signal(sig, self._note) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self.hup = True
        else:
            self.stop_signal = signum

    def wait(self, timeout: float) -> None:
        """Until a signal arrives or ``timeout`` passes. A signal that another thread took has its handler run in the
        main thread at a bytecode boundary soon after the wake-up, so the caller sees its flag now or, at worst,
        after the next wait."""
        with contextlib.suppress(InterruptedError):
            select.select([self._reader], [], [], timeout)
        with contextlib.suppress(OSError):
            while self._reader.recv(64):
                pass

    def ignore_all(self) -> None:
        """From now on the three signals are ignored (a process about to exit); ``close`` leaves them so."""
        for sig in self._old:
            signal.signal(sig, signal.SIG_IGN)
        self._old = dict.fromkeys(self._old, signal.SIG_IGN)

    def close(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._old_fd)
        self._reader.close()
        self._writer.close()
