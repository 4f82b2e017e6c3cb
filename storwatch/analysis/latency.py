"""Per-mount latency windows for the join: p50, p95, max and mean over the last minute and hour.

Each sample is one collection interval's average latency for one (mountpoint, operation) with the number of
operations behind it, as diskstats, mountstats and probes give them. Samples live in arrays that grow to a fixed
size, so memory is bounded whatever the uptime: at most 3 doubles x ``capacity`` per (mountpoint, operation), only for
those that did I/O, and a short-lived mount holds only the samples it made. Windows of mounts that are gone, or idle
for an hour, are forgotten (``forget``), and at most ``max_mountpoints`` mountpoints are kept.
"""

from __future__ import annotations

import math
import operator
import threading
from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

MINUTE = 60.0
HOUR = 3600.0


class WindowStats(NamedTuple):
    """One window's statistics (a NamedTuple: a scrape makes two per mount and operation)."""

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


class LatencySummary(NamedTuple):
    minute: WindowStats
    hour: WindowStats


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of an ascending list."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


class _Ring:
    """One (mountpoint, operation)'s samples in fixed arrays (the oldest overwritten first), and the hour's latencies
    kept sorted.

    The minute is summarised from the arrays when asked: 60 samples at a 1 s cadence. Sorting the hour's 3,600 on
    every read cost about a millisecond per ring, 0.1 s a scrape on a node with 64 busy NFS mounts. Instead a read
    brings a sorted list of the hour's latencies up to date: it takes in the samples added since the last read (up
    to the read's time) and lets go of those that have left the hour, so each sample is inserted and removed once.
    """

    def __init__(self, capacity: int) -> None:
        # Grown by one sample at a time until full: a pod volume that lives a minute never holds an hour's arrays
        # (86 KB per operation at a 1 s cadence).
        self.t = array("d")
        self.ops = array("d")
        self.secs = array("d")
        self.capacity = capacity
        self.added = 0
        """Samples ever added; sample number n sits at index n % capacity until it is overwritten."""
        self.next = 0
        self.count = 0
        # The hour as of the last read at hour_now: samples numbered [hour_first, hour_end), their latencies sorted
        # and their sums.
        self.hour_first = self.hour_end = 0
        self.hour_latencies = array("d")
        """8 bytes a sample (a list of floats took 32: 115 KB of a full ring's 202)."""
        self.hour_ops = self.hour_secs = 0.0
        self.hour_now = -math.inf

    def add(self, t: float, ops: float, secs: float) -> None:
        n = self.added
        if self.hour_first < self.hour_end and self.hour_first == n - self.capacity:
            self._let_go_of_oldest()  # about to be overwritten while still in the hour (a sub-second cadence)
        i = self.next
        if self.count < self.capacity:  # still growing: i is the arrays' length
            self.t.append(t)
            self.ops.append(ops)
            self.secs.append(secs)
        else:
            self.t[i], self.ops[i], self.secs[i] = t, ops, secs
        self.added = n + 1
        self.next = 0 if i + 1 == self.capacity else i + 1
        if self.count < self.capacity:
            self.count += 1

    def _let_go_of_oldest(self) -> None:
        i = self.hour_first % self.capacity
        ops, secs = self.ops[i], self.secs[i]
        latencies = self.hour_latencies
        del latencies[bisect_left(latencies, secs / ops)]
        self.hour_first += 1
        if self.hour_first == self.hour_end:
            self.hour_ops = self.hour_secs = 0.0  # no drift left behind by the subtractions
        else:
            self.hour_ops -= ops
            self.hour_secs -= secs

    def hour_stats(self, now: float) -> WindowStats:
        if now < self.hour_now:
            return self.stats(now - HOUR, now)  # a View older than the last read: from the arrays
        self.hour_now = now
        oldest = self.added - self.count
        if self.hour_end < oldest:  # never read while those samples were kept: start from what the arrays hold
            self.hour_first = self.hour_end = oldest
        taken: list[float] = []
        t, cap = self.t, self.capacity
        while self.hour_end < self.added and t[self.hour_end % cap] <= now:
            i = self.hour_end % cap
            taken.append(self.secs[i] / self.ops[i])
            self.hour_ops += self.ops[i]
            self.hour_secs += self.secs[i]
            self.hour_end += 1
        latencies = self.hour_latencies
        if len(taken) > 16:  # a first read, or one after a long pause: one sort beats many insertions
            taken += latencies
            taken.sort()
            self.hour_latencies = latencies = array("d", taken)
        else:
            for lat in taken:
                insort(latencies, lat)
        since = now - HOUR
        while self.hour_first < self.hour_end and t[self.hour_first % cap] < since:
            self._let_go_of_oldest()
        if not latencies:
            return EMPTY
        ops = self.hour_ops
        return WindowStats(
            len(latencies),
            ops,
            self.hour_secs / ops,
            _percentile(latencies, 0.5),
            _percentile(latencies, 0.95),
            latencies[-1],
        )

    def summary(self, now: float) -> LatencySummary:
        return LatencySummary(self.stats(now - MINUTE, now), self.hour_stats(now))

    def newest(self) -> float:
        return self.t[(self.next - 1) % self.capacity] if self.count else -math.inf

    def stats(self, since: float, until: float = math.inf) -> WindowStats:
        """The samples with since <= t <= until. Samples are in time order: the ring holds [next, capacity) then
        [0, next) once it has wrapped, each ascending, so bisect finds the edges."""
        t, nxt, cap = self.t, self.next, self.capacity
        ops: list[float] = []
        secs: list[float] = []
        for lo, hi in ((nxt, cap), (0, nxt)) if self.count == cap else ((0, self.count),):
            start, end = bisect_left(t, since, lo, hi), bisect_right(t, until, lo, hi)
            if start < end:
                ops += self.ops[start:end]
                secs += self.secs[start:end]
        if not ops:
            return EMPTY
        lat = sorted(map(operator.truediv, secs, ops))
        total_ops = math.fsum(ops)
        return WindowStats(
            len(lat), total_ops, math.fsum(secs) / total_ops, _percentile(lat, 0.5), _percentile(lat, 0.95), lat[-1]
        )


