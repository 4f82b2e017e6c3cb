"""Sources: read-only observers of the host. Each returns typed facts and knows nothing of Prometheus or policy."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol


class Source(Protocol):
    name: str
    """The collector name in ``storwatch_collector_*{collector=...}``."""
    interval_seconds: float

    def collect(self) -> Any:
        """Return this source's facts, or raise to mark the collection failed."""

    def close(self) -> None:
        """Release what the source holds (helper processes, library handles)."""


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


def read_first(paths: Sequence[str], what: str) -> bytes:
    """The contents of the first readable file of ``paths``; an OSError naming them all when none is."""
    errors = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as err:
            errors.append(f"{path}: {err.strerror}")
    raise OSError(f"cannot read {what}: " + "; ".join(errors))
