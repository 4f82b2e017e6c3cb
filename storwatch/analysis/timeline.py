"""The last hour per GPU (or what the agent has seen of it), for the picture on /status: utilisation and memory in
10 s buckets, stall spans by cause, checkpoint writes, and the latency of the mount its run writes to. Each
utilisation bucket keeps its lowest and highest sample beside its mean, so a GPU that alternates between busy and
idle (computing, then waiting on a save) draws as the swing it is, not as a flat line at the mean.

Fed by the stall feed (analysis/stall_feed.py) with what it already sees each tick; bounded whatever the uptime: at
most ``BUCKETS`` buckets per GPU and per mount, ``MAX_SPANS`` stalls and writes, and the mounts of the current table.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, MutableSequence
from dataclasses import dataclass

from storwatch.analysis.stalls import Stall, WriteSpan

BUCKET_SECONDS = 10.0
WINDOW_SECONDS = 3600.0
BUCKETS = int(WINDOW_SECONDS / BUCKET_SECONDS) + 1
MAX_SPANS = 4096
MIN_DRAWN_SECONDS = 0.05


@dataclass(frozen=True)
class Span:
    start: float
    end: float
    label: str
    """The stall's cause, or the run written."""
    detail: str = ""
    """The stall's mount."""


@dataclass(frozen=True)
class GPUTimeline:
    gpu: str
    utilization: tuple[tuple[float, float], ...]
    """(bucket start, mean utilisation 0..1)."""
    memory: tuple[tuple[float, float], ...]
    """(bucket start, memory used / total)."""
    stalls: tuple[Span, ...]
    writes: tuple[Span, ...]
    latency_mount: str | None
    latency: tuple[tuple[float, float], ...]
    """(bucket start, mean latency seconds) of ``latency_mount``."""
    utilization_range: tuple[tuple[float, float, float], ...] = ()
    """(bucket start, lowest, highest utilisation sample in it): the peaks and troughs the mean smooths away."""


@dataclass(frozen=True)
class TimelinePicture:
    start: float
    end: float
    gpus: tuple[GPUTimeline, ...]


class _Buckets:
    """(start, sum, count, lowest, highest) per BUCKET_SECONDS, the last BUCKETS of them."""

    def __init__(self) -> None:
        self.rows: deque[list[float]] = deque(maxlen=BUCKETS)

    def add(self, t: float, value: float) -> None:
        start = math.floor(t / BUCKET_SECONDS) * BUCKET_SECONDS
        if self.rows and self.rows[-1][0] == start:
            row = self.rows[-1]
            row[1] += value
            row[2] += 1
            row[3] = min(row[3], value)
            row[4] = max(row[4], value)
        elif not self.rows or start > self.rows[-1][0]:
            self.rows.append([start, value, 1.0, value, value])

    def points(self, since: float) -> tuple[tuple[float, float], ...]:
        """(start, mean) of each bucket from ``since``."""
        return tuple((r[0], r[1] / r[2]) for r in self.rows if r[0] >= since)

    def ranges(self, since: float) -> tuple[tuple[float, float, float], ...]:
        """(start, lowest, highest) of each bucket from ``since``."""
        return tuple((r[0], r[3], r[4]) for r in self.rows if r[0] >= since)


def _append(out: MutableSequence[Stall], s: Stall) -> None:
    """Append ``s``, or extend the last stall with it when it follows that one without a gap (same GPU, cause, mount
    and run): a stall is settled a reading at a time."""
    last = out[-1] if out else None
    if (
        last is not None
        and (last.gpu, last.cause, last.mountpoint, last.run) == (s.gpu, s.cause, s.mountpoint, s.run)
        and last.start <= s.start <= last.end + 1e-6
    ):
        out[-1] = Stall(s.gpu, last.start, max(last.end, s.end), s.mountpoint, s.cause, s.run)
    else:
        out.append(s)


def _joined(stalls: Iterable[Stall]) -> list[Stall]:
    """Stalls that follow one another without a gap, with the same GPU, cause, mount and run, as one."""
    out: list[Stall] = []
    for s in sorted(stalls, key=lambda s: (s.gpu, s.start)):
        _append(out, s)
    return out


