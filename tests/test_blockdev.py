"""Block device topology on the gpu-node sysfs fixture, and on this machine's /sys for a real loop mount.

The fixture's devices: nvme0n1 (partitions p15 /boot/efi, p1 /, p2 the ext4 under the NFS /home), nvme1n1 (whole
disk, /mnt/local-nvme), md127 (RAID0 of nvme2n1 and nvme3n1), dm-0 ("scratch-cache", an LVM volume on md127 and
nvme4n1p1), rbd0 (Ceph RBD), loop0 (the core20 snap, a file on the root disk), loop1 (an image on the data disk) and
loop2 (not bound to any file).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any

import pytest

from storwatch.calls.blocking import CallOutcome
from storwatch.config import MountsConfig
from storwatch.paths import HostPaths
from storwatch.sources.blockdev import BlockDevice, BlockDevices
from storwatch.sources.mounts import MountSource
from storwatch.vocabulary import MountDevice
from tests.realmounts import find_mount, loop_ext4_mount

GPU_NODE = Path(__file__).parent / "fixtures" / "gpu-node"
SYSFS = GPU_NODE / "sys"
SNAP = "/var/lib/snapd/snaps/core20_2318.snap"


class NoStatvfs:
    """Stands in for ``BlockingCalls``: the fixture's mountpoints are not mounts here, and usage is not under test."""

    max_inflight = 16

    def call_many(
        self, op: str, requests: Mapping[str, Sequence[bytes | str]], timeout: float
    ) -> dict[str, CallOutcome]:
        return {key: CallOutcome(error="not asked") for key in requests}

    def close(self) -> None:
        pass


@pytest.fixture
def devices(tmp_path: Path) -> BlockDevices:
    # An empty host root: /dev paths must never be resolved through this machine's /dev.
    return BlockDevices(HostPaths(procfs=str(GPU_NODE / "proc"), sysfs=str(SYSFS), rootfs=str(tmp_path)))


@pytest.mark.parametrize(
    ("major", "minor", "expected"),
    [
        (259, 0, BlockDevice("nvme0n1", 259, 0, "disk")),
        (259, 1, BlockDevice("nvme0n1p15", 259, 1, "partition", parent="nvme0n1")),
        (259, 2, BlockDevice("nvme0n1p1", 259, 2, "partition", parent="nvme0n1")),
        (259, 3, BlockDevice("nvme0n1p2", 259, 3, "partition", parent="nvme0n1")),
        (259, 4, BlockDevice("nvme1n1", 259, 4, "disk")),
        (259, 8, BlockDevice("nvme4n1p1", 259, 8, "partition", parent="nvme4n1")),
        (9, 127, BlockDevice("md127", 9, 127, "md", slaves=("nvme2n1", "nvme3n1"))),
        (253, 0, BlockDevice("dm-0", 253, 0, "dm", slaves=("md127", "nvme4n1p1"), dm_name="scratch-cache")),
        (252, 0, BlockDevice("rbd0", 252, 0, "disk")),
        (7, 0, BlockDevice("loop0", 7, 0, "loop", backing_file=SNAP)),
        (7, 1, BlockDevice("loop1", 7, 1, "loop", backing_file="/mnt/local-nvme/images/scratch.img")),
        (7, 2, BlockDevice("loop2", 7, 2, "loop")),
    ],
    ids=lambda v: f"{v}" if isinstance(v, int) else v.name,
)
def test_by_number(devices: BlockDevices, major: int, minor: int, expected: BlockDevice) -> None:
    assert devices.by_number(major, minor) == expected


@pytest.mark.parametrize(
    ("major", "minor"),
    [(8, 0), (259, 9), (7, 8), (253, 1), (0, 0)],
    ids=["sda-absent", "nvme-beyond-last", "loop8", "dm-1", "anonymous-0:0"],
)
def test_unknown_numbers_are_none(devices: BlockDevices, major: int, minor: int) -> None:
    assert devices.by_number(major, minor) is None


def test_by_name_agrees_with_by_number_and_knows_only_kernel_names(devices: BlockDevices) -> None:
    for name in os.listdir(SYSFS / "class" / "block"):
        device = devices.by_name(name)
        assert device is not None, name
        assert device.name == name
        assert devices.by_number(device.major, device.minor) == device
    assert devices.by_name("sda") is None
    assert devices.by_name("scratch-cache") is None  # a /dev/mapper name, not a kernel name


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("/dev/nvme0n1p1", "nvme0n1p1"),
        ("/dev/nvme1n1", "nvme1n1"),
        ("/dev/md127", "md127"),
        ("/dev/rbd0", "rbd0"),
        ("/dev/loop0", "loop0"),
        ("/dev/mapper/scratch-cache", "dm-0"),
        ("/dev/mapper/scratch-other", None),
        ("/dev/sdz9", None),
        ("10.0.0.5:/home", None),
        ("tmpfs", None),
        ("overlay", None),
    ],
)
def test_by_source(devices: BlockDevices, source: str, expected: str | None) -> None:
    device = devices.by_source(source)
    assert (device.name if device is not None else None) == expected


