"""Per-mount latency windows for the join: p50, p95, max and mean over the last minute and hour.

Each sample is one collection interval's average latency for one (mountpoint, operation) with the number of
operations behind it, as diskstats, mountstats and probes give them. The minute is of the samples themselves; the hour
is of the samples merged per GRAIN_SECONDS (its samples, operations, mean and max exact, its p50 and p95 of the
grains' averages: ``_Hour``). Both live in arrays that grow to a fixed size, so memory is bounded whatever the uptime
and the cadence: at most 3 doubles x ``capacity`` and 6 x HOUR_GRAINS per (mountpoint, operation), about 15 KB, only
for those that did I/O, and a short-lived mount holds only what it made. Windows of mounts that are gone, or idle for
an hour, are forgotten (``forget``), and at most ``max_mountpoints`` mountpoints are kept.
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
MINUTE_CAPACITY = 128
"""Samples a window keeps one by one: a minute's at a cadence of half a second."""
GRAIN_SECONDS = 15.0
"""The hour's grain: its p50 and p95 are of the average latencies over intervals this long (the scrape interval of
the Prometheus configuration storwatch ships)."""
HOUR_GRAINS = int(HOUR / GRAIN_SECONDS) + 2
"""Closed grains a window keeps: an hour's, and the one cut by the hour's far edge."""


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
    """One (mountpoint, operation)'s newest samples in fixed arrays (the oldest overwritten first): the minute is
    summarised from them when asked, 60 samples at a 1 s cadence."""

    def __init__(self, capacity: int) -> None:
        # Grown by one sample at a time until full: a pod volume that lives a few seconds holds only its own.
        self.t = array("d")
        self.ops = array("d")
        self.secs = array("d")
        self.capacity = capacity
        self.next = 0
        self.count = 0

    def add(self, t: float, ops: float, secs: float) -> None:
        i = self.next
        if self.count < self.capacity:  # still growing: i is the arrays' length
            self.t.append(t)
            self.ops.append(ops)
            self.secs.append(secs)
            self.count += 1
        else:
            self.t[i], self.ops[i], self.secs[i] = t, ops, secs
        self.next = 0 if i + 1 == self.capacity else i + 1

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


def _percentile_with(sorted_values: Sequence[float], extra: float | None, q: float) -> float:
    """Nearest-rank percentile of ``sorted_values`` with ``extra`` (when not None) among them, without inserting it."""
    if extra is None:
        return _percentile(sorted_values, q)
    k = max(1, math.ceil(q * (len(sorted_values) + 1))) - 1
    at = bisect_left(sorted_values, extra)
    if k < at:
        return sorted_values[k]
    return extra if k == at else sorted_values[k - 1]


