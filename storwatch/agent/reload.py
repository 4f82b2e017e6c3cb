"""Reading a new configuration for a reload: loaded, checked and resolved before anything is applied, with the fields
that wait for a restart kept as they are. Whatever goes wrong is a ``ReloadError`` naming the file (and the line and
field where there is one); the agent then keeps its last good configuration. Reloads asked for by SIGHUP run on a
thread of their own (``Reloader``), never on the main thread, which must stay free to act on SIGTERM."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from storwatch.classify import resolve_platform
from storwatch.config import Config, ConfigError
from storwatch.registry import load_config
from storwatch.threadname import name_this_thread
from storwatch.vocabulary import Platform

log = logging.getLogger(__name__)

RESTART_ONLY = ("listen", "tls", "paths")
"""Fields a reload leaves as they are (docs/agent.md lists them, under "Signals and reloading")."""


class ReloadError(Exception):
    """The new configuration cannot be read or checked (the message is ``FILE:LINE: FIELD: message`` or
    ``FILE: message``)."""


def read_new(path: str, flags: Callable[[Config], Config], current: Config) -> tuple[Config, Platform]:
    """The configuration in ``path`` (with the command line's flags laid over it), checked, with the restart-only
    fields of ``current``; and the platform it resolves to."""
    try:
        new = flags(load_config(path))
        new.validate(path)
        platform = resolve_platform(new.platform, new.host_paths())
    except ConfigError as err:
        raise ReloadError(str(err)) from err
    except Exception as err:  # a bug in reading a file must not take a running agent down
        log.debug("reload: reading %s", path, exc_info=True)
        raise ReloadError(f"{path}: cannot load: {type(err).__name__}: {err}") from err
    for name in RESTART_ONLY:
        if getattr(new, name) != getattr(current, name):
            log.warning("reload: %s changed; it takes effect on restart", name)
            new = dataclasses.replace(new, **{name: getattr(current, name)})
    return new, platform


class Reloader:
    """Runs the reloads SIGHUP asks for, one at a time, on a daemon thread of its own (started by the first ask).

    A reload can block: switching the GPU source off waits out a stuck NVML call, up to ``gpu.call_timeout_seconds``.
    On the main thread that held SIGTERM back until the reload ended; here it holds only this thread, which stop()
    leaves behind. Asks that come while a reload runs make one more reload after it, not one each: the file is read
    again then, so the last edit is what applies."""

    def __init__(self, reload: Callable[[], object]) -> None:
        self._reload = reload
        self._asked = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._running_since: float | None = None
        """time.monotonic() when the reload in progress began; None between reloads."""

    def ask(self) -> None:
        """Ask for a reload: now, or after the one in progress."""
        self._asked.set()
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="reload", daemon=True)
            self._thread.start()

    def running_for(self) -> float | None:
        """How long the reload in progress has been running; None between reloads."""
        since = self._running_since
        return None if since is None else time.monotonic() - since

    def close(self) -> None:
        """No reload after the one in progress (which is not waited for)."""
        self._closed = True
        self._asked.set()

    def _run(self) -> None:
        name_this_thread()
        while True:
            self._asked.wait()
            if self._closed:
                return
            self._asked.clear()
            self._running_since = time.monotonic()
            try:
                self._reload()
            except Exception:  # reload() reports its own failures; a bug of its own must not end this thread
                log.exception("reload failed")
            finally:
                self._running_since = None