def test_by_source_follows_dev_disk_links_inside_the_host_root(tmp_path: Path) -> None:
    rootfs = tmp_path / "host"
    by_uuid = rootfs / "dev" / "disk" / "by-uuid"
    by_uuid.mkdir(parents=True)
    # udev's links are relative, so they resolve inside the host root wherever it is mounted.
    os.symlink("../../nvme0n1p1", by_uuid / "0b1e6c5a-3f9d-4e2a-9c1d-7f2e4a8b6d10")
    devices = BlockDevices(HostPaths(sysfs=str(SYSFS), rootfs=str(rootfs)))
    device = devices.by_source("/dev/disk/by-uuid/0b1e6c5a-3f9d-4e2a-9c1d-7f2e4a8b6d10")
    assert device is not None and device.name == "nvme0n1p1"
    assert devices.by_source("/dev/disk/by-uuid/not-there") is None


@pytest.mark.parametrize(
    ("name", "physical"),
    [
        ("nvme0n1p1", ("nvme0n1",)),
        ("nvme0n1p15", ("nvme0n1",)),
        ("nvme0n1", ("nvme0n1",)),
        ("md127", ("nvme2n1", "nvme3n1")),
        # dm-0 -> md127 -> nvme2n1, nvme3n1; dm-0 -> nvme4n1p1 -> nvme4n1
        ("dm-0", ("nvme2n1", "nvme3n1", "nvme4n1")),
        ("rbd0", ("rbd0",)),
        ("loop0", ("loop0",)),
    ],
)
def test_physical_goes_down_to_whole_disks(devices: BlockDevices, name: str, physical: tuple[str, ...]) -> None:
    device = devices.by_name(name)
    assert device is not None
    assert tuple(d.name for d in devices.physical(device)) == physical


def _sysfs_device(sysfs: Path, path: str, dev: str, slaves: tuple[str, ...] = (), **files: str) -> None:
    """A device directory under ``sysfs/path`` with its dev file and links, as the kernel lays them out."""
    directory = sysfs / path
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "dev").write_text(f"{dev}\n")
    for name, text in files.items():
        (directory / name).write_text(f"{text}\n")
    links = [sysfs / "class" / "block" / directory.name, sysfs / "dev" / "block" / dev]
    (directory / "slaves").mkdir()
    for slave in slaves:
        links.append(directory / "slaves" / os.path.basename(slave))
    for link, target in zip(links, [path, path, *slaves], strict=True):
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(sysfs / target, link.parent), link)


def test_physical_of_a_partition_on_a_raid_reaches_the_raid_members(tmp_path: Path) -> None:
    """md127p1 (a partition of a RAID1 of sda and sdb) is built on sda and sdb, not on md127 itself."""
    sysfs = tmp_path / "sys"
    pci = "devices/pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0/block"
    _sysfs_device(sysfs, f"{pci}/sda", "8:0")
    _sysfs_device(sysfs, f"{pci}/sdb", "8:16")
    _sysfs_device(sysfs, "devices/virtual/block/md127", "9:127", slaves=(f"{pci}/sda", f"{pci}/sdb"))
    _sysfs_device(sysfs, "devices/virtual/block/md127/md127p1", "259:0", partition="1")
    devices = BlockDevices(HostPaths(sysfs=str(sysfs)))
    part = devices.by_name("md127p1")
    assert part == BlockDevice("md127p1", 259, 0, "partition", parent="md127")
    assert tuple(d.name for d in devices.physical(part)) == ("sda", "sdb")
    mount = devices.for_mount(259, 0, "/dev/md127p1")
    assert mount == MountDevice("md127p1", ("sda", "sdb"), partition=True)


