"""Sources: read-only observers of the host. Each returns typed facts and knows nothing of Prometheus or policy."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from storwatch.paths import HostPaths
from storwatch.procfs import LineError

F = TypeVar("F")
F_co = TypeVar("F_co", covariant=True)


@dataclass(frozen=True, eq=False)
class FactsKey(Generic[F]):
    """Names one source's facts in a Snapshot, with their type: ``snapshot.get(DISKIO)`` is a ``DiskIO | None``.

    Declared once, beside the source and its facts type; the registry (storwatch/registry.py) puts the facts of the
    source it declares under it. Compared by identity: two keys of one name would be a bug the registry refuses."""

    name: str
    """The facts' name in a Snapshot (``snapshot.facts``); for the core sources also a Snapshot attribute."""
    for_history: Callable[[F], F] | None = None
    """What History keeps of these facts, when not all of them (the newest snapshot alone needs the full tables)."""


class Source(Protocol[F_co]):
    """What the agent runs on its own worker, every ``interval_seconds``.

    ``collect()`` raising: the collection failed (``storwatch_collector_success`` 0, the exception as the error); the
    facts of the last good collection are kept. Facts with a ``failure`` that is not None (a stuck NVML call): it
    answered, but failed; the facts are kept. What else a source may offer is declared below, each on its own
    (``Configurable``, ``MayBeOff``, ``KeepsPace``, ``CountsParseErrors``), and the agent asks for it by that
    declaration: by its attribute's name after each collection (storwatch/agent/collectors.py), which is cheaper than a
    runtime Protocol check.
    """

    name: str
    """The collector name in ``storwatch_collector_*{collector=...}``."""

    @property
    def interval_seconds(self) -> float:
        """Seconds from one collection's end to the next's start, asked after each collection (a source may pace
        itself by what it saw)."""

    def collect(self) -> F_co:
        """Return this source's facts, or raise to mark the collection failed."""

    def close(self) -> None:
        """Release what the source holds (helper processes, library handles)."""


@runtime_checkable
class Configurable(Protocol):
    """A source that takes its (reloaded) configuration section."""

    def configure(self, section: Any) -> None: ...


@runtime_checkable
class MayBeOff(Protocol):
    """A source that may have nothing to do on this node (no cluster to watch, nothing chosen to probe): while
    ``off_reason`` is a str it is reported off (``storwatch_collector_enabled`` 0), never as a success or a
    failure."""

    @property
    def off_reason(self) -> str | None: ...


@runtime_checkable
class KeepsPace(Protocol):
    """A source whose interval no CPU budget stretches while ``keeps_pace`` is True: the access source while a save's
    file is open, whose end, and the sync its writer may open at once after it, last well under a second."""

    @property
    def keeps_pace(self) -> bool: ...


@runtime_checkable
class CountsParseErrors(Protocol):
    """A source that counts the lines of its input it could not parse (``storwatch_parse_errors_total``)."""

    @property
    def parse_errors(self) -> int: ...


class Context(Protocol):
    """What a source's factory may use besides its configuration section (the registry's SourceContext is one):
    where the host's files are, the clock, and another source's newest facts. A source added by the recipe in
    docs/architecture.md writes its factory against this, beside the source."""

    @property
    def paths(self) -> HostPaths: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def latest(self) -> Callable[[FactsKey[Any]], Any]:
        """Another source's newest facts (None before it reports)."""
        ...


class OnceLog:
    """Logs each distinct problem once (a malformed line is seen again on every read), bounded in memory."""

    def __init__(self, logger: logging.Logger, limit: int = 1000) -> None:
        self.logger = logger
        self.limit = limit
        self._seen: set[str] = set()

    def warning(self, key: str, message: str, *args: object) -> None:
        if key in self._seen or len(self._seen) >= self.limit:
            return
        self._seen.add(key)
        self.logger.warning(message, *args)


def read_bounded(path: str, limit: int) -> bytes:
    """At most ``limit`` bytes of a file, never following a symlink at its end nor waiting on a FIFO (kernel files: a
    process's, a filesystem client's counters). Read to its end, not in one read: a kernel file of many records
    (``/proc/PID/mountinfo``) gives at most a page of them to each read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        chunks: list[bytes] = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_first(paths: Sequence[str], what: str) -> bytes:
    """The contents of the first readable file of ``paths``; an OSError naming them all when none is."""
    return read_first_named(paths, what)[1]


def read_first_named(paths: Sequence[str], what: str) -> tuple[str, bytes]:
    """The first readable file of ``paths`` and its contents; an OSError naming them all when none is."""
    errors = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                return path, f.read()
        except OSError as err:
            errors.append(f"{path}: {err.strerror}")
    raise OSError(f"cannot read {what}: " + "; ".join(errors))


class UnusableInput(OSError):
    """A source's input was read but gave it nothing to report: the file is empty, or none of its lines parsed.
    Raised from ``collect()``, so the collector reports failure with this message (``storwatch_collector_success``
    0) rather than success with no data. An OSError, so a caller that handles an unreadable file (``scan``) handles
    an unusable one the same way."""


_SHOWN_ERROR_CHARS = 300
"""How much of the first bad line's error an UnusableInput message quotes (a garbled line can be kilobytes)."""


def require_parsed(path: str, what: str, parsed: int, errors: Sequence[LineError]) -> None:
    """Raise UnusableInput unless at least one of the ``what`` records of ``path`` parsed."""
    if parsed:
        return
    if not errors:
        raise UnusableInput(f"{path}: empty: no {what} in it")
    first = str(errors[0])
    if len(first) > _SHOWN_ERROR_CHARS:
        first = first[:_SHOWN_ERROR_CHARS] + "..."
    raise UnusableInput(f"{path}: no {what} could be parsed, {len(errors)} malformed; the first: {first}")
