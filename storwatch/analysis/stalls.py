"""Stall attribution: the GPU time lost to storage, by GPU, mount and cause.

A **stall** is a stretch of time in which a GPU's utilisation is below ``utilization_below`` while a process still
holds memory on it (the job is alive but the GPU waits), and storage explains the wait:

- ``checkpoint_write``: a checkpoint of a run that this GPU's work writes is being written (the exact span from the
  run's event log, storwatch.training.atomic_save); the stall is the overlap of the low-utilisation time with the
  write, charged to the mount the run is on;
- ``data_read``: otherwise, the read latency of a mount this GPU's work reads (its dataset) is well above that
  mount's own recent baseline;
- ``io_contention``: otherwise, the latency of any mount this GPU's work touches is well above its baseline, with no
  checkpoint of its own run in progress (another tenant, another run, the network filesystem's server).

A GPU that idles with no storage signal (evaluation, a collective waiting on the network, a finished job that still
holds its memory) is not stalled; neither is a GPU with no process.

"Well above its baseline": a reading at least ``latency_factor`` times the median of that mount and operation's
normal readings over the last ``baseline_seconds``, and at least ``latency_floor_seconds`` above it. Readings judged
high never enter the baseline, so a long contention does not become the norm; a mount with fewer than
``baseline_min_readings`` normal readings is judged against ``latency_absolute_seconds`` alone.

The :class:`StallTracker` takes the readings as they come (the agent feeds it each tick; the trace replayer in the
tests feeds it a recorded trace through the same calls) and settles the GPU time once ``settle_seconds`` old: a
checkpoint's write span is known only when its event is read, a scan after the write ends. Settled stalls add to
per (GPU, mount, cause) totals, the ``storwatch_gpu_stall_seconds_total`` counters; what is not settled yet is the
current state. Memory is bounded: GPU readings and latency readings are kept for the settle window only, baselines
for ``baseline_seconds`` at most ``BASELINE_READINGS`` each, spans until the readings they overlap are settled.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

Cause = Literal["checkpoint_write", "io_contention", "data_read"]
CAUSES: tuple[Cause, ...] = ("checkpoint_write", "io_contention", "data_read")
Op = Literal["read", "write"]

BASELINE_READINGS = 600
"""Normal readings kept per (mount, operation) for its baseline, whatever the cadence."""
MAX_TOTALS = 4096
"""(GPU, mount, cause) totals kept: beyond it the smallest are dropped (a node has at most a few hundred)."""


@dataclass(frozen=True)
class StallParams:
    utilization_below: float = 0.3
    """A GPU below this utilisation (0..1) is waiting."""
    latency_factor: float = 3.0
    latency_floor_seconds: float = 0.005
    latency_absolute_seconds: float = 0.1
    """A mount without a baseline yet is high above this latency."""
    baseline_seconds: float = 600.0
    baseline_min_readings: int = 5
    settle_seconds: float = 40.0
    """GPU time is attributed once this old: longer than a checkpoint scan's interval plus its own time."""


class GPUReading(NamedTuple):
    """One GPU's utilisation over ``(start, end]`` (a driver sample, or one tick's reading). A NamedTuple, as
    :class:`LatencyReading` is: the agent makes a few dozen a second, and a frozen dataclass costs five times as much
    to make (each field set through object.__setattr__)."""

    gpu: str
    """The GPU's label: its NVML index."""
    start: float
    end: float
    utilization: float
    holds_memory: bool
    """A process holds memory on the GPU (or the GPU has processes when their memory cannot be read)."""


class LatencyReading(NamedTuple):
    """A mount's mean latency for one operation over ``(start, end]``: one a second for each operation of each mount
    a GPU's work touches."""

    mountpoint: str
    op: Op
    start: float
    end: float
    seconds: float