class Timeline:
    def __init__(self) -> None:
        self._util: dict[str, _Buckets] = {}
        self._memory: dict[str, _Buckets] = {}
        self._latency: dict[str, _Buckets] = {}
        self._stalls: dict[str, deque[Stall]] = {}
        self._writes: dict[tuple[str, str | float], WriteSpan] = {}

    def add_gpu(self, gpu: str, t: float, utilization: float | None, memory_ratio: float | None) -> None:
        """A GPU's utilisation sample (each of the driver's, not a mean of several: the bucket keeps their lowest
        and highest) and its memory ratio at ``t``; None where there is none."""
        if utilization is not None:
            self._util.setdefault(gpu, _Buckets()).add(t, utilization)
        if memory_ratio is not None:
            self._memory.setdefault(gpu, _Buckets()).add(t, memory_ratio)

    def add_latency(self, mountpoint: str, t: float, seconds: float) -> None:
        self._latency.setdefault(mountpoint, _Buckets()).add(t, seconds)

    def add_stalls(self, stalls: Iterable[Stall]) -> None:
        """Settled stalls; one that continues the GPU's last (same cause, mount and run, no gap) extends it."""
        for s in stalls:
            _append(self._stalls.setdefault(s.gpu, deque(maxlen=MAX_SPANS)), s)

    def add_writes(self, spans: Iterable[WriteSpan]) -> None:
        for s in spans:
            if s.end is not None:
                self._writes[s.key] = s
        if len(self._writes) > MAX_SPANS:
            for key in sorted(self._writes, key=lambda k: self._writes[k].start)[: len(self._writes) - MAX_SPANS]:
                del self._writes[key]

    def forget(self, mountpoints: Iterable[str]) -> None:
        """Drop the latency of mounts gone from the table (a node's GPUs stay: a handful, each bounded)."""
        keep = set(mountpoints)
        for mp in [m for m in self._latency if m not in keep]:
            del self._latency[mp]

    def picture(
        self, now: float, current: Iterable[Stall], writing: Iterable[WriteSpan], mounts: Mapping[str, str]
    ) -> TimelinePicture:
        """The last hour at ``now``; ``mounts``: the mount whose latency is drawn beside each GPU."""
        since = now - WINDOW_SECONDS
        for key in [k for k, s in self._writes.items() if (s.end or now) < since]:
            del self._writes[key]
        settled = [s for mine in self._stalls.values() for s in mine if s.end >= since]
        # pieces shorter than MIN_DRAWN_SECONDS are left out: an hour is 4.5 s a pixel, and a sliver at the edge of a
        # write (the moment between the GPU going idle and the save starting) would still be drawn a pixel wide
        stalls = [s for s in _joined([*settled, *current]) if s.seconds >= MIN_DRAWN_SECONDS]
        writes = [*self._writes.values(), *writing]
        gpus = []
        for gpu in sorted(set(self._util) | set(self._memory), key=lambda g: (len(g), g)):
            mp = mounts.get(gpu)
            gpus.append(
                GPUTimeline(
                    gpu,
                    self._util[gpu].points(since) if gpu in self._util else (),
                    self._memory[gpu].points(since) if gpu in self._memory else (),
                    tuple(Span(s.start, s.end, s.cause, s.mountpoint) for s in stalls if s.gpu == gpu),
                    tuple(Span(w.start, w.end or now, w.run) for w in writes if gpu in w.gpus),
                    mp,
                    self._latency[mp].points(since) if mp in self._latency else (),
                    self._util[gpu].ranges(since) if gpu in self._util else (),
                )
            )
        # A younger agent draws the time it has seen, not an empty hour with its data squeezed to the right edge.
        first = min(
            (p[0][0] for g in gpus for p in (g.utilization, g.memory, g.latency) if p),
            default=since,
        )
        start = min(max(since, first), now - BUCKET_SECONDS)
        return TimelinePicture(start, now, tuple(gpus))
