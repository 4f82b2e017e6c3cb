"""Per-mount latency windows for the join: p50, p95, max and mean over the last minute and hour.

Each sample is one collection interval's average latency for one (mountpoint, operation) with the number of
operations behind it, as diskstats, mountstats and probes give them. Samples live in fixed-size arrays, so memory is
bounded whatever the uptime: 3 doubles x ``capacity`` per (mountpoint, operation), and only for those that did I/O.
"""

from __future__ import annotations

import math
import threading
from array import array
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
            cached = self.hour_cache = (now, self.stats(now - HOUR))
        return cached[1]

    def newest(self) -> float:
        return self.t[(self.next - 1) % self.capacity] if self.count else -math.inf

    def stats(self, since: float) -> WindowStats:
        lat: list[float] = []
        total_ops = total_secs = 0.0
        for k in range(self.count):
            i = (self.next - 1 - k) % self.capacity
            if self.t[i] < since:
                break  # samples are in time order: the rest are older
            total_ops += self.ops[i]
            total_secs += self.secs[i]
            lat.append(self.secs[i] / self.ops[i])
        if not lat:
            return EMPTY
        lat.sort()
        return WindowStats(
            len(lat), total_ops, total_secs / total_ops, _percentile(lat, 0.5), _percentile(lat, 0.95), lat[-1]
        )


class LatencyWindows:
    def __init__(self, capacity: int = 3600) -> None:
        self.capacity = capacity
        self._rings: dict[tuple[str, str], _Ring] = {}
        self._lock = threading.Lock()

    def add(self, mountpoint: str, op: str, t: float, ops: float, seconds: float) -> None:
        """One interval ending at ``t``: ``ops`` operations that took ``seconds`` in all. Idle intervals are skipped."""
        if ops <= 0 or seconds < 0:
            return
        with self._lock:
            ring = self._rings.get((mountpoint, op))
            if ring is None:
                ring = self._rings[(mountpoint, op)] = _Ring(self.capacity)
            ring.add(t, ops, seconds)

    def summary(self, mountpoint: str, op: str, now: float) -> LatencySummary:
        with self._lock:
            ring = self._rings.get((mountpoint, op))
            if ring is None:
                return LatencySummary(EMPTY, EMPTY)
            return LatencySummary(ring.stats(now - MINUTE), ring.hour_stats(now))

    def summaries_for(self, mountpoint: str, now: float) -> dict[str, LatencySummary]:
        with self._lock:
            return {
                op: LatencySummary(ring.stats(now - MINUTE), ring.hour_stats(now))
                for (mp, op), ring in self._rings.items()
                if mp == mountpoint
            }

    def forget_idle(self, now: float) -> None:
        """Drop the windows of mounts that did no I/O for an hour (unmounted, or idle)."""
        with self._lock:
            for key in [k for k, r in self._rings.items() if r.newest() < now - HOUR]:
                del self._rings[key]

    def summaries(self, now: float) -> dict[str, dict[str, LatencySummary]]:
        """Every mountpoint's windows by operation; forgets those idle for more than an hour."""
        out: dict[str, dict[str, LatencySummary]] = {}
        with self._lock:
            for key in [k for k, r in self._rings.items() if r.newest() < now - HOUR]:
                del self._rings[key]
            for (mountpoint, op), ring in self._rings.items():
                out.setdefault(mountpoint, {})[op] = LatencySummary(ring.stats(now - MINUTE), ring.hour_stats(now))
        return out