GONE_MARGIN_SECONDS = 5.0
"""A mountpoint missing from the mount table is gone once its newest sample is this much older than the table: NFS
statistics can name a new mount before the mount source reads the table again, and a read takes a moment."""
MAX_MOUNTPOINTS = 10_000
"""The most mountpoints kept; past it, those whose newest sample is oldest go first."""


class LatencyWindows:
    def __init__(self, capacity: int = 3600, max_mountpoints: int = MAX_MOUNTPOINTS) -> None:
        self.capacity = capacity
        self.max_mountpoints = max_mountpoints
        self._rings: dict[str, dict[str, _Ring]] = {}
        """By mountpoint, then operation."""
        self._lock = threading.Lock()

    def add(self, mountpoint: str, op: str, t: float, ops: float, seconds: float) -> None:
        """One interval ending at ``t``: ``ops`` operations that took ``seconds`` in all. Idle intervals are skipped."""
        self.add_all([(mountpoint, op, t, ops, seconds)])

    def add_all(self, samples: Iterable[tuple[str, str, float, float, float]]) -> None:
        """Several intervals, as ``add`` takes them, under one hold of the lock (a tick brings hundreds)."""
        with self._lock:
            rings_by_mount = self._rings
            for mountpoint, op, t, ops, seconds in samples:
                if ops <= 0 or seconds < 0:
                    continue
                rings = rings_by_mount.get(mountpoint)
                if rings is None:
                    rings = rings_by_mount[mountpoint] = {}
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

    def forget(self, now: float, mounted: Collection[str] | None = None, table_time: float | None = None) -> None:
        """Drop the windows of mountpoints not in ``mounted`` (the mount table as read at ``table_time``) whose
        newest sample is older than that read (by GONE_MARGIN_SECONDS), those idle for an hour, and the stalest
        beyond ``max_mountpoints``."""
        with self._lock:
            self._forget_idle(now)
            rings_by_mount = self._rings
            if mounted is not None and table_time is not None:
                before = table_time - GONE_MARGIN_SECONDS
                for mountpoint in [mp for mp in rings_by_mount if mp not in mounted]:
                    if max(r.newest() for r in rings_by_mount[mountpoint].values()) < before:
                        del rings_by_mount[mountpoint]
            excess = len(rings_by_mount) - self.max_mountpoints
            if excess > 0:
                newest = {mp: max(r.newest() for r in rings.values()) for mp, rings in rings_by_mount.items()}
                for mountpoint in sorted(newest, key=newest.__getitem__)[:excess]:
                    del rings_by_mount[mountpoint]

    def __len__(self) -> int:
        """Mountpoints with windows."""
        return len(self._rings)

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
