"""Durability classification: which class a mount is in, why, and the evidence behind it.

Evidence comes from several sources, strongest first: a config override, the Kubernetes volume behind the mount (added
by the Kubernetes enrichment through ``Classifier.add_provider``), the platform preset, and the filesystem type with
its backing device. The strongest piece decides; all are kept so a person can see what else was seen.

The same presets and verdicts say where the checkpoint scan looks when nothing is configured (``default_places``):
the places a platform puts people's data, where the mount they are on is lost with the node.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from storwatch.paths import DEFAULT_PROCFS, DEFAULT_SYSFS, HostPaths
from storwatch.sources.checkpoint_key import HOW_TO_ADD, DefaultPlaces, SearchRoot
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


@dataclass(frozen=True)
class SearchPlace:
    """A place where a platform puts people's data: searched for checkpoints by default where the mount it is on is
    lost with the node (the classifier's verdict on that mount, overrides and presets included)."""

    path: str
    what: str
    """What is kept there, for people: "home directories"."""


HOME = SearchPlace("/home", "home directories")
SEARCH_PLACES: Mapping[str, tuple[SearchPlace, ...]] = {
    GENERIC: (HOME,),
    # /home is node-local on Together's Kubernetes nodes; the pods' own volumes are the kubelet's (searched apart).
    TOGETHER_K8S: (HOME,),
    # /home is NFS from the head node there, so it is passed over (said so); jobs write to node-local scratch.
    TOGETHER_SLURM: (
        HOME,
        SearchPlace("/scratch", "scratch space"),
        SearchPlace("/local", "local scratch"),
        SearchPlace("/mnt/local-nvme", "the local NVMe"),
        SearchPlace("/tmp", "temporary files"),
    ),
    # /storage and /notebooks persist, /datasets are object storage: only the workspace and /artifacts are lost.
    GRADIENT: (
        SearchPlace("/home/paperspace", "the temporary workspace"),
        SearchPlace("/artifacts", "artifacts, collected only when the run ends"),
    ),
}
"""The places each preset searches by default, in order."""

SYSTEM_DIRS = (
    DEFAULT_PROCFS,
    DEFAULT_SYSFS,
    "/dev",
    "/run",
    "/boot",
    "/efi",
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/var",
    "/snap",
    "/nix",
    "/root",
)
"""The root filesystem's system directories: a mount at or below one (a runtime's tmpfs, /boot/efi, a snap, the
container runtime's and the kubelet's trees) holds no user data to search by default."""
TEMPORARY_DIRS = ("/tmp", "/var/tmp")
"""A mount strictly below one of these was made by a program in a temporary directory (a test, a build, a tool),
not by the platform for people's data."""
IMAGE_FSTYPES = frozenset({"squashfs", "erofs", "iso9660", "udf"})
"""Read-only images (snaps, live media): nothing is written to them."""
MAX_MOUNT_DEPTH = 3
"""Data mounts are searched by default up to this many levels below / (/scratch, /mnt/nvme0, /opt/dlami/nvme,
/mnt/disks/ssd0): where an administrator or a cloud image mounts a node's disks."""
MAX_DEFAULT_MOUNTS = 16
"""Data mounts searched by default at most; further ones are passed over, each said."""
MAX_PASSED_OVER = 32


def searchable_directory(path: str) -> bool | str:
    """Whether ``path`` (as this process reaches it) is a directory the scan can start at: True; False where nothing
    is there; else why not. Not followed when a symbolic link (below --path.rootfs it would lead into this process's
    own tree)."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    if stat.S_ISDIR(st.st_mode):
        return True
    if stat.S_ISLNK(st.st_mode):
        return f"a symbolic link, not followed; {HOW_TO_ADD} (its target)"
    return False


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _answers_locally(mount: Mount) -> bool:
    """Storage this node serves itself (memory, a local block device, a container's overlay): a stat there waits on
    no server, so its directories can be looked at from the agent's own threads."""
    fs = mount.fstype
    return fs in VOLATILE_FSTYPES or fs in ("overlay", "aufs") or fs in LOCAL_BLOCK_FSTYPES


def _storage_words(mount: Mount) -> str:
    """The filesystem, and the device where it names one ("xfs on /dev/nvme1n1", "tmpfs", "overlay")."""
    if mount.fstype in VOLATILE_FSTYPES or mount.device in ("", "none", mount.fstype):
        return mount.fstype
    return f"{mount.fstype} on {mount.device}"


def _lost_word(durability: Durability) -> str:
    return "in memory" if durability is Durability.VOLATILE else "node-local"


def _is_data_mount(mount: Mount) -> bool:
    """A mount that looks like a place for people's data: local storage (a block device that is no file-backed image,
    or memory), writable, up to MAX_MOUNT_DEPTH levels below /, not the root itself, not in a system directory and
    not made inside a temporary directory."""
    mp = mount.mountpoint
    if mp == "/" or mount.readonly or mount.stuck:
        return False
    if len(mp.strip("/").split("/")) > MAX_MOUNT_DEPTH:
        return False
    if any(_inside(mp, d) for d in SYSTEM_DIRS) or any(mp.startswith(d + "/") for d in TEMPORARY_DIRS):
        return False
    if mount.fstype in VOLATILE_FSTYPES:
        return True
    local_block = mount.fstype in LOCAL_BLOCK_FSTYPES and mount.fstype not in IMAGE_FSTYPES
    return local_block and mount.device.startswith("/dev/") and not os.path.basename(mount.device).startswith("loop")


def mount_holding(mounts: Iterable[Mount], host_path: str) -> Mount | None:
    """The mount ``host_path`` lies on: the longest mountpoint above it (a later mount over the same point wins)."""
    best: Mount | None = None
    for mount in mounts:
        if _inside(host_path, mount.mountpoint) and (best is None or len(mount.mountpoint) >= len(best.mountpoint)):
            best = mount
    return best


def default_places(
    classifier: Classifier, mounts: Sequence[Mount], directory: Callable[[str], bool | str]
) -> DefaultPlaces:
    """Where the checkpoint scan looks when nothing is configured: the places ``classifier``'s platform puts people's
    data (SEARCH_PLACES) where the mount they are on is ephemeral, then every data mount the classifier calls
    ephemeral (``_is_data_mount``), each with why; and the preset's places on this node that are passed over, with
    why not. ``directory(host_path)`` says whether a place is a directory to start at (``searchable_directory``
    below --path.rootfs); it is asked only of places on storage that answers locally. Never the whole root
    filesystem."""
    platform = classifier.platform
    roots: list[SearchRoot] = []
    passed: list[SearchRoot] = []
    for place in SEARCH_PLACES.get(platform, ()):
        mount = mount_holding(mounts, place.path)
        if mount is None:
            continue
        verdict = classifier.classify(mount)
        at_mountpoint = place.path == mount.mountpoint
        if not verdict.durability.ephemeral:
            if at_mountpoint:  # there, and durable; a directory on durable storage is not looked at (it may hang)
                passed.append(SearchRoot(place.path, f"{place.what}; {verdict.reason}"))
            continue
        if mount.stuck:
            passed.append(SearchRoot(place.path, f"{place.what}; its mount {mount.mountpoint} is stuck"))
            continue
        if not _answers_locally(mount):
            if at_mountpoint:
                passed.append(
                    SearchRoot(
                        place.path,
                        f"{place.what}; not searched by default: {verdict.reason}; {HOW_TO_ADD} to search it",
                    )
                )
            continue
        state = directory(place.path)
        if state is False:
            continue
        if isinstance(state, str):
            passed.append(SearchRoot(place.path, f"{place.what}; {state}"))
            continue
        word = _lost_word(verdict.durability)
        on = "" if platform == GENERIC else f" on {platform}"
        roots.append(SearchRoot(place.path, f"{place.what}, {word}{on}: {_storage_words(mount)}"))
    data_mounts = 0
    for mount in mounts:
        mp = mount.mountpoint
        if not _is_data_mount(mount) or any(_inside(mp, r.path) for r in roots):
            continue
        # A later mount over the same point hides this one: judge what is there now.
        if mount_holding(mounts, mp) is not mount:
            continue
        verdict = classifier.classify(mount)
        if not verdict.durability.ephemeral or directory(mp) is not True:
            continue
        if mount.fstype in VOLATILE_FSTYPES:
            what = f"an in-memory {mount.fstype} mount"
        else:
            what = f"a node-local {mount.fstype} mount on {mount.device}"
        if data_mounts >= MAX_DEFAULT_MOUNTS:
            passed.append(SearchRoot(mp, f"{what}; at most {MAX_DEFAULT_MOUNTS} mounts are searched by default"))
            continue
        data_mounts += 1
        roots.append(SearchRoot(mp, what))
    return DefaultPlaces(tuple(roots), tuple(passed[:MAX_PASSED_OVER]))
