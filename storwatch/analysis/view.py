"""The View: what every consumer (exporter, report, web, cli, policy) reads. It holds the tick's Snapshot and adds
what analysis derived from it: each mount's durability verdict and I/O, each checkpoint run with the mount it is on.
analysis/build.py makes it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from storwatch.analysis.pods import ProcessPod
from storwatch.analysis.recovery import RunRecovery

# The sources' records a consumer reads, re-exported: the exporter, report, page and policy import
# them from here, never from sources/ (the import contract in pyproject.toml). The View is their one seam.
from storwatch.procfs.cgroup import ContainerRef, SlurmJob
from storwatch.procfs.diskstats import DiskStats
from storwatch.procfs.mountstats import NFSMount
from storwatch.snapshot import Snapshot
from storwatch.sources.access import AccessFacts, WorkloadAccess
from storwatch.sources.kubevolumes import PodInfo, VolumeRef
from storwatch.vocabulary import CollectorStatus, Finding, Mount, Platform, Verdict

if TYPE_CHECKING:
    from storwatch.analysis.latency import LatencySummary
    from storwatch.analysis.stalls import StallState
    from storwatch.analysis.timeline import TimelinePicture
    from storwatch.analysis.writes import EventSave
    from storwatch.checkpoints.record import RunId
    from storwatch.sources.checkpoints import CheckpointFacts, RunState
    from storwatch.sources.diskio import DiskIO
    from storwatch.sources.gpu import GPUFacts
    from storwatch.sources.kubevolumes import KubeFacts
    from storwatch.sources.lustre import LustreFacts
    from storwatch.sources.nfs import NFSStats
    from storwatch.sources.probe import ProbeResult


@dataclass(frozen=True)
class MountIO:
    """A mount's I/O, joined from the block device under it, its NFS statistics and its probe."""

    device: str | None = None
    """The block device whose counters are the mount's (shared by every mount on that device)."""
    counters: DiskStats | None = None
    nfs: NFSMount | None = None
    probe: ProbeResult | None = None
    latency: Mapping[str, LatencySummary] = field(default_factory=dict)
    """Windows by operation: read, write, fsync (from diskstats or NFS) and probe_write, probe_fsync, probe_read
    (summarised when first read: analysis.latency.MountLatency)."""


@dataclass(frozen=True)
class MountView:
    mount: Mount
    verdict: Verdict
    io: MountIO = field(default_factory=MountIO)
    volume: VolumeRef | None = None
    """The pod, volume, claim, PV and StorageClass behind it (sources/kubevolumes.py volume_ref, joined once here);
    None when it is no pod's volume or hostPath, or off Kubernetes."""

    @property
    def stuck(self) -> bool:
        """statvfs or the probe has not returned within its deadline."""
        return self.mount.stuck or bool(self.io.probe and self.io.probe.stuck)


@dataclass(frozen=True)
class DurableCopy:
    """A copy of a run's checkpoint on storage that survives losing this node: what makes the run safe."""

    where: str
    """The copy, as the host names it."""
    covers: float
    """The save it protects: the source checkpoint's newest modification time when it was copied (UNIX seconds)."""
    how: str
    """``verified`` (a copy storwatch made and read back: its manifest, root's, describes it) or ``same path`` (a
    complete checkpoint at the same path below another root, on durable storage: a copy made by hand)."""
    checkpoint: str
    """The name of the checkpoint it is a copy of."""
    made: float | None = None
    """When the copy was put in place (verified copies)."""

    @property
    def mtime(self) -> float:
        """The save it protects, as a checkpoint's age reads it (analysis.recovery.checkpoint_age_seconds)."""
        return self.covers


@dataclass(frozen=True)
class RunView:
    """A checkpoint run joined with the mount it is on."""

    run: RunState
    label: str
    """A short, stable name for the run, unique on the node: its path below its scan root, or its whole path where
    two runs below different roots share that (analysis/checkpoints.py). For people and the ``run`` label; joins go
    by ``id``."""
    mount: MountView | None
    """The mount holding the run's directory (its durability is the checkpoints')."""
    host_path: str | None = None
    """The run's directory as the host names it (``run.path`` is where this process reaches it, under
    ``--path.rootfs``); None: the same as ``run.path``."""
    writers: tuple[int, ...] = ()
    """The GPU processes seen writing its checkpoints (their files open for writing: analysis/writes.py)."""
    open_writes_since: float | None = None
    """When its checkpoint files open for writing now were first seen open; None when none is."""
    copies: tuple[DurableCopy, ...] = ()
    """Its checkpoints' copies on durable storage (analysis/copies.py), the newest save first."""
    saves: tuple[EventSave, ...] = ()
    """Its saves as the kernel's file events show them (analysis/writes.py), the ones ending last last; a save still
    being written last of all."""
    pod: PodInfo | None = None
    """The pod whose end takes the run away: the pod whose volume holds it, else the pod of the process that writes
    it (a run on a hostPath onto the node's disk); None off Kubernetes or where no pod is known."""
    writers_seen: tuple[tuple[int, float], ...] = ()
    """Each writer, and the newest look (wall time) that found its work holding one of the run's checkpoint files open
    for writing: a process alive now with that PID that started before then is the one seen (a PID is never reused
    while its process lives)."""

    @property
    def newest_copy(self) -> DurableCopy | None:
        """The copy that protects the newest save."""
        return self.copies[0] if self.copies else None

    @property
    def directory(self) -> str:
        """The run's directory as the host names it."""
        return self.run.path if self.host_path is None else self.host_path

    @property
    def id(self) -> RunId:
        return self.run.id

    @property
    def writing(self) -> bool:
        """A save is in progress: a checkpoint file open for writing, an atomic_save temporary being written, or a
        newest checkpoint still incomplete and changing."""
        return self.open_writes_since is not None or self.run.write_in_progress


