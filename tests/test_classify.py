"""Durability classification: filesystem tables, platform presets, overrides, providers, platform detection, and
every visible mount of the gpu-node fixture."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storwatch.classify import Classifier, detect_platform
from storwatch.config import MountsConfig
from storwatch.paths import HostPaths
from storwatch.procfs.mountinfo import MountInfo
from storwatch.sources.mounts import PSEUDO_FSTYPES, MountSource, mount_of
from storwatch.vocabulary import (
    GENERIC,
    GRADIENT,
    TOGETHER_K8S,
    TOGETHER_SLURM,
    Durability,
    Evidence,
    EvidenceSource,
    Mount,
    Override,
    Verdict,
)
from tests.builders import mount

FIXTURES = Path(__file__).parent / "fixtures"
GPU_NODE_PROC = FIXTURES / "gpu-node" / "proc"

V, N, C, R = Durability.VOLATILE, Durability.NODE, Durability.CLUSTER, Durability.REGION


def classify(platform: str, m: Mount, overrides: tuple[Override, ...] = ()) -> Verdict:
    return Classifier(platform, overrides).classify(m)


def assert_reason(reason: str, *words: str) -> None:
    lowered = reason.lower()
    missing = [w for w in words if w.lower() not in lowered]
    assert not missing, f"reason {reason!r} does not mention {missing}"


# (mountpoint, fstype, device) -> class, evidence source, words the reason must contain
STORAGE = [
    pytest.param("/dev/shm", "tmpfs", "tmpfs", V, EvidenceSource.FILESYSTEM, ["tmpfs", "memory", "reboot"], id="tmpfs"),
    pytest.param("/mnt/ram", "ramfs", "ramfs", V, EvidenceSource.FILESYSTEM, ["ramfs", "memory"], id="ramfs"),
    pytest.param("/mnt/img", "ext4", "/dev/loop3", N, EvidenceSource.DEVICE,
                 ["loop device /dev/loop3", "file-backed", "lost with the node"], id="ext4-on-loop"),
    pytest.param("/", "ext4", "/dev/nvme0n1p1", N, EvidenceSource.DEVICE,
                 ["local block device /dev/nvme0n1p1", "lost with the node"], id="ext4-on-nvme"),
    pytest.param("/mnt/local-nvme", "xfs", "/dev/nvme1n1", N, EvidenceSource.DEVICE,
                 ["xfs", "/dev/nvme1n1", "lost with the node"], id="xfs-on-nvme"),
    pytest.param("/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/rootfs", "overlay", "overlay", N,
                 EvidenceSource.FILESYSTEM, ["overlay", "container", "this node"], id="overlay"),
    pytest.param("/scratch", "nfs", "10.0.0.5:/scratch", C, EvidenceSource.FILESYSTEM,
                 ["nfs", "shared network filesystem", "10.0.0.5:/scratch", "survives losing this node"], id="nfs"),
    pytest.param("/home", "nfs4", "10.0.0.5:/home", C, EvidenceSource.FILESYSTEM,
                 ["nfs4", "shared", "10.0.0.5:/home", "survives"], id="nfs4"),
    pytest.param("/mnt/cephfs", "ceph", "10.0.0.11:6789,10.0.0.12:6789:/volumes/csi", C, EvidenceSource.FILESYSTEM,
                 ["ceph", "shared", "survives"], id="cephfs"),
    pytest.param("/lustre", "lustre", "10.0.0.40@o2ib:/lustrefs", C, EvidenceSource.FILESYSTEM,
                 ["lustre", "10.0.0.40@o2ib:/lustrefs", "survives"], id="lustre"),
    pytest.param("/gpfs/fs1", "gpfs", "fs1", C, EvidenceSource.FILESYSTEM, ["gpfs", "shared"], id="gpfs"),
    pytest.param("/mnt/beegfs", "beegfs", "beegfs_nodev", C, EvidenceSource.FILESYSTEM, ["beegfs", "shared"],
                 id="beegfs"),
    pytest.param("/mnt/gluster", "glusterfs", "gluster1:/vol0", C, EvidenceSource.FILESYSTEM,
                 ["glusterfs", "gluster1:/vol0"], id="glusterfs"),
    pytest.param("/mnt/rbd", "ext4", "/dev/rbd0", C, EvidenceSource.DEVICE,
                 ["ceph rbd", "/dev/rbd0", "ceph cluster"], id="ext4-on-rbd"),
    pytest.param("/mnt/s3fs", "fuse.s3fs", "s3fs", R, EvidenceSource.FILESYSTEM,
                 ["object storage", "s3fs", "cluster"], id="fuse.s3fs"),
    pytest.param("/mnt/s3", "fuse.mountpoint-s3", "mountpoint-s3", R, EvidenceSource.FILESYSTEM,
                 ["object storage", "mountpoint-s3"], id="fuse.mountpoint-s3"),
    pytest.param("/mnt/gcs", "fuse.gcsfuse", "my-training-bucket", R, EvidenceSource.FILESYSTEM,
                 ["object storage", "gcsfuse"], id="fuse.gcsfuse"),
    pytest.param("/mnt/goofys", "fuse.goofys", "my-bucket", R, EvidenceSource.FILESYSTEM,
                 ["object storage", "goofys"], id="fuse.goofys"),
    pytest.param("/mnt/s3-datasets", "fuse", "mountpoint-s3", R, EvidenceSource.FILESYSTEM,
                 ["object storage", "mountpoint-s3"], id="plain-fuse-source-mountpoint-s3"),
    pytest.param("/mnt/juice", "fuse.juicefs", "JuiceFS:prod", C, EvidenceSource.FILESYSTEM,
                 ["shared filesystem through fuse", "juicefs"], id="fuse.juicefs"),
    pytest.param("/mnt/mystery", "fuse.storwatch", "storwatch-fusefs", N, EvidenceSource.FILESYSTEM,
                 ["fuse", "'storwatch'", "unknown", "lost with the node"], id="unknown-fuse"),
    pytest.param("/mnt/odd", "weirdfs", "none", N, EvidenceSource.FILESYSTEM,
                 ["'weirdfs'", "not a known shared one"], id="unknown-fstype"),
]  # fmt: skip


@pytest.mark.parametrize(("mountpoint", "fstype", "device", "expected", "source", "words"), STORAGE)
def test_storage_evidence(
    mountpoint: str,
    fstype: str,
    device: str,
    expected: Durability,
    source: EvidenceSource,
    words: list[str],
) -> None:
    verdict = classify(GENERIC, mount(mountpoint, fstype, device))
    assert verdict.durability is expected
    assert_reason(verdict.reason, *words)
    # Under the generic preset the filesystem (or device) is the only evidence, and it decided.
    assert len(verdict.evidence) == 1
    assert verdict.evidence[0].source is source
    assert verdict.evidence[0].durability is expected
    assert verdict.evidence[0].reason == verdict.reason


# platform, mount -> class, deciding source, words in the reason
PRESETS = [
    pytest.param(TOGETHER_K8S, mount("/home", "ext4", "/dev/nvme0n1p2"), N, EvidenceSource.PLATFORM,
                 ["together", "kubernetes", "local disk", "/home"], id="together-k8s-local-home"),
    pytest.param(TOGETHER_K8S, mount("/home/alice", "ext4", "/dev/nvme0n1p2"), N, EvidenceSource.PLATFORM,
                 ["together", "kubernetes"], id="together-k8s-under-home"),
    pytest.param(TOGETHER_K8S, mount("/home", "nfs4", "10.0.0.5:/home"), C, EvidenceSource.FILESYSTEM,
                 ["nfs4", "shared network filesystem"], id="together-k8s-nfs-home-stays-cluster"),
    pytest.param(TOGETHER_SLURM, mount("/home", "nfs4", "head-node:/home"), C, EvidenceSource.PLATFORM,
                 ["slurm", "nfs", "head node", "persists"], id="together-slurm-nfs-home"),
    pytest.param(TOGETHER_SLURM, mount("/home", "ext4", "/dev/nvme0n1p2"), N, EvidenceSource.DEVICE,
                 ["local block device /dev/nvme0n1p2"], id="together-slurm-local-home-is-not-the-nfs-rule"),
    pytest.param(GRADIENT, mount("/storage", "ext4", "/dev/vdb"), C, EvidenceSource.PLATFORM,
                 ["gradient", "/storage", "persistent"], id="gradient-storage"),
    pytest.param(GRADIENT, mount("/storage/team-a", "ext4", "/dev/vdb"), C, EvidenceSource.PLATFORM,
                 ["gradient", "/storage"], id="gradient-under-storage"),
    pytest.param(GRADIENT, mount("/storage2", "ext4", "/dev/vdb"), N, EvidenceSource.DEVICE,
                 ["local block device"], id="gradient-storage-prefix-needs-a-path-boundary"),
    pytest.param(GRADIENT, mount("/home/paperspace", "overlay", "overlay"), N, EvidenceSource.PLATFORM,
                 ["gradient", "/home/paperspace", "temporary workspace"], id="gradient-home-paperspace"),
    pytest.param(GRADIENT, mount("/artifacts", "nfs4", "10.1.0.9:/artifacts"), N, EvidenceSource.PLATFORM,
                 ["gradient", "/artifacts", "collected only when the run ends", "dies"], id="gradient-artifacts"),
    pytest.param(GRADIENT, mount("/datasets/imagenet", "fuse", "gradient-datasets"), R, EvidenceSource.PLATFORM,
                 ["gradient", "datasets", "object storage"], id="gradient-datasets"),
    pytest.param(GENERIC, mount("/home", "ext4", "/dev/nvme0n1p2"), N, EvidenceSource.DEVICE,
                 ["ext4", "local block device /dev/nvme0n1p2", "lost with the node"], id="generic-home-on-ext4"),
    pytest.param(GENERIC, mount("/storage", "ext4", "/dev/vdb"), N, EvidenceSource.DEVICE,
                 ["local block device /dev/vdb"], id="generic-has-no-gradient-rules"),
]  # fmt: skip


@pytest.mark.parametrize(("platform", "m", "expected", "decided_by", "words"), PRESETS)
def test_platform_presets(
    platform: str, m: Mount, expected: Durability, decided_by: EvidenceSource, words: list[str]
) -> None:
    verdict = classify(platform, m)
    assert verdict.durability is expected
    assert verdict.evidence[0].source is decided_by
    assert_reason(verdict.reason, *words)
    if decided_by is EvidenceSource.PLATFORM:
        # The weaker filesystem/device evidence is kept behind the platform's.
        assert len(verdict.evidence) == 2
        # ... and it is exactly what the filesystem and device say without a platform.
        assert verdict.evidence[1:] == classify(GENERIC, m).evidence
    else:
        assert [e.source for e in verdict.evidence] == [decided_by]


def test_platform_beats_filesystem_and_keeps_it_as_evidence() -> None:
    verdict = classify(GRADIENT, mount("/artifacts", "nfs4", "10.1.0.9:/artifacts"))
    assert verdict.durability is N
    assert [(e.source, e.durability) for e in verdict.evidence] == [
        (EvidenceSource.PLATFORM, N),
        (EvidenceSource.FILESYSTEM, C),
    ]
    assert_reason(verdict.evidence[1].reason, "nfs4", "10.1.0.9:/artifacts")


def test_override_exact_path_beats_everything() -> None:
    ov = Override("/mnt/local-nvme", C, "replicated to the storage cluster by DRBD")
    verdict = classify(GENERIC, mount("/mnt/local-nvme", "xfs", "/dev/nvme1n1"), (ov,))
    assert verdict.durability is C
    assert verdict.reason == "replicated to the storage cluster by DRBD"
    assert [(e.source, e.durability) for e in verdict.evidence] == [
        (EvidenceSource.OVERRIDE, C),
        (EvidenceSource.DEVICE, N),
    ]
    assert_reason(verdict.evidence[1].reason, "/dev/nvme1n1")
    # An exact path does not match a different mount below it.
    other = classify(GENERIC, mount("/mnt/local-nvme/sub", "xfs", "/dev/nvme1n1"), (ov,))
    assert other.durability is N
    assert [e.source for e in other.evidence] == [EvidenceSource.DEVICE]


def test_override_glob_matches_and_gets_a_default_reason() -> None:
    ov = Override("/var/lib/kubelet/pods/*/volumes/kubernetes.io~empty-dir/*", V)
    m = mount("/var/lib/kubelet/pods/81742e8f/volumes/kubernetes.io~empty-dir/cache", "xfs", "/dev/nvme1n1")
    verdict = classify(TOGETHER_K8S, m, (ov,))
    assert verdict.durability is V
    assert verdict.reason == "set by the configuration for /var/lib/kubelet/pods/*/volumes/kubernetes.io~empty-dir/*"
    assert [e.source for e in verdict.evidence] == [EvidenceSource.OVERRIDE, EvidenceSource.DEVICE]
    unmatched = classify(TOGETHER_K8S, mount("/var/lib/kubelet/pods/x/volumes/other/y", "xfs", "/dev/nvme1n1"), (ov,))
    assert unmatched.durability is N


def test_override_beats_platform_and_all_evidence_is_ordered_strongest_first() -> None:
    ov = Override("/storage", N, "this team's /storage is a local disk on the test rig")
    verdict = classify(GRADIENT, mount("/storage", "nfs4", "10.1.0.9:/storage"), (ov,))
    assert verdict.durability is N
    assert verdict.reason == "this team's /storage is a local disk on the test rig"
    assert [(e.source, e.durability) for e in verdict.evidence] == [
        (EvidenceSource.OVERRIDE, N),
        (EvidenceSource.PLATFORM, C),
        (EvidenceSource.FILESYSTEM, C),
    ]
    sources = [e.source for e in verdict.evidence]
    assert sources == sorted(sources, reverse=True)


def test_first_matching_override_wins() -> None:
    first = Override("/mnt/s3*", C, "first rule")
    second = Override("/mnt/s3-datasets", V, "second rule")
    verdict = classify(GENERIC, mount("/mnt/s3-datasets", "fuse", "mountpoint-s3"), (first, second))
    assert verdict.reason == "first rule"
    assert [e.reason for e in verdict.evidence if e.source is EvidenceSource.OVERRIDE] == ["first rule"]


def kube_provider(m: Mount) -> Evidence | None:
    """Stands in for the Kubernetes enrichment: the PVC behind /home is a network CSI volume."""
    if m.mountpoint == "/home":
        return Evidence(EvidenceSource.KUBERNETES, C, "PVC team/home is bound to a CephFS CSI volume")
    return None


def test_provider_beats_platform() -> None:
    classifier = Classifier(TOGETHER_K8S)
    classifier.add_provider(kube_provider)
    verdict = classifier.classify(mount("/home", "ext4", "/dev/nvme0n1p2"))
    assert verdict.durability is C
    assert verdict.reason == "PVC team/home is bound to a CephFS CSI volume"
    assert [(e.source, e.durability) for e in verdict.evidence] == [
        (EvidenceSource.KUBERNETES, C),
        (EvidenceSource.PLATFORM, N),
        (EvidenceSource.DEVICE, N),
    ]
    # A provider with nothing to say adds no evidence.
    other = classifier.classify(mount("/mnt/local-nvme", "xfs", "/dev/nvme1n1"))
    assert [e.source for e in other.evidence] == [EvidenceSource.DEVICE]


def test_override_beats_provider() -> None:
    classifier = Classifier(TOGETHER_K8S, (Override("/home", V, "wiped by our node image on every boot"),))
    classifier.add_provider(kube_provider)
    verdict = classifier.classify(mount("/home", "ext4", "/dev/nvme0n1p2"))
    assert verdict.durability is V
    assert verdict.reason == "wiped by our node image on every boot"
    assert [e.source for e in verdict.evidence] == [
        EvidenceSource.OVERRIDE,
        EvidenceSource.KUBERNETES,
        EvidenceSource.PLATFORM,
        EvidenceSource.DEVICE,
    ]


def test_unknown_platform_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown platform 'aws'"):
        Classifier("aws")


# -- platform detection on host trees


def _tree(root: Path, dirs: tuple[str, ...] = (), files: tuple[str, ...] = ()) -> HostPaths:
    for d in dirs:
        (root / d).mkdir(parents=True)
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("ClusterName=test\n")
    return HostPaths(rootfs=str(root))


DETECT = [
    pytest.param(("storage", "artifacts", "notebooks"), (), {}, GRADIENT, ["/storage", "/artifacts"], id="gradient"),
    pytest.param(("storage",), (), {}, GENERIC, ["no platform"], id="storage-alone-is-not-gradient"),
    pytest.param((), ("etc/slurm/slurm.conf",), {}, TOGETHER_SLURM, ["/etc/slurm/slurm.conf"], id="slurm-conf"),
    pytest.param((), ("etc/slurm-llnl/slurm.conf",), {}, TOGETHER_SLURM, ["/etc/slurm-llnl/slurm.conf"],
                 id="slurm-llnl-conf"),
    pytest.param((), (), {"SLURM_JOB_ID": "4242", "PATH": "/usr/bin"}, TOGETHER_SLURM, ["SLURM_JOB_ID"],
                 id="slurm-env"),
    pytest.param((), (), {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, TOGETHER_K8S, ["KUBERNETES_SERVICE_HOST"],
                 id="kubernetes-env"),
    pytest.param((), (), {"KUBERNETES_SERVICE_HOST": ""}, GENERIC, ["no platform"], id="empty-kubernetes-env"),
    pytest.param(("var/lib/kubelet",), (), {}, TOGETHER_K8S, ["/var/lib/kubelet"], id="kubelet-dir"),
    pytest.param((), (), {}, GENERIC, ["no platform layout detected"], id="nothing"),
    pytest.param(("storage", "artifacts", "var/lib/kubelet"), (), {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, GRADIENT,
                 ["gradient"], id="gradient-layout-beats-kubernetes"),
    pytest.param(("var/lib/kubelet",), ("etc/slurm/slurm.conf",), {}, TOGETHER_SLURM, ["slurm"],
                 id="slurm-beats-kubelet"),
]  # fmt: skip


@pytest.mark.parametrize(("dirs", "files", "environ", "expected", "words"), DETECT)
def test_detect_platform(
    tmp_path: Path,
    dirs: tuple[str, ...],
    files: tuple[str, ...],
    environ: dict[str, str],
    expected: str,
    words: list[str],
) -> None:
    platform = detect_platform(_tree(tmp_path, dirs, files), environ)
    assert platform.name == expected
    assert_reason(platform.detected_by, *words)


def test_detect_platform_looks_under_rootfs_not_at_the_real_root(tmp_path: Path) -> None:
    # A tree with nothing in it is generic even if this machine has /var/lib/kubelet or /etc/slurm.
    assert detect_platform(HostPaths(rootfs=str(tmp_path)), {}).name == GENERIC
    (tmp_path / "var" / "lib" / "kubelet").mkdir(parents=True)
    assert detect_platform(HostPaths(rootfs=str(tmp_path)), {}).name == TOGETHER_K8S


# -- the gpu-node fixture, as the mount source sees it


def as_mount(info: MountInfo) -> Mount:
    return mount_of(info)


POD_A = "/var/lib/kubelet/pods/81742e8f-be31-4219-bac3-e2ed48dd4123/volumes"
POD_B = "/var/lib/kubelet/pods/1f9e5735-b8c7-40f1-ac81-51a60e82c99d/volumes"
TASKS = "/run/containerd/io.containerd.runtime.v2.task/k8s.io"

GPU_NODE_EXPECTED: dict[str, Durability] = {
    "/": N,
    "/run": V,
    "/dev/shm": V,
    "/run/lock": V,
    "/snap/core20/2318": N,
    "/boot/efi": N,
    "/mnt/local-nvme": N,
    "/home": C,
    "/lustre": C,
    "/mnt/s3-datasets": R,
    "/mnt/s3fs-checkpoints": R,
    "/run/nvidia/driver": N,
    "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/"
    "6c7792a52bf398e13a7bcd15c1adff75760fc158971f45fffe8720519e149e73/shm": V,
    f"{TASKS}/6c7792a52bf398e13a7bcd15c1adff75760fc158971f45fffe8720519e149e73/rootfs": N,
    f"{POD_A}/kubernetes.io~projected/kube-api-access-q7m4z": V,
    f"{POD_A}/kubernetes.io~empty-dir/dshm": V,
    f"{POD_A}/kubernetes.io~empty-dir/cache": N,
    f"{POD_A}/kubernetes.io~csi/pvc-07397231-7729-49b7-8e49-313542c11b05/mount": C,
    f"{TASKS}/60be3d191ea0c27649cf12cafb900f5199b5cecfc46c097b2cb04339cbc74cb7/rootfs": N,
    f"{TASKS}/c8a3c5e096771abf96627d4a0cbc913ada3617c4815338bf4c35001f9c3f1e1c/rootfs": N,
    "/var/lib/kubelet/plugins/kubernetes.io/csi/rbd.csi.ceph.com/"
    "3de678634ed640a4caedd96eed7ae285fc60083e19cfbf2b3c2d9cadd4d5fb77/globalmount/"
    "0001-0009-rook-ceph-0000000000000002-9c1f0e7a-2b3d-11ef-8a41-0a58a9feac02": C,
    f"{POD_B}/kubernetes.io~csi/pvc-b60b439b-5333-4d96-b219-7c3ee460b588/mount": C,
    f"{POD_B}/kubernetes.io~projected/kube-api-access-2nxv8": V,
    f"{TASKS}/c8ac1c51aeb95c82ccec403d0979e1e3e3a6447f510a75df8cf26f5c4de90706/rootfs": N,
    "/mnt/local-nvme/shared data": N,
    "/mnt/local-nvme/exp\ttabbed": N,
    "/mnt/local-nvme/users/CORP\\alice": N,
    os.fsdecode(b"/mnt/local-nvme/users/jos\xe9"): N,
}


class NoCalls:
    """visible_mounts makes no statvfs calls; this fails the test if anything tries."""

    max_inflight = 16

    def call_many(self, op: str, requests: object, timeout: float) -> dict[str, object]:
        raise AssertionError("visible_mounts must not call statvfs")

    def close(self) -> None:
        pass


@pytest.fixture
def gpu_node_visible() -> list[MountInfo]:
    source = MountSource(HostPaths(procfs=str(GPU_NODE_PROC)), MountsConfig(), calls=NoCalls())  # type: ignore[arg-type]
    return source.visible_mounts(source.read_mountinfo())


def test_gpu_node_every_visible_mount_gets_its_class(gpu_node_visible: list[MountInfo]) -> None:
    classifier = Classifier(TOGETHER_K8S)
    got = {info.mountpoint: classifier.classify(as_mount(info)).durability for info in gpu_node_visible}
    assert got == GPU_NODE_EXPECTED
    assert len(gpu_node_visible) == len(GPU_NODE_EXPECTED) == 28


def test_gpu_node_pseudo_filesystems_are_skipped(gpu_node_visible: list[MountInfo]) -> None:
    fstypes = {info.fstype for info in gpu_node_visible}
    assert not fstypes & PSEUDO_FSTYPES
    points = {info.mountpoint for info in gpu_node_visible}
    for pseudo in ("/proc", "/sys", "/dev", "/dev/pts", "/sys/fs/cgroup", "/sys/fs/bpf", "/dev/mqueue",
                   "/sys/kernel/debug", "/sys/kernel/tracing", "/dev/hugepages", "/proc/sys/fs/binfmt_misc",
                   "/run/rpc_pipefs", "/run/netns/cni-2f1c8a9e-7d3b-4e5f-a1b2-c3d4e5f6a7b8"):  # fmt: skip
        assert pseudo not in points
    # tmpfs, overlay and FUSE hold user data and are kept on purpose.
    assert {"tmpfs", "overlay", "fuse", "fuse.s3fs"} <= fstypes
    assert {"ext4", "xfs", "nfs4", "lustre", "vfat", "squashfs"} <= fstypes


def test_gpu_node_stacked_mountpoint_appears_once_as_the_later_mount(gpu_node_visible: list[MountInfo]) -> None:
    homes = [info for info in gpu_node_visible if info.mountpoint == "/home"]
    assert len(homes) == 1
    assert (homes[0].mount_id, homes[0].fstype, homes[0].source) == (410, "nfs4", "10.0.0.5:/home")
    assert len({info.mountpoint for info in gpu_node_visible}) == len(gpu_node_visible)


def test_gpu_node_reasons_follow_the_evidence(gpu_node_visible: list[MountInfo]) -> None:
    classifier = Classifier(TOGETHER_K8S)
    verdicts = {info.mountpoint: classifier.classify(as_mount(info)) for info in gpu_node_visible}
    assert_reason(verdicts["/home"].reason, "nfs4", "10.0.0.5:/home")
    assert_reason(verdicts[f"{POD_A}/kubernetes.io~empty-dir/dshm"].reason, "memory")
    assert_reason(verdicts[f"{POD_A}/kubernetes.io~empty-dir/cache"].reason, "/dev/nvme1n1")
    assert_reason(verdicts["/mnt/s3-datasets"].reason, "object storage", "mountpoint-s3")
    assert_reason(verdicts[f"{POD_B}/kubernetes.io~csi/pvc-b60b439b-5333-4d96-b219-7c3ee460b588/mount"].reason,
                  "ceph rbd", "/dev/rbd0")  # fmt: skip
    assert_reason(verdicts["/snap/core20/2318"].reason, "loop device /dev/loop0")