@dataclass(frozen=True)
class WriteSpan:
    """A checkpoint write: from its event log, or still in progress (``end`` None)."""

    run: str
    mountpoint: str
    start: float
    end: float | None
    gpus: frozenset[str]
    """The GPUs whose work writes this run (its writer's process, or its pod's)."""
    checkpoint: str | None = None
    """The checkpoint written (its path), when known: a write whose timing is revised (first from the open files,
    then from its verified event line) stays one write."""

    @property
    def key(self) -> tuple[str, str | float]:
        """One write: the run and its checkpoint, or, for a write not tied to one, the run and its start."""
        return (self.run, self.checkpoint if self.checkpoint is not None else self.start)


@dataclass(frozen=True)
class Touches:
    """The mounts a GPU's work reads and writes."""

    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()

    @property
    def all(self) -> frozenset[str]:
        return self.reads | self.writes


@dataclass(frozen=True)
class Stall:
    gpu: str
    start: float
    end: float
    mountpoint: str
    cause: Cause
    run: str | None = None
    """The run whose checkpoint write it waited on (checkpoint_write)."""

    @property
    def seconds(self) -> float:
        return self.end - self.start


class Judged(NamedTuple):
    """A latency reading as its baseline judged it (one for each reading)."""

    reading: LatencyReading
    baseline: float | None
    high: bool


