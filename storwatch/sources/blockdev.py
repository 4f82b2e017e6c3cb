"""Block device topology from sysfs: which kernel device backs a mount, and what that device is built on.

A mount's major:minor (mountinfo) names its block device in /sys/dev/block. From there: a partition's parent is its
whole disk; a device-mapper or md device is built on the devices in its ``slaves/``; a loop device reads and writes
a backing file (``loop/backing_file``), which itself lives on some other mount.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from storwatch.paths import HostPaths
from storwatch.vocabulary import MountDevice


@dataclass(frozen=True)
class BlockDevice:
    name: str
    """Kernel name as in /proc/diskstats: sda1, nvme0n1p2, dm-0, md127, loop3."""
    major: int
    minor: int
    kind: str
    """disk, partition, dm, md or loop."""
    parent: str | None = None
    """The whole disk a partition is on."""
    slaves: tuple[str, ...] = ()
    """The devices a dm or md device is built on."""
    backing_file: str | None = None
    """For a loop device: the file it reads and writes, as the kernel names it."""
    dm_name: str | None = None
    """For a device-mapper device: its name under /dev/mapper."""


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read().strip()
    except OSError:
        return None


class BlockDevices:
    def __init__(self, paths: HostPaths) -> None:
        self.paths = paths

    def _class_dir(self, name: str) -> str:
        return self.paths.sys("class", "block", name)

    def by_name(self, name: str) -> BlockDevice | None:
        base = self._class_dir(name)
        dev = _read(os.path.join(base, "dev"))
        if dev is None:
            return None
        major_s, _, minor_s = dev.partition(":")
        try:
            major, minor = int(major_s), int(minor_s)
        except ValueError:
            return None
        try:
            slaves = tuple(sorted(os.listdir(os.path.join(base, "slaves"))))
        except OSError:
            slaves = ()
        if os.path.exists(os.path.join(base, "partition")):
            # /sys/class/block/sda1 -> .../block/sda/sda1: the parent directory is the whole disk.
            parent = os.path.basename(os.path.dirname(os.path.realpath(base)))
            return BlockDevice(name, major, minor, "partition", parent=parent)
        if name.startswith("loop"):
            backing = _read(os.path.join(base, "loop", "backing_file"))
            return BlockDevice(name, major, minor, "loop", backing_file=backing)
        if name.startswith("dm-"):
            return BlockDevice(name, major, minor, "dm", slaves=slaves, dm_name=_read(os.path.join(base, "dm", "name")))
        if name.startswith("md"):
            return BlockDevice(name, major, minor, "md", slaves=slaves)
        return BlockDevice(name, major, minor, "disk", slaves=slaves)

    def by_number(self, major: int, minor: int) -> BlockDevice | None:
        link = self.paths.sys("dev", "block", f"{major}:{minor}")
        try:
            target = os.readlink(link)
        except OSError:
            return None
        return self.by_name(os.path.basename(target))

    def by_source(self, source: str) -> BlockDevice | None:
        """A mount source such as /dev/sda1, /dev/mapper/vg-data or /dev/disk/by-uuid/..., resolved on the host."""
        if not source.startswith("/dev/"):
            return None
        if source.startswith("/dev/mapper/"):
            wanted = source[len("/dev/mapper/") :]
            try:
                names = os.listdir(self.paths.sys("class", "block"))
            except OSError:
                return None
            for name in names:
                if name.startswith("dm-") and _read(os.path.join(self._class_dir(name), "dm", "name")) == wanted:
                    return self.by_name(name)
            return None
        # /dev/disk/by-*/ links are relative to the host's /dev: resolve inside the host root.
        real = os.path.realpath(self.paths.root(source))
        return self.by_name(os.path.basename(real))

    def physical(self, device: BlockDevice, _depth: int = 0) -> tuple[BlockDevice, ...]:
        """The devices at the bottom of the stack under ``device`` (itself for a plain disk or loop device)."""
        if _depth > 16:  # a cycle would be a sysfs bug; never loop on it
            return (device,)
        if device.kind == "partition" and device.parent:
            parent = self.by_name(device.parent)
            # A partition of an md, dm or loop device sits on that device's whole stack.
            return self.physical(parent, _depth + 1) if parent is not None else (device,)
        if device.slaves:
            found: list[BlockDevice] = []
            for name in device.slaves:
                slave = self.by_name(name)
                if slave is not None:
                    found.extend(d for d in self.physical(slave, _depth + 1) if d not in found)
            return tuple(found) or (device,)
        return (device,)

    def for_mount(self, major: int, minor: int, source: str) -> MountDevice | None:
        """Resolve a mount by its st_dev, falling back to its source path (btrfs and others use anonymous devices)."""
        device = self.by_number(major, minor) if major != 0 else None
        if device is None:
            device = self.by_source(source)
        if device is None:
            return None
        bottom = self.physical(device)
        backing = next((d.backing_file for d in bottom if d.kind == "loop" and d.backing_file), None)
        return MountDevice(device.name, tuple(d.name for d in bottom), backing, device.kind == "partition")
