"""Typed facts that flow from sources through Snapshot and History to the View every consumer reads."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from storwatch.sources.blockdev import MountDevice

if TYPE_CHECKING:
    from storwatch.analysis.latency import LatencySummary
    from storwatch.kubevolumes import KubeFacts
    from storwatch.procfs.cgroup import ContainerRef
    from storwatch.procfs.diskstats import DiskStats
    from storwatch.procfs.mountstats import NFSMount
    from storwatch.sources.checkpoints import CheckpointFacts
    from storwatch.sources.diskio import DiskIO
    from storwatch.sources.gpu import GPUFacts
    from storwatch.sources.nfs import NFSStats
    from storwatch.sources.probe import ProbeResult


class Durability(str, enum.Enum):
    """How long data on a mount survives (DESIGN.md, "Durability classes")."""

    VOLATILE = "volatile"
    """Nothing: a reboot or pod restart loses it."""
    NODE = "node"
    """Pod restarts on the same node; lost with the node."""
    CLUSTER = "cluster"
    """Node loss."""
    REGION = "region"
    """Cluster loss."""

    @property
    def ephemeral(self) -> bool:
        return self in (Durability.VOLATILE, Durability.NODE)


class EvidenceSource(enum.IntEnum):
    """Where a piece of durability evidence comes from; a larger value is stronger evidence."""

    DEVICE = 10
    FILESYSTEM = 20
    PLATFORM = 30
    KUBERNETES = 40
    OVERRIDE = 50

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Evidence:
    source: EvidenceSource
    durability: Durability
    reason: str
    """A sentence a person can read, saying what was seen and what it means for the data."""


@dataclass(frozen=True)
class Verdict:
    durability: Durability
    reason: str
    evidence: tuple[Evidence, ...]
    """Every piece of evidence seen, strongest first; the first decided the verdict."""


@dataclass(frozen=True)
class FsUsage:
    """statvfs(2) of a mount, in bytes and inodes."""

    size_bytes: int
    free_bytes: int
    avail_bytes: int
    files: int
    files_free: int


@dataclass(frozen=True)
class Mount:
    """One mount as the mount source saw it."""

    mount_id: int
    mountpoint: str
    device: str
    fstype: str
    root: str
    major: int
    minor: int
    readonly: bool
    options: tuple[str, ...]
    super_options: tuple[str, ...]
    usage: FsUsage | None
    """None while statvfs has not answered yet, is stuck, or failed."""
    stuck: bool
    """A statvfs on this mount has not returned within its deadline and is still in flight."""
    stuck_seconds: float
    usage_error: str | None = None
    block: MountDevice | None = None
    """The block device under the filesystem and what it is built on; None for network and memory filesystems."""


@dataclass(frozen=True)
class CollectorStatus:
    """How one source's last collection went, or that it is off."""

    name: str
    success: bool
    """The last collection read and parsed its input (always False while off)."""
    duration_seconds: float
    last_success_timestamp: float | None
    error: str | None = None
    """Why the last collection failed."""
    off_reason: str | None = None
    """Why the source is off (disabled in the config, nothing to watch on this node); None while it runs."""
    parse_errors: int | None = None
    """Lines of its input it could not parse since the agent started; None for a source that parses no lines."""

    @property
    def enabled(self) -> bool:
        return self.off_reason is None

    @property
    def state(self) -> str:
        """``ok``, ``failed`` or ``off``, as /status and /api/status say it."""
        if self.off_reason is not None:
            return "off"
        return "ok" if self.success else "failed"


@dataclass(frozen=True)
class Platform:
    name: str
    """generic, together-k8s, together-slurm or gradient."""
    detected_by: str
    """Why this platform: "config", "flag", or the evidence auto-detection saw."""


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

    @property
    def stuck(self) -> bool:
        """statvfs or the probe has not returned within its deadline."""
        return self.mount.stuck or bool(self.io.probe and self.io.probe.stuck)


@dataclass(frozen=True)
class Snapshot:
    """One consistent picture of the node at a tick: the latest facts of every source."""

    timestamp: float
    mounts: tuple[Mount, ...] = ()
    collectors: tuple[CollectorStatus, ...] = ()
    disks: DiskIO | None = None
    nfs: NFSStats | None = None
    probes: tuple[ProbeResult, ...] = ()
    gpus: GPUFacts | None = None
    containers: dict[int, ContainerRef | None] = field(default_factory=dict)
    """GPU process PID -> its container and pod, where it runs in one."""
    checkpoints: CheckpointFacts | None = None
    kube: KubeFacts | None = None

    def for_history(self) -> Snapshot:
        """This snapshot as History keeps it: what the tick saw change (deltas, samples, states), without the tables
        that only the newest snapshot needs: every NFS mount's per-op table, and the device counters beside their
        deltas (the deltas, worked out when asked for, keep the two reads they come from). Kept whole, they made
        History hold about 0.7 MB more each second on a node with 64 busy NFS mounts."""
        disks = None if self.disks is None else dataclasses.replace(self.disks, counters={})
        nfs = None if self.nfs is None else dataclasses.replace(self.nfs, mounts={})
        return dataclasses.replace(self, disks=disks, nfs=nfs)


@dataclass(frozen=True)
class RunView:
    """A checkpoint run joined with the mount it is on."""

    run: Any
    """storwatch.sources.checkpoints.RunState."""
    label: str
    """A short, stable name for the run: its path below the scan root."""
    mount: MountView | None
    """The mount holding the run's directory (its durability is the checkpoints')."""


@dataclass(frozen=True)
class View:
    """What every consumer (exporter, web, cli, policy) reads."""

    timestamp: float
    platform: Platform
    mounts: tuple[MountView, ...]
    collectors: tuple[CollectorStatus, ...]
    disks: DiskIO | None = None
    nfs: NFSStats | None = None
    gpus: GPUFacts | None = None
    containers: dict[int, ContainerRef | None] = field(default_factory=dict)
    checkpoints: tuple[RunView, ...] = ()
    checkpoint_roots: tuple[str, ...] | None = None
    """The host directories the checkpoint scan searches, as the host names them; None before it first reports."""
    kube: KubeFacts | None = None
    ready: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    checkpoint_scan: CheckpointFacts | None = None
    """The checkpoint source's facts beyond the runs: stuck roots, check errors."""