class _Hour:
    """One (mountpoint, operation)'s hour at a grain of GRAIN_SECONDS. The samples of each grain (aligned to the
    clock) are merged as they come: their operations and seconds summed, their count and their largest latency kept.
    The hour's samples, operations, mean and max are so exactly those of its samples; its p50 and p95 are of the
    grains' average latencies, as ``quantile_over_time`` over a scrape every GRAIN_SECONDS would give them.

    A grain is 40 bytes in fixed arrays whatever the cadence, 9.7 KB an hour (the hour's samples kept one by one took
    115 KB at a 1 s cadence, and 8 bytes more each once sorted: 35 to 44 MB on a node with 384 busy windows). A read
    brings a sorted array of the hour's closed grains' latencies up to date, each grain inserted and let go once, and
    takes the open grain in without storing it.
    """

    def __init__(self) -> None:
        self.t = array("d")
        """Each closed grain's newest sample time."""
        self.ops = array("d")
        self.secs = array("d")
        self.n = array("d")
        """Samples merged into each closed grain."""
        self.most = array("d")
        """Each closed grain's largest sample latency."""
        self.capacity = HOUR_GRAINS
        self.added = 0
        """Grains ever closed; grain number g sits at index g % capacity until it is overwritten."""
        self.next = 0
        self.count = 0
        # The hour as of the last read at read_at: closed grains numbered [first, end), their latencies sorted, and
        # their sums.
        self.first = self.end = 0
        self.latencies = array("d")
        self.ops_sum = self.secs_sum = 0.0
        self.read_at = -math.inf
        # The open grain: the one the newest sample fell in.
        self.grain: float | None = None
        self.open_t = self.open_ops = self.open_secs = self.open_n = self.open_most = 0.0

    def add(self, t: float, ops: float, secs: float) -> None:
        grain = t // GRAIN_SECONDS
        latency = secs / ops
        if grain == self.grain:
            self.open_t = t
            self.open_ops += ops
            self.open_secs += secs
            self.open_n += 1
            if latency > self.open_most:
                self.open_most = latency
            return
        if self.open_n:
            self._close()
        self.grain = grain
        self.open_t, self.open_ops, self.open_secs, self.open_n, self.open_most = t, ops, secs, 1.0, latency

    def _close(self) -> None:
        g = self.added
        if self.first < self.end and self.first == g - self.capacity:
            self._let_go_of_oldest()  # about to be overwritten while still in the hour (the clock stepped)
        i = self.next
        values = (self.open_t, self.open_ops, self.open_secs, self.open_n, self.open_most)
        if self.count < self.capacity:
            for column, value in zip((self.t, self.ops, self.secs, self.n, self.most), values, strict=True):
                column.append(value)
            self.count += 1
        else:
            self.t[i], self.ops[i], self.secs[i], self.n[i], self.most[i] = values
        self.added = g + 1
        self.next = 0 if i + 1 == self.capacity else i + 1

    def _let_go_of_oldest(self) -> None:
        i = self.first % self.capacity
        ops, secs = self.ops[i], self.secs[i]
        latencies = self.latencies
        del latencies[bisect_left(latencies, secs / ops)]
        self.first += 1
        if self.first == self.end:
            self.ops_sum = self.secs_sum = 0.0  # no drift left behind by the subtractions
        else:
            self.ops_sum -= ops
            self.secs_sum -= secs

    def _segments(self, first: int, end: int) -> tuple[tuple[int, int], ...]:
        """The array index ranges of closed grains numbered [first, end)."""
        if first >= end:
            return ()
        lo, hi = first % self.capacity, end % self.capacity
        return ((lo, hi),) if lo < hi else tuple((a, b) for a, b in ((lo, self.capacity), (0, hi)) if a < b)

    def stats(self, now: float) -> WindowStats:
        if now < self.read_at:
            return self._stats_between(now - HOUR, now)  # a View older than the last read: from the arrays
        self.read_at = now
        oldest = self.added - self.count
        if self.end < oldest:  # never read while those grains were kept: start from what the arrays hold
            self.first = self.end = oldest
        taken: list[float] = []
        t, cap = self.t, self.capacity
        while self.end < self.added and t[self.end % cap] <= now:
            i = self.end % cap
            taken.append(self.secs[i] / self.ops[i])
            self.ops_sum += self.ops[i]
            self.secs_sum += self.secs[i]
            self.end += 1
        latencies = self.latencies
        if len(taken) > 16:  # a first read, or one after a long pause: one sort beats many insertions
            taken += latencies
            taken.sort()
            self.latencies = latencies = array("d", taken)
        else:
            for lat in taken:
                insort(latencies, lat)
        since = now - HOUR
        while self.first < self.end and t[self.first % cap] < since:
            self._let_go_of_oldest()
        samples, ops, secs, most = 0.0, self.ops_sum, self.secs_sum, -math.inf
        for lo, hi in self._segments(self.first, self.end):
            samples += math.fsum(self.n[lo:hi])
            most = max(most, max(self.most[lo:hi]))
        extra = None
        if self.open_n and since <= self.open_t <= now:
            extra = self.open_secs / self.open_ops
            samples += self.open_n
            ops += self.open_ops
            secs += self.open_secs
            most = max(most, self.open_most)
        if not latencies and extra is None:
            return EMPTY
        return WindowStats(
            int(samples),
            ops,
            secs / ops,
            _percentile_with(latencies, extra, 0.5),
            _percentile_with(latencies, extra, 0.95),
            most,
        )

    def _stats_between(self, since: float, until: float) -> WindowStats:
        """The grains whose newest sample is within [since, until], read one by one (a View read out of order)."""
        lat: list[float] = []
        samples = ops = secs = 0.0
        most = -math.inf
        closed = ((self.t[g % self.capacity], g % self.capacity) for g in range(self.added - self.count, self.added))
        for t, i in closed:
            if since <= t <= until:
                lat.append(self.secs[i] / self.ops[i])
                samples, ops, secs = samples + self.n[i], ops + self.ops[i], secs + self.secs[i]
                most = max(most, self.most[i])
        if self.open_n and since <= self.open_t <= until:
            lat.append(self.open_secs / self.open_ops)
            samples, ops, secs = samples + self.open_n, ops + self.open_ops, secs + self.open_secs
            most = max(most, self.open_most)
        if not lat:
            return EMPTY
        lat.sort()
        return WindowStats(int(samples), ops, secs / ops, _percentile(lat, 0.5), _percentile(lat, 0.95), most)


class _Window:
    """One (mountpoint, operation): its newest samples for the minute, its hour at a coarser grain."""

    __slots__ = ("hour", "minute")

    def __init__(self, capacity: int) -> None:
        self.minute = _Ring(capacity)
        self.hour = _Hour()

    def add(self, t: float, ops: float, secs: float) -> None:
        self.minute.add(t, ops, secs)
        self.hour.add(t, ops, secs)

    def newest(self) -> float:
        return self.minute.newest()

    def summary(self, now: float) -> LatencySummary:
        return LatencySummary(self.minute.stats(now - MINUTE, now), self.hour.stats(now))


GONE_MARGIN_SECONDS = 5.0
"""A mountpoint missing from the mount table is gone once its newest sample is this much older than the table: NFS
statistics can name a new mount before the mount source reads the table again, and a read takes a moment."""
MAX_MOUNTPOINTS = 10_000
"""The most mountpoints kept; past it, those whose newest sample is oldest go first."""


class LatencyWindows:
    def __init__(self, capacity: int = MINUTE_CAPACITY, max_mountpoints: int = MAX_MOUNTPOINTS) -> None:
        """``capacity``: the samples each window keeps one by one, for its minute."""
        self.capacity = capacity
        self.max_mountpoints = max_mountpoints
        self._rings: dict[str, dict[str, _Window]] = {}
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
                    ring = rings[op] = _Window(self.capacity)
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
