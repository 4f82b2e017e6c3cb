"""Feed the stall tracker (analysis/stalls.py) from what the agent sees: each tick's GPU utilisation samples and the
mounts' latency samples, and, once the tick has made its View, the checkpoint writes of each run with the GPUs that
wait on them and the mounts each GPU's work touches; then it settles. The agent adds the settled totals and the
current stalls to the View it publishes.

Which GPUs a run's writes hold up: the GPUs of the pod whose volume holds the run (Kubernetes), or of the process
that wrote it (its event log's PID, off Kubernetes, where PIDs are the host's). Which mounts a GPU's work touches:
the mounts of its runs (written), of its pod's volumes (read and written), and those its processes have files open
on (sources/access.py: read or written, by the files' access modes).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterable, Mapping, Sequence

from storwatch.analysis.pods import ProcessPod
from storwatch.analysis.rpo import GpuHolders
from storwatch.analysis.stalls import (
    GPUReading,
    LatencyReading,
    Op,
    StallParams,
    StallState,
    StallTracker,
    Touches,
    WriteSpan,
)
from storwatch.analysis.timeline import Timeline, TimelinePicture
from storwatch.analysis.view import MountView, RunView
from storwatch.sources.access import AccessFacts
from storwatch.sources.gpu.facts import GPUFacts, GPUState
from storwatch.sources.kubevolumes import parse_kubelet_volume_path

LATENCY_OPS: Mapping[str, Op] = {
    "read": "read",
    "write": "write",
    "fsync": "write",
    "probe_read": "read",
    "probe_write": "write",
    "probe_fsync": "write",
}
"""The latency windows' operations as the stall rule reads them."""
FORGET_EVERY_SECONDS = 10.0
MAX_GAP_SECONDS = 5.0
"""A utilisation sample after a longer silence covers at most this much time before it (the GPU source stalled, or
the agent was stopped): nobody knows what the GPU did in between."""


def _time(sample: tuple[float, float]) -> float:
    return sample[0]


def holds_memory(g: GPUState) -> bool:
    return any(p.used_memory_bytes is None or p.used_memory_bytes > 0 for p in g.processes)


def write_spans(rv: RunView, gpus: frozenset[str], since: float) -> tuple[list[WriteSpan], list[WriteSpan]]:
    """The run's finished writes that end after ``since``, and its write in progress (if any)."""
    if rv.mount is None or not gpus:
        return [], []
    mp = rv.mount.mount.mountpoint
    # The saves the kernel's file events show are known as soon as they end, before the scan has seen what they
    # wrote; the checkpoints' own spans come after them, one write per checkpoint (the same key), so an event log's
    # exact span replaces what the events said of the same save.
    done = [
        WriteSpan(rv.label, mp, s.start, s.end, gpus, s.checkpoint)
        for s in rv.saves
        if s.start is not None and s.end is not None and s.end >= since
    ]
    evented = {s.checkpoint for s in rv.saves if s.start is not None and s.end is not None}
    done += [
        WriteSpan(rv.label, mp, c.write_start, c.write_start + c.write_seconds, gpus, c.path)
        for c in rv.run.checkpoints
        if c.write_start is not None
        and c.write_seconds is not None
        and c.write_start + c.write_seconds >= since
        and not (c.write_timed_by == "file_events" and c.path in evented)
    ]
    writing = []
    if rv.open_writes_since is not None:  # its checkpoint files open for writing (analysis/writes.py)
        start = rv.open_writes_since
        if rv.run.writing_since is not None:
            start = min(start, rv.run.writing_since)
        writing.append(WriteSpan(rv.label, mp, start, None, gpus))
    elif rv.run.writing_since is not None:  # an atomic_save temporary being written
        writing.append(WriteSpan(rv.label, mp, rv.run.writing_since, None, gpus))
    elif rv.run.write_in_progress and not _ended_by_events(rv):  # a checkpoint directory still incomplete
        writing.append(WriteSpan(rv.label, mp, rv.run.checkpoints[-1].first_seen, None, gpus))
    return done, writing


