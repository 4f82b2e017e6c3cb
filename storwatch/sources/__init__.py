"""Sources: read-only observers of the host. Each returns typed facts and knows nothing of Prometheus or policy."""

from __future__ import annotations

from typing import Any, Protocol


class Source(Protocol):
    name: str
    """The collector name in ``storwatch_collector_*{collector=...}``."""
    interval_seconds: float

    def collect(self) -> Any:
        """Return this source's facts, or raise to mark the collection failed."""

    def close(self) -> None:
        """Release what the source holds (helper processes, library handles)."""
