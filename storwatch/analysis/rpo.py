"""Recovery points and checkpoint intervals: how much work a run loses if this node dies now, and how often it should
checkpoint given what a checkpoint costs here.

Pure arithmetic on the View's checkpoint runs and a time (the View's), so every consumer gets the same figures:

- the **recovery point** is the age of the run's newest complete checkpoint on storage that survives losing this
  node (``cluster`` or ``region``): the run's own, or, for a run on node-local storage, the newest save one of its
  durable copies protects (analysis/copies.py); a run with neither has an unbounded one (``inf``): losing the node
  loses all of its work, whatever sits on node-local disks;
- the **write cost** is how long the newest timed complete checkpoint took to write (its first file to its last);
- the **overhead** is that cost over the run's current interval: the share of time spent checkpointing;
- the **recommended interval** is Young's first-order optimum, sqrt(2 C M), with Daly's higher-order correction
  (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps", 2006):
  sqrt(2 C M) * (1 + sqrt(C / (2 M)) / 3 + C / (18 M)) - C for C < 2 M, else M; C the write cost, M the mean time
  between failures of the run (``checkpoints.mtbf_seconds``: the job's, not one node's; a job on N nodes fails about
  N times as often as one of them);
- the **headroom**: whether the next checkpoint (the last one's size, with a margin) fits in the space left on its
  mount, before a full disk turns it into a corrupt one;
- the **cost per tier**: how long the newest checkpoint would take on each durability tier of this node, at the
  median rate that checkpoints timed on that tier were written here (what moving the run would cost);
- the **workload** writing the run: the pod whose volume holds it, or the process its event log names;
- the **GPU-seconds at risk** are the recovery point times the GPUs the run's pod (or writer process) holds here,
  so one sum over a cluster's nodes says how much GPU time would be lost if every node died now.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from storwatch.analysis.pods import ProcessPod, workload_name
from storwatch.analysis.recovery import (
    RunRecovery,
    checkpoint_age_seconds,
    future_dated_reason,
    recovery_point_seconds,
)
from storwatch.analysis.view import RunView
from storwatch.procfs.cgroup import SlurmJob
from storwatch.sources.gpu.facts import GPUFacts
from storwatch.sources.kubevolumes import parse_kubelet_volume_path

DEFAULT_MTBF_SECONDS = 86_400.0
"""A day: the order of the interruptions seen by large training jobs (thousands of GPUs fail every few hours; a job
on a few nodes, every week or so). Set ``checkpoints.mtbf_seconds`` for the jobs a cluster runs."""


@dataclass(frozen=True)
class _Dated:
    mtime: float


def young_interval(cost_seconds: float, mtbf_seconds: float) -> float:
    """Young's optimum checkpoint interval: sqrt(2 C M)."""
    return math.sqrt(2.0 * cost_seconds * mtbf_seconds)


def daly_interval(cost_seconds: float, mtbf_seconds: float) -> float:
    """Daly's higher-order optimum checkpoint interval (the time computing between two checkpoints)."""
    c, m = cost_seconds, mtbf_seconds
    if c >= 2.0 * m:
        return m
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(c / (2.0 * m)) / 3.0 + c / (18.0 * m)) - c


HEADROOM_MARGIN = 1.25
"""The next checkpoint is taken to be this much bigger than the last (optimizer state grows, a format adds metadata);
written beside the last one, as atomic_save and every rotating save do, it needs that much free."""


def headroom_bytes(rv: RunView) -> int | None:
    """Available bytes on the run's mount less what its next checkpoint will take; None without a usage figure or a
    complete checkpoint."""
    newest = rv.run.newest_complete
    usage = rv.mount.mount.usage if rv.mount is not None else None
    if newest is None or usage is None:
        return None
    return usage.avail_bytes - math.ceil(newest.allocated_bytes * HEADROOM_MARGIN)


class GpuHolders:
    """The GPUs (by NVML index) each pod and each process holds, worked out once per View: :meth:`of_run` is asked
    for every run (hundreds on a large node), and each answer is then a lookup."""

    def __init__(self, gpus: GPUFacts | None, pods: Mapping[int, ProcessPod]) -> None:
        self.by_pod: dict[str, set[str]] = {}
        self.by_pid: dict[int, set[str]] = {}
        for g in gpus.gpus if gpus is not None else ():
            index = str(g.index)
            for p in g.processes:
                self.by_pid.setdefault(p.pid, set()).add(index)
                pod = pods.get(p.pid)
                if pod is not None and pod.pod_uid is not None:
                    self.by_pod.setdefault(pod.pod_uid, set()).add(index)

    def of_run(self, rv: RunView) -> frozenset[str] | None:
        """The GPUs whose work writes the run: those with a process of the pod whose volume holds the run (on
        Kubernetes: the run's path is under that pod's kubelet volume directory), or, for a run outside any pod's
        volume, those with the process its event log names as the writer, or the writer of a save in progress (its
        temporary's name carries it; off Kubernetes PIDs are the host's), or seen with its checkpoint files open for
        writing (analysis/writes.py). None when nothing ties the run to any process: its GPUs are unknown (never
        taken for none)."""
        where = parse_kubelet_volume_path(rv.run.path)
        if where is not None:
            return frozenset(self.by_pod.get(where.pod_uid, ()))
        writers = {c.writer_pid for c in rv.run.checkpoints if c.writer_pid is not None}
        writers |= set(rv.run.writing_pids) | set(rv.writers)
        if not writers:
            return None
        return frozenset(g for pid in writers for g in self.by_pid.get(pid, ()))


