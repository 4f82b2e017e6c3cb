"""A trace replayer with ground truth for stall attribution (storwatch.analysis.stalls).

A scenario is a small simulated node: GPUs that compute, checkpoint, wait on data or idle for their own reasons,
mounts whose latency jitters around their own level and rises when something loads them. Each event writes two
things: what the agent would observe (per-tick GPU utilisation and memory, per-tick mount latency, checkpoint runs
as a scan finds them, the GPU processes' pods and open files) and, separately, the truth (which GPU time was lost to
which mount and cause). The observations are replayed through the agent's own StallFeed, with the calls the agent
makes, tick by tick on an injected clock (the feed joins runs to GPUs and mounts to the GPUs that touch them, and
drives the StallTracker), and the stalls it settles, the ones behind the exported totals, are scored against the
truth in GPU-seconds: precision is the share of attributed seconds that are right (same GPU, mount and cause),
recall the share of true stall seconds found.

The world is simulated because the ground truth of a real GPU's stalls is what nobody has; the storage side of the
attribution is exercised for real in the end-to-end test (a torch loop on a FUSE-delayed loop mount).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from storwatch.analysis.pods import ProcessPod
from storwatch.analysis.stall_feed import StallFeed
from storwatch.analysis.stalls import Cause, Stall, StallParams, StallState, StallTracker, WriteSpan
from storwatch.analysis.view import MountView, RunView
from storwatch.procfs.pidio import ProcessIO
from storwatch.sources.access import AccessFacts, WorkloadAccess
from storwatch.sources.checkpoints import Checkpoint, RunState
from storwatch.sources.gpu.facts import GPUFacts, GPUProcess, GPUState
from storwatch.vocabulary import Durability, Verdict
from tests.builders import mount

_VERDICT = Verdict(Durability.NODE, "a scenario's mount", ())

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

    def replay(self, params: StallParams | None = None, settle_every: int = 10) -> tuple[list[Stall], StallState]:
        """Feed the observations to a StallFeed tick by tick, as the agent calls it, then settle everything; return
        the stalls settled and the feed's last state (the totals the exporter counts). ``settle_every``: ticks from
        one settling to the next (the agent settles when a View is made, as for a scrape: by default every 10 ticks;
        tests/test_stalls.py checks that the totals do not depend on it).

        Each tick, as agent.py's tick: ``observe`` with the GPU facts (one utilisation sample per GPU, for the time
        since the previous one) and the latency samples the windows were fed, then ``forget`` with the mount table.
        Every ``settle_every`` ticks, ``update`` with what a View holds (the checkpoint runs as the last scan saw
        them, a scan every 10 s; the mounts; the GPU facts; the pods; the mounts each GPU process has files open
        on), which settles (_Node.settle: the one place to change when settling moves out of update)."""
        feed = StallFeed(params or StallParams(settle_seconds=30.0))
        recording = _RecordingTracker(feed.tracker.params)
        feed.tracker = recording  # the feed's own calls, recorded: settle() returns what the View's totals add up
        node = _Node(self)
        n = int(self.seconds / self.dt)
        every = round(10 / self.dt)
        runs: list[RunView] = []
        t = 0.0
        state = StallState()
        gpus: GPUFacts | None = None
        for i in range(n):
            t0, t = i * self.dt, (i + 1) * self.dt
            gpus = node.gpu_facts(t0, t)
            feed.observe(gpus, node.latency(t0, t))
            feed.forget(t, self.mounts)
            if (i + 1) % every == 0:
                runs = node.scan(t)
            if (i + 1) % settle_every == 0:
                state = node.settle(feed, t, runs, gpus)
        # the end: every write in the event log, the GPUs as last seen, and time enough for every reading to settle
        end = t + 10 * feed.tracker.params.settle_seconds
        state = node.settle(feed, end, node.scan(end), gpus)
        return recording.settled, state


class _RecordingTracker(StallTracker):
    """The shipped tracker, keeping what each settle returned (the stalls behind the totals) for the score."""

    def __init__(self, params: StallParams) -> None:
        super().__init__(params)
        self.settled: list[Stall] = []

    def settle(self, now: float) -> list[Stall]:
        stalls = super().settle(now)
        self.settled.extend(stalls)
        return stalls


POD_VOLUMES = "/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/pvc-{run}/mount"
"""Where a run written by several GPUs lives: the volume of the pod that holds those GPUs."""


class _Node:
    """What the agent's sources would report of a World: NVML's GPU facts, the latency windows' samples, the
    checkpoint scan's runs, the pods of the GPU processes and the mounts each has files open on.

    A run written by one GPU is found off Kubernetes: its event log names the writer's PID (and the temporary of a
    save in progress carries it). A run written by several GPUs is on a volume of their pod, whose processes are its
    writers. A GPU holding no memory has no process."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.pid = {name: 1000 + int(name) for name in world.gpus}
        self.mount_views = {
            name: MountView(mount(name, "ext4", "/dev/" + name.strip("/")), _VERDICT) for name in world.mounts
        }
        self.runs: dict[str, tuple[str, frozenset[str]]] = {}
        for s in world.spans:
            self.runs.setdefault(s.run, (s.mountpoint, s.gpus))
            assert self.runs[s.run] == (s.mountpoint, s.gpus), f"run {s.run} changes its mount or GPUs"
        self.pods: dict[int, ProcessPod] = {}
        self.paths: dict[str, str] = {}
        for k, (run, (mp, gpus)) in enumerate(self.runs.items()):
            if len(gpus) == 1:
                self.paths[run] = f"{mp}/{run}"
                continue
            uid = f"{k:08x}-0000-4000-8000-{k:012x}"
            self.paths[run] = POD_VOLUMES.format(uid=uid, run=run) + "/" + run
            for g in gpus:
                assert self.pid[g] not in self.pods, f"GPU {g} in two pods"
                self.pods[self.pid[g]] = ProcessPod(f"container-{g}", None, uid)
        self.access = AccessFacts(
            0.0,
            {
                self.pid[g.name]: WorkloadAccess(
                    self.pid[g.name],
                    1,
                    ProcessIO(),
                    mounts_read=tuple(sorted(g.reads)),
                    mounts_written=tuple(sorted(g.writes)),
                )
                for g in world.gpus.values()
            },
        )
        self.first_seen: dict[tuple[str, float], float] = {}

    def gpu_facts(self, t0: float, t: float) -> GPUFacts:
        states = []
        for g in self.world.gpus.values():
            util, mem = self.world._util(g, t0, t)
            states.append(
                GPUState(
                    int(g.name),
                    f"GPU-{g.name}",
                    "H100",
                    True,
                    utilization_ratio=util,
                    utilization_samples=((t, util),),
                    memory_used_bytes=(30 << 30) if mem else 0,
                    memory_total_bytes=80 << 30,
                    processes=(GPUProcess(self.pid[g.name], 30 << 30, None),) if mem else (),
                )
            )
        return GPUFacts(t, True, "550", None, tuple(states))

    def latency(self, t0: float, t: float) -> list[tuple[str, str, float, float, float, float]]:
        """Each mount's reads and writes over the tick: (mountpoint, operation, start, end, operations, seconds)."""
        ops = 20.0
        return [
            (m.name, op, t0, t, ops, ops * self.world._latency(m, op, t0, t))
            for m in self.world.mounts.values()
            for op in ("read", "write")
        ]

    def scan(self, t: float) -> list[RunView]:
        """The runs a checkpoint scan at ``t`` finds: each finished write with its span from the event log, a write in
        progress from the first scan that saw its temporary (when it began is not known till it ends)."""
        out = []
        for run, (mp, gpus) in self.runs.items():
            writer = self.pid[next(iter(gpus))] if len(gpus) == 1 else None
            mine = [s for s in self.world.spans if s.run == run]
            done = [s for s in mine if s.end is not None and s.end <= t]
            going = [s for s in mine if s.start <= t and (s.end is None or t < s.end)]
            since = min((self.first_seen.setdefault((run, s.start), t) for s in going), default=None)
            if not done and since is None:
                continue
            path = self.paths[run]
            checkpoints = tuple(
                Checkpoint(
                    path=f"{path}/step-{k}",
                    format="torch-zip",
                    verdict="complete",
                    reason="complete",
                    size_bytes=1 << 30,
                    mtime=s.end,
                    deep_checked=False,
                    first_seen=self.first_seen.get((run, s.start), s.end),
                    write_seconds=s.end - s.start,
                    write_bytes_per_second=(1 << 30) / (s.end - s.start),
                    write_start=s.start,
                    allocated_bytes=1 << 30,
                    writer_pid=writer,
                )
                for k, s in enumerate(done)
                if s.end is not None
            )
            state = RunState(
                path,
                mp,
                checkpoints,
                writing_since=since,
                writing_pids=(writer,) if since is not None and writer is not None else (),
            )
            out.append(RunView(state, run, self.mount_views[mp]))
        return out

    def settle(self, feed: StallFeed, now: float, runs: list[RunView], gpus: GPUFacts | None) -> StallState:
        """What the agent does when it settles stalls: today, when a View is made (analysis/build.py)."""
        state, _ = feed.update(now, runs, self.mount_views.values(), gpus, self.pods, self.access)
        return state


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
