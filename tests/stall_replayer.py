"""A trace replayer with ground truth for stall attribution (storwatch.analysis.stalls).

A scenario is a small simulated node: GPUs that compute, checkpoint, wait on data or idle for their own reasons,
mounts whose latency jitters around their own level and rises when something loads them. Each event writes two
things: what the agent would observe (per-tick GPU utilisation and memory, per-tick mount latency, checkpoint write
spans from the event log) and, separately, the truth (which GPU time was lost to which mount and cause). The
observations are replayed through the agent's own StallTracker calls, tick by tick, and the tracker's settled
stalls are scored against the truth in GPU-seconds: precision is the share of attributed seconds that are right
(same GPU, mount and cause), recall the share of true stall seconds found.

The world is simulated because the ground truth of a real GPU's stalls is what nobody has; the storage side of the
attribution is exercised for real in the end-to-end test (a torch loop on a FUSE-delayed loop mount).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from storwatch.analysis.stalls import (
    Cause,
    GPUReading,
    LatencyReading,
    Stall,
    StallParams,
    StallTracker,
    Touches,
    WriteSpan,
)

Truth = tuple[str, str, Cause]  # (gpu, mountpoint, cause)


@dataclass
class Gpu:
    name: str
    reads: frozenset[str]
    writes: frozenset[str]
    busy: float = 0.92
    # piecewise state over time: list of (start, end, utilisation multiplier, holds memory, truth or None)
    episodes: list[tuple[float, float, float, bool, Truth | None]] = field(default_factory=list)


@dataclass
class MountLoad:
    start: float
    end: float
    op: str  # "read", "write" or "both"
    factor: float


@dataclass
class Mount:
    name: str
    read_s: float
    write_s: float
    loads: list[MountLoad] = field(default_factory=list)


class World:
    """Build a scenario, then :meth:`replay` it."""

    def __init__(self, name: str, seconds: float, seed: int = 0, dt: float = 1.0) -> None:
        self.name, self.seconds, self.dt = name, seconds, dt
        self.rng = random.Random(seed)
        self.gpus: dict[str, Gpu] = {}
        self.mounts: dict[str, Mount] = {}
        self.spans: list[WriteSpan] = []
        self.jitter = 0.25  # lognormal sigma of per-tick latency noise
        self.scan_seen: dict[tuple[str, float], float] = {}

    # -- building

    def mount(self, name: str, read_ms: float = 2.0, write_ms: float = 4.0) -> World:
        self.mounts[name] = Mount(name, read_ms / 1000, write_ms / 1000)
        return self

    def gpu(self, name: str, reads: tuple[str, ...] = (), writes: tuple[str, ...] = (), busy: float = 0.92) -> World:
        self.gpus[name] = Gpu(name, frozenset(reads), frozenset(writes), busy)
        return self

    def _episode(
        self,
        gpus: tuple[str, ...],
        start: float,
        end: float,
        util: float,
        mem: bool,
        truth: Cause | None,
        mount: str | None,
    ) -> None:
        for g in gpus:
            label = (g, mount, truth) if truth is not None and mount is not None else None
            self.gpus[g].episodes.append((start, end, util, mem, label))

    def checkpoint(
        self,
        gpus: tuple[str, ...],
        run: str,
        mount: str,
        start: float,
        length: float,
        blocking: bool = True,
        factor: float = 8.0,
        logged: bool = True,
    ) -> World:
        """A checkpoint write: the mount's write latency rises; a blocking save idles the GPUs that wait for it."""
        self.mounts[mount].loads.append(MountLoad(start, start + length, "write", factor))
        if blocking:
            self._episode(gpus, start, start + length, 0.03, True, "checkpoint_write", mount)
        if logged:
            self.spans.append(WriteSpan(run, mount, start, start + length, frozenset(gpus)))
        return self

    def contention(
        self,
        mount: str,
        start: float,
        length: float,
        op: str = "both",
        factor: float = 10.0,
        stalls: tuple[str, ...] = (),
        cause: Cause = "io_contention",
    ) -> World:
        """Someone else loads a mount; the GPUs in ``stalls`` wait on it."""
        self.mounts[mount].loads.append(MountLoad(start, start + length, op, factor))
        if stalls:
            self._episode(stalls, start, start + length, 0.05, True, cause, mount)
        return self

    def data_stall(self, gpu: str, mount: str, start: float, length: float, factor: float = 12.0) -> World:
        """The data loader waits on slow reads of the dataset mount."""
        return self.contention(mount, start, length, "read", factor, (gpu,), "data_read")

    def idle(self, gpu: str, start: float, length: float, util: float = 0.02, memory: bool = True) -> World:
        """The GPU idles for a reason that is not storage (evaluation on CPU, NCCL waiting, a job between phases)."""
        self._episode((gpu,), start, start + length, util, memory, None, None)
        return self

    # -- observing

    def _util(self, g: Gpu, t0: float, t1: float) -> tuple[float, bool]:
        """The tick's utilisation: busy time-weighted over the tick, each episode at its own level."""
        covered, weighted, mem = 0.0, 0.0, True
        for s, e, u, m, _ in g.episodes:
            ov = max(0.0, min(t1, e) - max(t0, s))
            if ov > 0:
                covered += ov
                weighted += ov * u
                if not m and ov > (t1 - t0) / 2:
                    mem = False
        noise = self.rng.uniform(-0.04, 0.04)
        util = (weighted + (t1 - t0 - covered) * g.busy) / (t1 - t0) + noise
        return min(1.0, max(0.0, util)), mem

    def _latency(self, m: Mount, op: str, t0: float, t1: float) -> float:
        base = m.read_s if op == "read" else m.write_s
        factor = 1.0
        for load in m.loads:
            ov = max(0.0, min(t1, load.end) - max(t0, load.start))
            if ov > 0 and load.op in (op, "both"):
                factor = max(factor, 1.0 + (load.factor - 1.0) * ov / (t1 - t0))
        return base * factor * math.exp(self.rng.gauss(0.0, self.jitter))

    def truth(self) -> dict[Truth, float]:
        out: dict[Truth, float] = {}
        for g in self.gpus.values():
            for s, e, _, _, label in g.episodes:
                if label is not None:
                    out[label] = out.get(label, 0.0) + (e - s)
        return out

    def replay(
        self, params: StallParams | None = None, *, on_tick: Callable[[float], None] | None = None
    ) -> tuple[list[Stall], StallTracker]:
        """Feed the observations to a StallTracker tick by tick, as the agent does (spans arrive when they end, as
        the event log shows them a scan later), then settle everything; return the stalls."""
        tracker = StallTracker(params or StallParams(settle_seconds=30.0))
        tracker.touches = {g.name: Touches(g.reads, g.writes) for g in self.gpus.values()}
        stalls: list[Stall] = []
        t = 0.0
        n = int(self.seconds / self.dt)
        for i in range(n):
            t0, t = i * self.dt, (i + 1) * self.dt
            readings = []
            for g in self.gpus.values():
                util, mem = self._util(g, t0, t)
                readings.append(GPUReading(g.name, t0, t, util, mem))
            tracker.add_gpu(readings)
            tracker.add_latency(
                LatencyReading(m.name, op, t0, t, self._latency(m, op, t0, t))  # type: ignore[arg-type]
                for m in self.mounts.values()
                for op in ("read", "write")
            )
            # a scan every 10 s: a write is seen in progress from the first scan during it (its start unknown
            # till then), and its exact span from the first scan after it ends (the event log)
            if (i + 1) % round(10 / self.dt) == 0:
                tracker.add_spans(s for s in self.spans if s.end is not None and s.end <= t)
                first_seen = self.scan_seen
                tracker.writing(
                    WriteSpan(s.run, s.mountpoint, first_seen.setdefault((s.run, s.start), t), None, s.gpus)
                    for s in self.spans
                    if s.start <= t < (s.end or math.inf)
                )
            stalls.extend(tracker.settle(t))
            if on_tick:
                on_tick(t)
        tracker.add_spans(self.spans)
        tracker.writing(())
        stalls.extend(tracker.settle(t + 10 * tracker.params.settle_seconds))
        return stalls, tracker


@dataclass(frozen=True)
class Score:
    attributed: float
    correct: float
    true: float

    @property
    def precision(self) -> float:
        return self.correct / self.attributed if self.attributed else 1.0

    @property
    def recall(self) -> float:
        return self.correct / self.true if self.true else 1.0


def score(world: World, stalls: list[Stall]) -> Score:
    """Seconds attributed, of them rightly (same GPU, mount and cause, overlapping a true episode), and true seconds."""
    truth_eps = [
        (g.name, s, e, label) for g in world.gpus.values() for s, e, _, _, label in g.episodes if label is not None
    ]
    attributed = sum(st.seconds for st in stalls)
    correct = 0.0
    for st in stalls:
        for gname, s, e, label in truth_eps:
            if gname == st.gpu and label == (st.gpu, st.mountpoint, st.cause):
                correct += max(0.0, min(st.end, e) - max(st.start, s))
    return Score(attributed, min(correct, attributed), sum(world.truth().values()))