def run_workload(rv: RunView, pods: Mapping[int, ProcessPod], jobs: Mapping[int, SlurmJob]) -> str | None:
    """Who writes the run: the pod whose volume holds it, else the process its event log names (by its pod, Slurm
    job or PID)."""
    where = parse_kubelet_volume_path(rv.run.path)
    if where is not None:
        named = next((p for p in pods.values() if p.pod_uid == where.pod_uid and p.namespace and p.name), None)
        return f"{named.namespace}/{named.name}" if named is not None else f"pod:{where.pod_uid}"
    writer = next((c.writer_pid for c in reversed(rv.run.checkpoints) if c.writer_pid is not None), None)
    if writer is None and rv.writers:
        writer = rv.writers[0]
    return workload_name(writer, pods, jobs) if writer is not None else None


def tier_rates(runs: Iterable[RunView]) -> dict[str, float]:
    """Per durability tier, the median over runs of each run's median rate (bytes per second) at which its timed
    checkpoints were written on this node's mounts of that tier: one value per run, so a run that saves often, or
    whose figures are odd, moves the tier's rate no more than any other run."""
    rates: dict[str, list[float]] = {}
    for rv in runs:
        if rv.mount is None:
            continue
        mine = [c.write_bytes_per_second for c in rv.run.complete if c.write_bytes_per_second]
        if mine:
            rates.setdefault(rv.mount.verdict.durability.value, []).append(statistics.median(mine))
    return {tier: statistics.median(values) for tier, values in rates.items()}


def run_recovery(
    rv: RunView,
    now: float,
    mtbf_seconds: float = DEFAULT_MTBF_SECONDS,
    gpus: int | None = 0,
    workload: str | None = None,
    rates: Mapping[str, float] | None = None,
) -> RunRecovery:
    run = rv.run
    durable = rv.mount is not None and not rv.mount.verdict.durability.ephemeral
    newest_age = recovery_point_seconds(run, now)
    newest = run.newest_complete
    unknown = future_dated_reason(newest, now) if newest is not None else None
    point: float | None = math.inf
    copy = rv.newest_copy
    if durable and newest is not None:
        point = newest_age  # None while the newest is dated in the future
    elif copy is not None:
        point = checkpoint_age_seconds(_Dated(copy.covers), now)
        if point is None:
            unknown = (
                "its newest durable copy is of a save dated in the future (a clock stepped, or a date set by hand)"
            )
    timed = next((c for c in reversed(run.complete) if c.write_seconds is not None), None)
    cost = timed.write_seconds if timed is not None else None
    interval = run.interval_seconds
    overhead = cost / interval if cost is not None and interval else None
    recommended = daly_interval(cost, mtbf_seconds) if cost is not None and cost > 0 else None
    by_tier = {t: newest.size_bytes / r for t, r in (rates or {}).items() if newest is not None and r > 0}
    return RunRecovery(
        rv.label,
        point,
        newest_age,
        cost,
        overhead,
        recommended,
        headroom_bytes(rv),
        gpus,
        workload,
        by_tier,
        unknown if point is None else None,
        rv.id,
    )


def recoveries(
    runs: Iterable[RunView],
    now: float,
    mtbf_seconds: float = DEFAULT_MTBF_SECONDS,
    gpus: GPUFacts | None = None,
    pods: Mapping[int, ProcessPod] | None = None,
    jobs: Mapping[int, SlurmJob] | None = None,
) -> tuple[RunRecovery, ...]:
    """Every run's recovery figures, in the order of ``runs``; ``gpus``, ``pods`` and ``jobs`` (the View's) count the
    GPUs each run's pod or writer holds here and name who writes it."""
    runs = tuple(runs)
    rates = tier_rates(runs)
    pods, jobs = pods or {}, jobs or {}
    holders = GpuHolders(gpus, pods)
    out = []
    for rv in runs:
        held = holders.of_run(rv)
        count = None if held is None else len(held)
        out.append(run_recovery(rv, now, mtbf_seconds, count, run_workload(rv, pods, jobs), rates))
    return tuple(out)
