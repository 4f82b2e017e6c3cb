"""The vocabulary every layer speaks: durability classes, evidence and verdicts, a mount and its usage, a platform,
a collector's status. It imports nothing of storwatch, so any module may import it.
"""

from __future__ import annotations

import enum
import fnmatch
from dataclasses import dataclass
from typing import Literal

GENERIC = "generic"
TOGETHER_K8S = "together-k8s"
TOGETHER_SLURM = "together-slurm"
GRADIENT = "gradient"
PLATFORMS = (GENERIC, TOGETHER_K8S, TOGETHER_SLURM, GRADIENT)
"""The platform presets (classify.py holds what each knows)."""


class Durability(str, enum.Enum):
    """How long data on a mount survives (docs/durability.md)."""

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

    @property
    def used_ratio(self) -> float | None:
        """The share of the space a user can write to that is used, as df(1) counts it: used / (used + avail).

        Space reserved for root (ext4 keeps 5% by default) is neither: it is free but not available, and counting it
        in the size made / look a third as full as df says."""
        used = self.size_bytes - self.free_bytes
        total = used + self.avail_bytes
        return used / total if total > 0 else None


@dataclass(frozen=True)
class MountDevice:
    """How a mount reaches storage."""

    device: str
    """The block device the filesystem is on (its own line in /proc/diskstats)."""
    physical: tuple[str, ...]
    """The devices at the bottom of the stack: whole disks, or loop devices."""
    backing_file: str | None = None
    """Set when the stack ends in a loop device: the file behind it."""
    partition: bool = False
    """The device is a partition: the kernel counts flush requests on the whole disk only, never here."""


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
    failures: int = 0
    """Collections that failed since the agent started."""

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
class Override:
    """A config entry that pins a mount's class; ``mountpoint`` is an exact path or a glob."""

    mountpoint: str
    durability: Durability
    reason: str = ""

    def evidence(self, mount: Mount) -> Evidence | None:
        mp = mount.mountpoint
        if mp == self.mountpoint or fnmatch.fnmatchcase(mp, self.mountpoint):
            why = self.reason or f"set by the configuration for {self.mountpoint}"
            return Evidence(EvidenceSource.OVERRIDE, self.durability, why)
        return None


Severity = Literal["warning", "critical"]


@dataclass(frozen=True)
class Finding:
    id: str
    """Stable: the same run on the same mount keeps its id."""
    kind: str
    """What the data is: ``checkpoint`` (training state), ``model`` (model weights) or ``dataset`` (shards)."""
    severity: Severity
    mountpoint: str
    durability: str
    pod_uid: str | None
    """The pod whose volume holds the data, on Kubernetes."""
    run: str
    """The run's label (unique on the node), or a dataset directory's name as the host calls it."""
    path: str
    """The run's (or dataset's) directory as the host names it: two runs on one mount are two findings."""
    count: int
    """Complete checkpoints of the run on this mount."""
    bytes: int
    newest_age_seconds: float | None
    """Age of the newest file it counts; None when that is dated in the future (its age is unknown)."""
    durable_age_seconds: float | None
    """Age of the run's newest complete checkpoint on durable storage (the same run label elsewhere); None: none, or
    dated in the future."""
    move_to: str | None
    """A cluster or region mount to put it on: the same pod's first, else any on the node; None when there is none."""
    sentence: str
    exposed_seconds: float | None = None
    """Training held only by storage lost with the node: its newest checkpoint there less its newest durable copy;
    without a durable copy, the span of its checkpoints there (``exposed_at_least``: the run's work before its oldest
    kept checkpoint is unknown). None for datasets, or where a date is in the future."""
    exposed_at_least: bool = False
    severity_reason: str = ""
    """Why the finding has its severity, in words that follow it ("critical: the node is draining"): the budget it is
    past or within, or the node draining."""
