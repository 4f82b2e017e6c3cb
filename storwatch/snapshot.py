"""Snapshot: one consistent picture of the node at a tick, the latest facts of every source under its FactsKey.

The agent fills it from the sources the registry declares; History keeps what ``for_history`` leaves of it; the View
(analysis/view.py) is made from it. The sources the View joins onto mounts (mounts, diskstats, NFS, probes, GPUs,
processes, checkpoints, Kubernetes) have typed attributes here; any other source's facts are read with ``get``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from storwatch.procfs.cgroup import ContainerRef, SlurmJob
from storwatch.sources import FactsKey
from storwatch.sources.checkpoint_key import CHECKPOINTS
from storwatch.sources.diskio import DISKIO, DiskIO
from storwatch.sources.gpu import GPUS, GPUFacts
from storwatch.sources.kubevolumes import KUBE, KubeFacts
from storwatch.sources.mounts import MOUNTS
from storwatch.sources.nfs import NFS, NFSStats
from storwatch.sources.probe import PROBES, ProbeResult
from storwatch.sources.processes import CONTAINERS
from storwatch.vocabulary import CollectorStatus, Mount

if TYPE_CHECKING:
    from storwatch.sources.checkpoints import CheckpointFacts

F = TypeVar("F")

CORE_KEYS: tuple[FactsKey[Any], ...] = (MOUNTS, DISKIO, NFS, PROBES, GPUS, CONTAINERS, CHECKPOINTS, KUBE)
"""The facts the View joins (each a typed attribute below)."""


@dataclass(frozen=True, init=False)
class Snapshot:
    """The latest facts of every source at one tick, by name (a source that has not reported has none)."""

    timestamp: float
    collectors: tuple[CollectorStatus, ...] = ()
    """Every known collector's status at this tick, off ones included."""
    facts: Mapping[str, object] = field(default_factory=dict)
    """Each source's facts under its FactsKey's name."""

    def __init__(
        self,
        timestamp: float,
        mounts: tuple[Mount, ...] | None = None,
        collectors: tuple[CollectorStatus, ...] = (),
        facts: Mapping[str, object] | None = None,
        **by_name: object,
    ) -> None:
        """Facts by name: ``Snapshot(t, collectors=..., facts={"mounts": ...})`` (as the agent makes it) or
        ``Snapshot(t, mounts, disks=..., nfs=...)``; a None value is no facts."""
        merged = {k: v for k, v in (facts or {}).items() if v is not None}
        merged.update((k, v) for k, v in by_name.items() if v is not None)
        if mounts is not None:
            merged[MOUNTS.name] = mounts
        object.__setattr__(self, "timestamp", timestamp)
        object.__setattr__(self, "collectors", tuple(collectors))
        object.__setattr__(self, "facts", MappingProxyType(merged))

    def get(self, key: FactsKey[F]) -> F | None:
        """The facts filed under ``key``, or None when that source has not reported."""
        return cast("F | None", self.facts.get(key.name))

    def for_history(self, keys: Iterable[FactsKey[Any]] = CORE_KEYS) -> Snapshot:
        """This snapshot as History keeps it: what the tick saw change (deltas, samples, states), without the tables
        that only the newest snapshot needs (each key's ``for_history`` says what stays). Kept whole, every NFS
        mount's per-op table and the device counters beside their deltas made History hold about 0.7 MB more each
        second on a node with 64 busy NFS mounts."""
        facts = dict(self.facts)
        for key in keys:
            value = facts.get(key.name)
            if value is not None and key.for_history is not None:
                facts[key.name] = key.for_history(value)
        return Snapshot(self.timestamp, collectors=self.collectors, facts=facts)

    # -- the facts the View joins

    @property
    def mounts(self) -> tuple[Mount, ...]:
        return self.get(MOUNTS) or ()

    @property
    def disks(self) -> DiskIO | None:
        return self.get(DISKIO)

    @property
    def nfs(self) -> NFSStats | None:
        return self.get(NFS)

    @property
    def probes(self) -> tuple[ProbeResult, ...]:
        return self.get(PROBES) or ()

    @property
    def gpus(self) -> GPUFacts | None:
        return self.get(GPUS)

    @property
    def containers(self) -> Mapping[int, ContainerRef | None]:
        """GPU process PID -> its container and pod, where it runs in one."""
        return self.get(CONTAINERS) or {}

    @property
    def jobs(self) -> Mapping[int, SlurmJob]:
        """GPU process PID -> the Slurm job it runs in, where it runs in one."""
        jobs: Mapping[int, SlurmJob] = getattr(self.get(CONTAINERS), "jobs", {})
        return jobs

    @property
    def checkpoints(self) -> CheckpointFacts | None:
        return self.get(CHECKPOINTS)

    @property
    def kube(self) -> KubeFacts | None:
        return self.get(KUBE)