class Baseline:
    """One (mount, operation)'s normal readings over the last ``baseline_seconds``, in time order and, beside them,
    sorted, so the median is read without sorting (judging every mount's readings each tick sorted 600 values each)."""

    def __init__(self) -> None:
        self.normal: deque[tuple[float, float]] = deque()
        self.sorted: list[float] = []

    def _drop_oldest(self) -> None:
        _, seconds = self.normal.popleft()
        del self.sorted[bisect.bisect_left(self.sorted, seconds)]

    def judge(self, r: LatencyReading, p: StallParams) -> Judged:
        while self.normal and self.normal[0][0] < r.start - p.baseline_seconds:
            self._drop_oldest()
        n = len(self.sorted)
        base = None
        if n >= p.baseline_min_readings:
            base = self.sorted[n // 2] if n % 2 else (self.sorted[n // 2 - 1] + self.sorted[n // 2]) / 2
        if base is None:
            high = r.seconds >= p.latency_absolute_seconds
        else:
            high = r.seconds >= p.latency_factor * base and r.seconds >= base + p.latency_floor_seconds
        if not high:
            if len(self.normal) >= BASELINE_READINGS:
                self._drop_oldest()
            self.normal.append((r.end, r.seconds))
            bisect.insort(self.sorted, r.seconds)
        return Judged(r, base, high)


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _merge(spans: Iterable[tuple[float, float, WriteSpan]]) -> list[tuple[float, float, WriteSpan]]:
    """Overlapping pieces joined (the earlier span named), in time order."""
    out: list[tuple[float, float, WriteSpan]] = []
    for s0, s1, span in sorted(spans, key=lambda x: x[0]):
        if out and s0 <= out[-1][1]:
            if s1 > out[-1][1]:
                out[-1] = (out[-1][0], s1, out[-1][2])
        else:
            out.append((s0, s1, span))
    return out


def attribute(
    g: GPUReading,
    spans: Iterable[WriteSpan],
    high: Iterable[Judged],
    touches: Touches,
    now: float,
    p: StallParams,
    busy: float = 0.9,
) -> list[Stall]:
    """The stalls in one GPU reading: the pure rule above. ``spans`` and ``high`` are those that may overlap it;
    ``busy`` is the GPU's utilisation when it works (StallTracker learns it)."""
    if not g.holds_memory or g.end <= g.start or g.utilization >= max(busy, p.utilization_below):
        return []
    length = g.end - g.start
    mine = _merge(
        (max(g.start, s.start), min(g.end, now if s.end is None else s.end), s)
        for s in spans
        if g.gpu in s.gpus and _overlap(g.start, g.end, s.start, now if s.end is None else s.end) > 0
    )
    covered = sum(s1 - s0 for s0, s1, _ in mine) / length
    # A reading partly inside its own write: stalled for that part if its utilisation is what ``busy`` outside it and
    # waiting inside it would make (a sample period that straddles the start or the end of a write).
    rest_utilization = g.utilization
    if covered and g.utilization < (1.0 - covered) * busy + covered * p.utilization_below:
        out = [Stall(g.gpu, s0, s1, span.mountpoint, "checkpoint_write", span.run) for s0, s1, span in mine]
        rest = length * (1.0 - covered)
        # the GPU waited through the covered part: all its work in the reading was done in the rest
        rest_utilization = min(1.0, g.utilization / (1.0 - covered)) if covered < 1.0 else 1.0
    else:
        out, rest = [], length
    if rest <= 1e-9 or rest_utilization >= p.utilization_below:
        return out
    best: tuple[int, float, str] | None = None  # (data read first, how far above its baseline, mount)
    for j in high:
        r = j.reading
        if r.mountpoint not in touches.all or _overlap(g.start, g.end, r.start, r.end) <= 0:
            continue
        reading_data = int(r.op == "read" and r.mountpoint in touches.reads)
        ratio = r.seconds / j.baseline if j.baseline else math.inf
        key = (reading_data, ratio, r.mountpoint)
        if best is None or key > best:
            best = key
    if best is None:
        return out
    cause: Cause = "data_read" if best[0] else "io_contention"
    # the time not spent on its own checkpoint, drawn as one piece at the reading's end
    out.append(Stall(g.gpu, g.end - rest, g.end, best[2], cause))
    return out


@dataclass(frozen=True)
class StallState:
    """What the View carries: the settled totals (the counters) and the stalls still being settled."""

    totals: Mapping[tuple[str, str, Cause], float] = field(default_factory=dict)
    current: tuple[Stall, ...] = ()
    settle_seconds: float = 0.0
    share_10m: Mapping[str, float | None] = field(default_factory=dict)
    """Each GPU's settled stall time over the last ten minutes of Views, over ten minutes (analysis/stall_share.py),
    by its NVML index; None for a GPU until ten minutes are covered."""


BUSY_WEIGHT = 0.05
"""Weight of each working reading in a GPU's learnt busy level (an exponential average over about 20 readings)."""
MAX_PENDING = 8192
"""Readings kept per GPU until settled (15 minutes of a driver's six samples a second, more than settling holds)."""
MAX_HOLD_SECONDS = 900.0
"""A GPU's readings wait at most this long for a write in progress to end (one that takes longer is abandoned, or
hung: its time is settled without it)."""


class StallTracker:
    """Feeds readings through the rule as they come and settles GPU time ``settle_seconds`` after it, or after the
    end of a write of its own still in progress then."""

    def __init__(self, params: StallParams | None = None) -> None:
        self.params = params or StallParams()
        self.totals: dict[tuple[str, str, Cause], float] = {}
        """Settled stall seconds by (GPU, mount, cause), since the tracker started."""
        self.touches: dict[str, Touches] = {}
        """The mounts each GPU's work touches, as last seen (the agent keeps it current)."""
        self.busy: dict[str, float] = {}
        """Each GPU's utilisation when it works, learnt from its readings above the threshold."""
        self._gpu: dict[str, deque[GPUReading]] = {}
        self._settled_until: dict[str, float] = {}
        self._high: deque[Judged] = deque()
        self._baselines: dict[tuple[str, Op], Baseline] = {}
        self._spans: dict[tuple[str, str | float], WriteSpan] = {}
        self._writing: tuple[WriteSpan, ...] = ()

    def add_gpu(self, readings: Iterable[GPUReading]) -> None:
        for g in readings:
            if g.end <= self._settled_until.get(g.gpu, -math.inf):
                continue  # too late: that time is counted
            self._gpu.setdefault(g.gpu, deque(maxlen=MAX_PENDING)).append(g)
            if g.holds_memory and g.utilization >= self.params.utilization_below:
                level = self.busy.get(g.gpu, g.utilization)
                self.busy[g.gpu] = level + BUSY_WEIGHT * (g.utilization - level)

    def add_latency(self, readings: Iterable[LatencyReading]) -> None:
        for r in readings:
            base = self._baselines.get((r.mountpoint, r.op))
            if base is None:
                base = self._baselines[(r.mountpoint, r.op)] = Baseline()
            j = base.judge(r, self.params)
            if j.high:
                self._high.append(j)

    def add_spans(self, finished: Iterable[WriteSpan]) -> None:
        """Finished writes (from event logs); seeing one again changes nothing, and a write seen again with revised
        times replaces what was known of it (for the GPU time not yet settled)."""
        for s in finished:
            if s.end is not None:
                self._spans[s.key] = s

    def writing(self, spans: Iterable[WriteSpan]) -> None:
        """The writes in progress now (``end`` None, ``start`` when first seen), replacing the last call's: each holds
        back its GPUs' readings from settling until it ends, and counts as running until now for ``current``."""
        self._writing = tuple(s for s in spans if s.end is None)

    def forget_mounts(self, present: Iterable[str]) -> None:
        """Drop the baselines of mounts that are gone."""
        keep = set(present)
        for key in [k for k in self._baselines if k[0] not in keep]:
            del self._baselines[key]

    def _known_spans(self) -> list[WriteSpan]:
        done = list(self._spans.values())
        ended: dict[str, float] = {}
        for s in done:
            if s.end is not None:
                ended[s.run] = max(ended.get(s.run, s.end), s.end)
        return done + [w for w in self._writing if (ended.get(w.run) or -math.inf) < w.start]

    def _stalls(self, readings: Iterable[GPUReading], now: float) -> list[Stall]:
        spans = self._known_spans()
        high = sorted(self._high, key=lambda j: j.reading.start)
        starts = [j.reading.start for j in high]
        back = self.params.settle_seconds
        out: list[Stall] = []
        for g in readings:
            near = high[bisect.bisect_left(starts, g.start - back) : bisect.bisect_right(starts, g.end)]
            touches = self.touches.get(g.gpu, Touches())
            out.extend(attribute(g, spans, near, touches, now, self.params, self.busy.get(g.gpu, 0.9)))
        return out

    def settle(self, now: float) -> list[Stall]:
        """Attribute the GPU readings old enough to be sure of, add them to the totals and forget them; return their
        stalls."""
        cutoff = now - self.params.settle_seconds
        ready: list[GPUReading] = []
        for gpu, queue in self._gpu.items():
            held = [w.start for w in self._writing if gpu in w.gpus and w.start > now - MAX_HOLD_SECONDS]
            until = min([cutoff, *(h - self.params.settle_seconds for h in held)])
            while queue and queue[0].end <= until:
                ready.append(queue.popleft())
            if until > self._settled_until.get(gpu, -math.inf):
                self._settled_until[gpu] = until
        stalls = self._stalls(ready, now)
        for s in stalls:
            key = (s.gpu, s.mountpoint, s.cause)
            self.totals[key] = self.totals.get(key, 0.0) + s.seconds
        if len(self.totals) > MAX_TOTALS:
            for key in sorted(self.totals, key=self.totals.__getitem__)[: len(self.totals) - MAX_TOTALS]:
                del self.totals[key]
        oldest = min((q[0].start for q in self._gpu.values() if q), default=cutoff)
        horizon = min(oldest, cutoff) - self.params.settle_seconds
        while self._high and self._high[0].reading.end < horizon:
            self._high.popleft()
        for done in [k for k, s in self._spans.items() if s.end is not None and s.end < horizon]:
            del self._spans[done]
        return stalls

    def current(self, now: float) -> list[Stall]:
        """The stalls in the readings not settled yet, as far as the writes known now explain them."""
        return self._stalls([g for q in self._gpu.values() for g in q], now)

    def settled_before(self) -> float:
        """The time before which every GPU's readings are settled."""
        return min(self._settled_until.values(), default=-math.inf)
