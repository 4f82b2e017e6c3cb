"""Per-mount latency windows for the join: p50, p95, max and mean over the last minute and hour.

Each sample is one collection interval's average latency for one (mountpoint, operation) with the number of
operations behind it, as diskstats, mountstats and probes give them. Samples live in fixed-size arrays, so memory is
bounded whatever the uptime: 3 doubles x ``capacity`` per (mountpoint, operation), and only for those that did I/O.
"""

from __future__ import annotations

import math
import operator
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

MINUTE = 60.0
HOUR = 3600.0
HOUR_REFRESH = 15.0


@dataclass(frozen=True)
class WindowStats:
    samples: int
    """Intervals in the window that had at least one operation."""
    ops: float
    mean_seconds: float | None
    """Total time / total operations: the latency an average operation saw."""
    p50_seconds: float | None
    """Median of the per-interval averages."""
    p95_seconds: float | None
    max_seconds: float | None


EMPTY = WindowStats(0, 0.0, None, None, None, None)


@dataclass(frozen=True)
class LatencySummary:
    minute: WindowStats
    hour: WindowStats


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of an ascending list."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


class _Ring:
    def __init__(self, capacity: int) -> None:
        self.t = array("d", bytes(8 * capacity))
        self.ops = array("d", bytes(8 * capacity))
        self.secs = array("d", bytes(8 * capacity))
        self.capacity = capacity
        self.next = 0
        self.count = 0
        self.hour_cache: tuple[float, WindowStats] | None = None

    def add(self, t: float, ops: float, secs: float) -> None:
        cached = self.hour_cache
        if cached is not None and (cached[1].max_seconds is None or secs / ops > cached[1].max_seconds):
            # A new maximum (or the first sample) must show in the hour at once, not up to HOUR_REFRESH later.
            self.hour_cache = None
        i = self.next
        self.t[i], self.ops[i], self.secs[i] = t, ops, secs
        self.next = (i + 1) % self.capacity
        self.count = min(self.count + 1, self.capacity)

    def hour_stats(self, now: float) -> WindowStats:
        # An hour of samples takes about a millisecond to summarise; the hour moves slowly, so reuse it for a while.
        cached = self.hour_cache
        if cached is None or now - cached[0] >= HOUR_REFRESH or now < cached[0]:
            cached = self.hour_cache = (now, self.stats(now - HOUR, now))
        return cached[1]

    def summary(self, now: float) -> LatencySummary:
        return LatencySummary(self.stats(now - MINUTE, now), self.hour_stats(now))

    def newest(self) -> float:
        return self.t[(self.next - 1) % self.capacity] if self.count else -math.inf

    def _segments(self, since: float, until: float) -> Iterator[tuple[int, int]]:
        """Index ranges of the samples with since <= t <= until, oldest first. Samples are in time order: the ring
        holds [next, capacity) then [0, next) once it has wrapped, each ascending, so bisect finds the edges."""
        t, nxt = self.t, self.next
        parts = ((nxt, self.capacity), (0, nxt)) if self.count == self.capacity else ((0, self.count),)
        for lo, hi in parts:
            start, end = bisect_left(t, since, lo, hi), bisect_right(t, until, lo, hi)
            if start < end:
                yield start, end

    def stats(self, since: float, until: float = math.inf) -> WindowStats:
        ops: list[float] = []
        secs: list[float] = []
        for start, end in self._segments(since, until):
            ops.extend(self.ops[start:end])
            secs.extend(self.secs[start:end])
        if not ops:
            return EMPTY
        lat = sorted(map(operator.truediv, secs, ops))
        total_ops = math.fsum(ops)
        return WindowStats(
            len(lat), total_ops, math.fsum(secs) / total_ops, _percentile(lat, 0.5), _percentile(lat, 0.95), lat[-1]
        )


class LatencyWindows:
    def __init__(self, capacity: int = 3600) -> None:
        self.capacity = capacity
        self._rings: dict[str, dict[str, _Ring]] = {}
        """By mountpoint, then operation."""
        self._lock = threading.Lock()

    def add(self, mountpoint: str, op: str, t: float, ops: float, seconds: float) -> None:
        """One interval ending at ``t``: ``ops`` operations that took ``seconds`` in all. Idle intervals are skipped."""
        if ops <= 0 or seconds < 0:
            return
        with self._lock:
            rings = self._rings.get(mountpoint)
            if rings is None:
                rings = self._rings[mountpoint] = {}
            ring = rings.get(op)
            if ring is None:
                ring = rings[op] = _Ring(self.capacity)
            ring.add(t, ops, seconds)

    def summary(self, mountpoint: str, op: str, now: float) -> LatencySummary:
        with self._lock:
            ring = self._rings.get(mountpoint, {}).get(op)
            if ring is None:
                return LatencySummary(EMPTY, EMPTY)
            return ring.summary(now)

    def summaries_for(self, mountpoint: str, now: float) -> dict[str, LatencySummary]:
        with self._lock:
            return {op: ring.summary(now) for op, ring in self._rings.get(mountpoint, {}).items()}

    def forget_idle(self, now: float) -> None:
        """Drop the windows of mounts that did no I/O for an hour (unmounted, or idle)."""
        with self._lock:
            self._forget_idle(now)

    def _forget_idle(self, now: float) -> None:
        for mountpoint, rings in list(self._rings.items()):
            for op in [op for op, r in rings.items() if r.newest() < now - HOUR]:
                del rings[op]
            if not rings:
                del self._rings[mountpoint]

    def summaries(self, now: float) -> dict[str, dict[str, LatencySummary]]:
        """Every mountpoint's windows by operation; forgets those idle for more than an hour."""
        with self._lock:
            self._forget_idle(now)
            return {mp: {op: ring.summary(now) for op, ring in rings.items()} for mp, rings in self._rings.items()}


class MountLatency(Mapping[str, LatencySummary]):
    """One mount's windows by operation as of ``now``, summarised when first read. A View is built every tick and
    most are never read (a scrape every 15 s reads one in fifteen), so a mount's summaries cost nothing until asked."""

    def __init__(self, windows: LatencyWindows, mountpoint: str, now: float) -> None:
        self._windows, self._mountpoint, self._now = windows, mountpoint, now
        self._summaries: dict[str, LatencySummary] | None = None

    def _get(self) -> dict[str, LatencySummary]:
        summaries = self._summaries
        if summaries is None:
            summaries = self._summaries = self._windows.summaries_for(self._mountpoint, self._now)
        return summaries

    def __getitem__(self, op: str) -> LatencySummary:
        return self._get()[op]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return f"MountLatency({self._get()!r})"
