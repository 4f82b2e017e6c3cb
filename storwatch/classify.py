"""Durability classification: which class a mount is in, why, and the evidence behind it.

Evidence comes from several sources, strongest first: a config override, the Kubernetes volume behind the mount (added
by the Kubernetes enrichment through ``Classifier.add_provider``), the platform preset, and the filesystem type with
its backing device. The strongest piece decides; all are kept so a person can see what else was seen.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from storwatch.paths import DEFAULT_PROCFS, DEFAULT_SYSFS, HostPaths
from storwatch.vocabulary import (
    GENERIC,
    GRADIENT,
    PLATFORMS,
    TOGETHER_K8S,
    TOGETHER_SLURM,
    Durability,
    Evidence,
    EvidenceSource,
    Mount,
    Override,
    Platform,
    Verdict,
)

EvidenceProvider = Callable[[Mount], "Evidence | None"]


VOLATILE_FSTYPES = frozenset({"tmpfs", "ramfs"})
# Shared filesystems served from other machines: data on them survives losing this node.
CLUSTER_FSTYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "ceph",
        "lustre",
        "gpfs",
        "beegfs",
        "glusterfs",
        "cifs",
        "smb3",
        "wekafs",
        "orangefs",
        "pvfs2",
        "ocfs2",
        "gfs2",
        "9p",
    }
)
# FUSE clients of shared filesystems (fstype "fuse.<name>" or source "<name>").
CLUSTER_FUSE = frozenset({"glusterfs", "ceph-fuse", "ceph", "juicefs", "sshfs", "lustre", "weka"})
# FUSE clients of object storage: data lives in a bucket that survives the whole cluster.
REGION_FUSE = frozenset(
    {
        "s3fs",
        "mountpoint-s3",
        "gcsfuse",
        "goofys",
        "rclone",
        "blobfuse",
        "blobfuse2",
        "geesefs",
        "s3ql",
        "alluxio-fuse",
    }
)
LOCAL_BLOCK_FSTYPES = frozenset(
    {
        "ext2",
        "ext3",
        "ext4",
        "xfs",
        "btrfs",
        "f2fs",
        "vfat",
        "exfat",
        "ntfs",
        "ntfs3",
        "zfs",
        "bcachefs",
        "squashfs",
        "erofs",
        "iso9660",
        "udf",
    }
)


# Where the kernel shows its own state as files: a mount there (a cgroup tmpfs, a tracefs...) holds no user data.
KERNEL_INTERFACE_DIRS = (DEFAULT_PROCFS, DEFAULT_SYSFS)


def is_pseudo_mount(mountpoint: str) -> bool:
    """A mount at or below /proc or /sys of the host: a kernel interface, not storage (the mount source already
    drops pseudo filesystem types; this catches ordinary ones mounted there, such as the tmpfs of /sys/fs/cgroup)."""
    return any(mountpoint == d or mountpoint.startswith(d + "/") for d in KERNEL_INTERFACE_DIRS)


def _fuse_name(mount: Mount) -> str | None:
    """The FUSE program behind a mount: the subtype of ``fuse.<name>``, else the source of a plain ``fuse``."""
    if mount.fstype.startswith("fuse."):
        return mount.fstype[5:]
    if mount.fstype in ("fuse", "fuseblk"):
        return os.path.basename(mount.device) or mount.device
    return None


def is_network_filesystem(mount: Mount) -> bool:
    name = _fuse_name(mount)
    if name is not None:
        return name in CLUSTER_FUSE or name in REGION_FUSE
    return mount.fstype in CLUSTER_FSTYPES


def _device_evidence(mount: Mount) -> Evidence:
    dev = mount.device
    base = os.path.basename(dev)
    fs = mount.fstype
    if base.startswith("rbd"):
        return Evidence(
            EvidenceSource.DEVICE,
            Durability.CLUSTER,
            f"{fs} on Ceph RBD network block device {dev}: its data lives in the Ceph cluster",
        )
    if base.startswith("loop"):
        return Evidence(
            EvidenceSource.DEVICE,
            Durability.NODE,
            f"{fs} on loop device {dev}, a file-backed block device on this node: lost with the node",
        )
    if dev.startswith("/dev/"):
        return Evidence(
            EvidenceSource.DEVICE,
            Durability.NODE,
            f"{fs} on local block device {dev}: survives pod restarts, lost with the node",
        )
    return Evidence(
        EvidenceSource.DEVICE,
        Durability.NODE,
        f"{fs} on {dev or 'an unnamed device'}: a local filesystem, lost with the node",
    )


def storage_evidence(mount: Mount) -> Evidence:
    """What the filesystem type and the backing device alone say. Always has an answer."""
    fs = mount.fstype
    fuse = _fuse_name(mount)
    if fs in VOLATILE_FSTYPES:
        return Evidence(
            EvidenceSource.FILESYSTEM, Durability.VOLATILE, f"{fs} lives in memory: a reboot or pod restart loses it"
        )
    if fuse is not None:
        if fuse in REGION_FUSE:
            return Evidence(
                EvidenceSource.FILESYSTEM,
                Durability.REGION,
                f"object storage through FUSE ({fuse}): survives losing the node and the cluster",
            )
        if fuse in CLUSTER_FUSE:
            return Evidence(
                EvidenceSource.FILESYSTEM,
                Durability.CLUSTER,
                f"shared filesystem through FUSE ({fuse}): survives losing this node",
            )
        return Evidence(
            EvidenceSource.FILESYSTEM,
            Durability.NODE,
            f"FUSE filesystem {fuse!r} of unknown kind: assumed lost with the node",
        )
    if fs in CLUSTER_FSTYPES:
        return Evidence(
            EvidenceSource.FILESYSTEM,
            Durability.CLUSTER,
            f"{fs} is a shared network filesystem ({mount.device}): survives losing this node",
        )
    if fs == "overlay" or fs == "aufs":
        return Evidence(
            EvidenceSource.FILESYSTEM,
            Durability.NODE,
            f"{fs} (container root filesystem): writes land in this node's container storage",
        )
    if fs in LOCAL_BLOCK_FSTYPES or mount.device.startswith("/dev/"):
        return _device_evidence(mount)
    return Evidence(
        EvidenceSource.FILESYSTEM,
        Durability.NODE,
        f"filesystem type {fs!r} is not a known shared one: assumed lost with the node",
    )


@dataclass(frozen=True)
class PathRule:
    """A platform fact about a path: mounts at or under ``prefix`` get ``durability`` for ``reason``."""

    prefix: str
    durability: Durability
    reason: str
    network: bool | None = None
    """None: any mount; True: only network filesystems; False: only local ones."""

    def matches(self, mount: Mount) -> bool:
        mp = mount.mountpoint
        if not (mp == self.prefix or mp.startswith(self.prefix.rstrip("/") + "/")):
            return False
        return self.network is None or self.network == is_network_filesystem(mount)


PRESETS: Mapping[str, tuple[PathRule, ...]] = {
    GENERIC: (),
    TOGETHER_K8S: (
        PathRule(
            "/home",
            Durability.NODE,
            "on Together Kubernetes clusters /home is on the node's local disk: it is lost when the node is "
            "drained, recreated, or fails",
            network=False,
        ),
    ),
    TOGETHER_SLURM: (
        PathRule(
            "/home",
            Durability.CLUSTER,
            "on Together Slurm clusters /home is NFS from the head node: it persists when this node is lost",
            network=True,
        ),
    ),
    GRADIENT: (
        PathRule(
            "/storage", Durability.CLUSTER, "Gradient /storage is persistent team storage: it survives this machine"
        ),
        PathRule(
            "/notebooks",
            Durability.CLUSTER,
            "Gradient /notebooks is persisted with the notebook across machine restarts",
        ),
        PathRule(
            "/home/paperspace",
            Durability.NODE,
            "Gradient /home/paperspace is the temporary workspace: lost when the machine stops",
        ),
        PathRule(
            "/artifacts",
            Durability.NODE,
            "Gradient /artifacts is collected only when the run ends: lost if this machine dies first",
        ),
        PathRule("/datasets", Durability.REGION, "Gradient /datasets are versioned datasets kept in object storage"),
    ),
}


def platform_evidence(platform: str, mount: Mount) -> Evidence | None:
    for rule in PRESETS.get(platform, ()):
        if rule.matches(mount):
            return Evidence(EvidenceSource.PLATFORM, rule.durability, rule.reason)
    return None


class Classifier:
    def __init__(self, platform: str, overrides: Iterable[Override] = ()) -> None:
        if platform not in PRESETS:
            raise ValueError(f"unknown platform {platform!r}; known: {', '.join(PLATFORMS)}")
        self.platform = platform
        self.overrides = tuple(overrides)
        self._providers: list[EvidenceProvider] = []

    def add_provider(self, provider: EvidenceProvider) -> None:
        """Add a source of evidence (e.g. the Kubernetes volume mapping)."""
        self._providers.append(provider)

    def evidence(self, mount: Mount) -> list[Evidence]:
        found: list[Evidence] = [storage_evidence(mount)]
        plat = platform_evidence(self.platform, mount)
        if plat is not None:
            found.append(plat)
        for provider in self._providers:
            ev = provider(mount)
            if ev is not None:
                found.append(ev)
        for ov in self.overrides:
            ev = ov.evidence(mount)
            if ev is not None:
                found.append(ev)
                break
        # Stable sort: among equals the earlier (more specific) stays first.
        found.sort(key=lambda e: e.source, reverse=True)
        return found

    def classify(self, mount: Mount) -> Verdict:
        found = self.evidence(mount)
        best = found[0]
        return Verdict(best.durability, best.reason, tuple(found))


def detect_platform(paths: HostPaths, environ: Mapping[str, str]) -> Platform:
    """Guess the platform from what the node shows; the most specific layout wins."""

    def exists(host_path: str) -> bool:
        return os.path.exists(paths.root(host_path))

    if exists("/storage") and exists("/artifacts"):
        return Platform(GRADIENT, "Gradient layout: /storage and /artifacts present")
    for conf in ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf"):
        if exists(conf):
            return Platform(TOGETHER_SLURM, f"Slurm configuration {conf} present")
    slurm_env = sorted(k for k in environ if k.startswith("SLURM_"))
    if slurm_env:
        return Platform(TOGETHER_SLURM, f"Slurm environment ({slurm_env[0]})")
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return Platform(TOGETHER_K8S, "Kubernetes service environment (KUBERNETES_SERVICE_HOST)")
    if exists("/var/lib/kubelet"):
        return Platform(TOGETHER_K8S, "kubelet directory /var/lib/kubelet present")
    return Platform(GENERIC, "no platform layout detected")


def resolve_platform(config_platform: str, paths: HostPaths, environ: Mapping[str, str] | None = None) -> Platform:
    """The configured platform, or the detected one when the configuration says ``auto``."""
    if config_platform != "auto":
        return Platform(config_platform, "configured")
    return detect_platform(paths, os.environ if environ is None else environ)