def test_a_slave_cycle_never_hangs(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    _sysfs_device(sysfs, "devices/virtual/block/dm-0", "253:0", slaves=("devices/virtual/block/dm-1",))
    _sysfs_device(sysfs, "devices/virtual/block/dm-1", "253:1", slaves=("devices/virtual/block/dm-0",))
    devices = BlockDevices(HostPaths(sysfs=str(sysfs)))
    dm0 = devices.by_name("dm-0")
    assert dm0 is not None and dm0.slaves == ("dm-1",)
    assert {d.name for d in devices.physical(dm0)} <= {"dm-0", "dm-1"}


@pytest.mark.parametrize(
    ("major", "minor", "source", "expected"),
    [
        (259, 2, "/dev/nvme0n1p1", MountDevice("nvme0n1p1", ("nvme0n1",), partition=True)),
        (259, 1, "/dev/nvme0n1p15", MountDevice("nvme0n1p15", ("nvme0n1",), partition=True)),
        (259, 4, "/dev/nvme1n1", MountDevice("nvme1n1", ("nvme1n1",))),
        (252, 0, "/dev/rbd0", MountDevice("rbd0", ("rbd0",))),
        (7, 0, "/dev/loop0", MountDevice("loop0", ("loop0",), SNAP)),
        (253, 0, "/dev/mapper/scratch-cache", MountDevice("dm-0", ("nvme2n1", "nvme3n1", "nvme4n1"))),
        # btrfs and others report an anonymous device (0:N): found through the source instead.
        (0, 45, "/dev/mapper/scratch-cache", MountDevice("dm-0", ("nvme2n1", "nvme3n1", "nvme4n1"))),
        (0, 46, "/dev/nvme1n1", MountDevice("nvme1n1", ("nvme1n1",))),
        # A number sysfs does not know, with a source that names a device: the source decides.
        (8, 1, "/dev/nvme0n1p1", MountDevice("nvme0n1p1", ("nvme0n1",), partition=True)),
        (8, 1, "/dev/sda1", None),
        (0, 52, "10.0.0.5:/home", None),
    ],
)
def test_for_mount(devices: BlockDevices, major: int, minor: int, source: str, expected: MountDevice | None) -> None:
    assert devices.for_mount(major, minor, source) == expected


def test_every_block_mount_of_the_fixture_resolves(tmp_path: Path) -> None:
    paths = HostPaths(procfs=str(GPU_NODE / "proc"), sysfs=str(SYSFS), rootfs=str(tmp_path))
    mounts = MountSource(paths, MountsConfig(), calls=NoStatvfs()).collect()  # type: ignore[arg-type]
    blocks = {m.mountpoint: m.block for m in mounts if m.block is not None}
    nvme1n1 = MountDevice("nvme1n1", ("nvme1n1",))
    rbd0 = MountDevice("rbd0", ("rbd0",))
    pod_a = "/var/lib/kubelet/pods/81742e8f-be31-4219-bac3-e2ed48dd4123/volumes"
    assert blocks == {
        "/": MountDevice("nvme0n1p1", ("nvme0n1",), partition=True),
        "/snap/core20/2318": MountDevice("loop0", ("loop0",), SNAP),
        "/boot/efi": MountDevice("nvme0n1p15", ("nvme0n1",), partition=True),
        "/mnt/local-nvme": nvme1n1,
        f"{pod_a}/kubernetes.io~empty-dir/cache": nvme1n1,
        "/var/lib/kubelet/plugins/kubernetes.io/csi/rbd.csi.ceph.com/3de678634ed640a4caedd96eed7ae285fc60083e19cfbf2b3"
        "c2d9cadd4d5fb77/globalmount/0001-0009-rook-ceph-0000000000000002-9c1f0e7a-2b3d-11ef-8a41-0a58a9feac02": rbd0,
        "/var/lib/kubelet/pods/1f9e5735-b8c7-40f1-ac81-51a60e82c99d/volumes/kubernetes.io~csi/"
        "pvc-b60b439b-5333-4d96-b219-7c3ee460b588/mount": rbd0,
        "/mnt/local-nvme/shared data": nvme1n1,
        "/mnt/local-nvme/exp\ttabbed": nvme1n1,
        "/mnt/local-nvme/users/CORP\\alice": nvme1n1,
        os.fsdecode(b"/mnt/local-nvme/users/jos\xe9"): nvme1n1,
    }
    # Network, memory and overlay filesystems have no block device.
    by_point = {m.mountpoint: m for m in mounts}
    for mp in ("/home", f"{pod_a}/kubernetes.io~csi/pvc-07397231-7729-49b7-8e49-313542c11b05/mount", "/run",
               "/lustre", "/mnt/s3-datasets", "/run/nvidia/driver"):  # fmt: skip
        assert by_point[mp].block is None, mp


def test_a_missing_sysfs_leaves_mounts_without_devices(tmp_path: Path) -> None:
    devices = BlockDevices(HostPaths(sysfs=str(tmp_path / "no-sys"), rootfs=str(tmp_path)))
    assert devices.by_number(259, 2) is None
    assert devices.by_source("/dev/mapper/scratch-cache") is None
    assert devices.for_mount(259, 2, "/dev/nvme0n1p1") is None


# -- a real loop device, through this machine's /sys


@pytest.mark.realpart
def test_real_loop_ext4_mount_resolves_to_its_loop_device_and_image(
    tmp_path: Path, real_mounts: Callable[[ContextManager[Any]], Any]
) -> None:
    lm = real_mounts(loop_ext4_mount(tmp_path / "ext4", size_mb=16))
    entry = find_mount(lm.mountpoint)
    assert entry is not None
    st = os.stat(lm.mountpoint)
    assert (entry.major, entry.minor) == (os.major(st.st_dev), os.minor(st.st_dev))
    devices = BlockDevices(HostPaths())

    loop = devices.by_number(entry.major, entry.minor)
    assert loop is not None
    assert (loop.name, loop.kind) == (lm.loop_name, "loop")
    assert loop.backing_file == os.path.realpath(lm.image)
    assert devices.by_source(lm.loop_device) == loop

    mount = devices.for_mount(entry.major, entry.minor, entry.source)
    assert mount == MountDevice(lm.loop_name, (lm.loop_name,), os.path.realpath(lm.image))