def _ended_by_events(rv: RunView) -> bool:
    """Whether the file events show the save of the run's newest checkpoint ended: a save of it that ended at or after
    its last change, and none of it open. Then a checkpoint still incomplete only because it changed within the scan's
    settle time (a directory with no end marker: the Hugging Face Trainer's) is not being written, and its GPUs' time
    need not wait for it to settle: its save's span is known."""
    newest = rv.run.checkpoints[-1] if rv.run.checkpoints else None
    if newest is None or newest.write_timed_by != "file_events":
        return False
    return not any(s.checkpoint == newest.path and s.end is None for s in rv.saves)


class StallFeed:
    """The agent's stall tracker and what feeds it (thread-safe: ticks feed it, Views settle it)."""

    def __init__(self, params: StallParams | None = None) -> None:
        self.tracker = StallTracker(params)
        self._lock = threading.Lock()
        self._gpu_seen: dict[str, float] = {}
        """Each GPU's newest sample time fed."""
        self._gpus_at: float | None = None
        self._next_forget = -math.inf
        self._watched: frozenset[str] = frozenset()
        """The mounts any GPU's work touched at the last View: the only ones whose latency is judged and drawn."""
        self.timeline = Timeline()

    @property
    def watched(self) -> frozenset[str]:
        """The mounts some GPU's work touched at the last View: the only ones whose latency :meth:`observe` takes."""
        return self._watched

    def configure(self, params: StallParams) -> None:
        with self._lock:
            self.tracker.params = params

    def observe(self, gpus: GPUFacts | None, latency: Iterable[tuple[str, str, float, float, float, float]]) -> None:
        """One tick's new facts: the GPU facts (fed once per GPU source reading) and the latency samples the windows
        were fed, each (mountpoint, operation, start, end, operations, seconds)."""
        watched = self._watched  # only the mounts some GPU's work touches: a node has hundreds of others
        readings = [
            LatencyReading(mp, LATENCY_OPS[op], start, end, secs / ops)
            for mp, op, start, end, ops, secs in latency
            if mp in watched and ops > 0 and op in LATENCY_OPS and math.isfinite(start) and end > start
        ]
        gpu_readings: list[GPUReading] = []
        if gpus is not None and gpus.timestamp != self._gpus_at:
            self._gpus_at = gpus.timestamp
            for g in gpus.gpus:
                gpu_readings.extend(self._gpu_readings(g))
        with self._lock:
            self.tracker.add_latency(readings)
            self.tracker.add_gpu(gpu_readings)
            for r in readings:
                if r.op == "write":
                    self.timeline.add_latency(r.mountpoint, r.end, r.seconds)
            if gpus is not None and gpu_readings:
                # Every sample to the timeline, not their mean: a read of the driver's buffer holds seconds of them,
                # and a GPU busy then idle then busy averaged in one value draws as neither.
                for x in gpu_readings:
                    self.timeline.add_gpu(x.gpu, x.end, x.utilization, None)
                for g in gpus.gpus:
                    used, total = g.memory_used_bytes, g.memory_total_bytes
                    memory = used / total if used is not None and total else None
                    self.timeline.add_gpu(str(g.index), gpus.timestamp, None, memory)

    def forget(self, now: float, mountpoints: Iterable[str]) -> None:
        """At most every FORGET_EVERY_SECONDS: drop the latency baselines of mounts gone from the table (pod volumes
        come and go: each kept its baseline for ever)."""
        if now < self._next_forget:
            return
        self._next_forget = now + FORGET_EVERY_SECONDS
        keep = list(mountpoints)
        with self._lock:
            self.tracker.forget_mounts(keep)
            self.timeline.forget(keep)

    def _gpu_readings(self, g: GPUState) -> list[GPUReading]:
        label = str(g.index)
        if not g.up:
            return []
        # The driver's samples of the last 30 s (or the polled values where it keeps none), oldest first: the
        # same samples come in many facts, and those up to the newest fed are skipped.
        samples: Sequence[tuple[float, float]] = g.utilization_samples
        prev = self._gpu_seen.get(label)
        if prev is not None:
            samples = samples[bisect.bisect_right(samples, prev, key=_time) :]
        mem = holds_memory(g)
        out = []
        for t, ratio in samples:
            if prev is not None and t > prev:
                out.append(GPUReading(label, max(prev, t - MAX_GAP_SECONDS), t, ratio, mem))
            if prev is None or t > prev:
                prev = t
        if prev is not None:
            self._gpu_seen[label] = prev
        return out

    def update(
        self,
        now: float,
        runs: Iterable[RunView],
        mounts: Iterable[MountView],
        gpus: GPUFacts | None,
        pods: Mapping[int, ProcessPod],
        access: AccessFacts | None = None,
    ) -> tuple[StallState, TimelinePicture]:
        """Each tick, once its View is made: the writes and what each GPU touches, then settle; the state and the
        last hour's picture for the View."""
        touches: dict[str, tuple[set[str], set[str]]] = {}
        done: list[WriteSpan] = []
        writing: list[WriteSpan] = []
        with self._lock:
            since = self.tracker.settled_before() - self.tracker.params.settle_seconds
        holders = GpuHolders(gpus, pods)
        run_mounts: dict[str, set[str]] = {}
        """Each GPU's runs' checkpoint mounts: the mount its strip draws, before any other it writes to."""
        for rv in runs:
            held = holders.of_run(rv) or frozenset()  # a run tied to no process charges no GPU's time
            d, w = write_spans(rv, held, since)
            done += d
            writing += w
            if rv.mount is not None:
                for gpu in held:
                    touches.setdefault(gpu, (set(), set()))[1].add(rv.mount.mount.mountpoint)
                    run_mounts.setdefault(gpu, set()).add(rv.mount.mount.mountpoint)
        if gpus is not None and pods:
            volumes: dict[str, set[str]] = {}
            for mv in mounts:
                where = parse_kubelet_volume_path(mv.mount.mountpoint)
                if where is not None:
                    volumes.setdefault(where.pod_uid, set()).add(mv.mount.mountpoint)
            for g in gpus.gpus:
                for p in g.processes:
                    pod = pods.get(p.pid)
                    if pod is not None and pod.pod_uid in volumes:
                        reads, writes = touches.setdefault(str(g.index), (set(), set()))
                        reads |= volumes[pod.pod_uid]
                        writes |= volumes[pod.pod_uid]
        if gpus is not None and access is not None:
            for g in gpus.gpus:
                for p in g.processes:
                    opened = access.workloads.get(p.pid)
                    if opened is not None:
                        reads, writes = touches.setdefault(str(g.index), (set(), set()))
                        reads.update(opened.mounts_read)
                        writes.update(opened.mounts_written)
        with self._lock:
            t = self.tracker
            t.touches = {gpu: Touches(frozenset(r), frozenset(w)) for gpu, (r, w) in touches.items()}
            self._watched = frozenset(mp for r, w in touches.values() for mp in r | w)
            t.add_spans(done)
            t.writing(writing)
            settled = t.settle(now)
            current = tuple(t.current(now))
            self.timeline.add_stalls(settled)
            self.timeline.add_writes(done)
            drawn = {gpu: min(run_mounts.get(gpu) or w) for gpu, (_, w) in touches.items() if w}
            picture = self.timeline.picture(now, current, writing, drawn)
            return StallState(dict(t.totals), current, t.params.settle_seconds), picture


def settle_seconds_for(checkpoint_interval: float, tick: float) -> float:
    """How long GPU time waits before it is attributed: a checkpoint scan's interval, its own time and a tick."""
    return max(10.0, checkpoint_interval + 10.0 + tick)