@dataclass(frozen=True)
class LeftOut:
    """What the bound on runs (analysis/checkpoints.py MAX_RUNS) left without series and rows of their own. Findings
    and recovery figures are computed over every run first; this keeps what the runs left out add to each sum, so
    every total stays whole."""

    runs: int = 0
    """Runs without series or rows of their own."""
    findings: int = 0
    """Their findings (no ``storwatch_finding`` series, no line on /status)."""
    important_bytes: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """Their findings' bytes by (mountpoint, kind)."""
    gpu_seconds_at_risk: float = 0.0
    """Their GPU-seconds at risk, summed (``inf`` where one has no checkpoint that survives the node)."""


@dataclass(frozen=True)
class View:
    """One tick's Snapshot and what analysis made of it."""

    snapshot: Snapshot
    platform: Platform
    mounts: tuple[MountView, ...] = ()
    """Every mount with its verdict and I/O, in the mount table's order."""
    checkpoints: tuple[RunView, ...] = ()
    """Checkpoint runs with their mounts, newest first, bounded: the runs that get series and rows of their own
    (analysis/checkpoints.py keep_runs); ``left_out`` counts the rest."""
    checkpoint_roots: tuple[str, ...] | None = None
    """The host directories the checkpoint scan searches, as the host names them; None before it first reports."""
    ready: bool = True
    """Every source has reported at least once."""
    pods: Mapping[int, ProcessPod] = field(default_factory=dict)
    """GPU process PID -> its container and pod (joined once here for every consumer: analysis/pods.py)."""
    findings: tuple[Finding, ...] = ()
    """Important data on storage that does not survive losing this node, most severe first (analysis/findings.py):
    those of the runs in ``checkpoints`` and every dataset directory; ``left_out`` holds what the others add."""
    recovery: tuple[RunRecovery, ...] = ()
    """Each checkpoint run's recovery point, write cost and recommended interval, in the order of ``checkpoints``
    (analysis/rpo.py)."""
    stalls: StallState | None = None
    """GPU time lost to storage: settled totals by GPU, mount and cause, and the stalls still being settled
    (analysis/stalls.py); None where the agent does not track them (``storwatch scan``)."""
    timeline: TimelinePicture | None = None
    """Each GPU's last hour for /status: utilisation, memory, stalls, checkpoint writes, its run mount's latency."""
    left_out: LeftOut = field(default_factory=LeftOut)
    """What the bound on runs left without series or rows of their own, and what it adds to the sums."""

    def important_bytes(self) -> dict[tuple[str, str], int]:
        """Bytes of important data on ephemeral storage by (mountpoint, kind), over every run: the findings shown
        plus those left out, exact to the byte."""
        out = dict(self.left_out.important_bytes)
        for f in self.findings:
            out[(f.mountpoint, f.kind)] = out.get((f.mountpoint, f.kind), 0) + f.bytes
        return out

    # -- the snapshot's facts, as consumers read them

    @property
    def timestamp(self) -> float:
        return self.snapshot.timestamp

    @property
    def collectors(self) -> tuple[CollectorStatus, ...]:
        return self.snapshot.collectors

    @property
    def disks(self) -> DiskIO | None:
        return self.snapshot.disks

    @property
    def nfs(self) -> NFSStats | None:
        return self.snapshot.nfs

    @property
    def gpus(self) -> GPUFacts | None:
        return self.snapshot.gpus

    @property
    def containers(self) -> Mapping[int, ContainerRef | None]:
        return self.snapshot.containers

    @property
    def jobs(self) -> Mapping[int, SlurmJob]:
        """GPU process PID -> its Slurm job, where it runs in one."""
        return self.snapshot.jobs

    @property
    def kube(self) -> KubeFacts | None:
        return self.snapshot.kube

    @property
    def access(self) -> AccessFacts | None:
        """Each GPU process tree's I/O counters and the mounts it has files open on (sources/access.py)."""
        from storwatch.sources.access import ACCESS

        return self.snapshot.get(ACCESS)

    @property
    def lustre(self) -> LustreFacts | None:
        """Lustre clients' per-mount counters (sources/lustre.py)."""
        from storwatch.sources.lustre import LUSTRE

        return self.snapshot.get(LUSTRE)

    def facts_of(self, name: str) -> object | None:
        """A source's facts by its name (its FactsKey's): how an exporter area reads a source the View does not join,
        against a Protocol of the fields it reads, so that it imports no source (docs/architecture.md, the recipe)."""
        return self.snapshot.facts.get(name)

    @property
    def checkpoint_scan(self) -> CheckpointFacts | None:
        """The checkpoint source's facts beyond the runs: stuck roots, check errors."""
        return self.snapshot.checkpoints


__all__ = [
    "AccessFacts",
    "DurableCopy",
    "LeftOut",
    "MountIO",
    "MountView",
    "PodInfo",
    "RunView",
    "View",
    "VolumeRef",
    "WorkloadAccess",
]
