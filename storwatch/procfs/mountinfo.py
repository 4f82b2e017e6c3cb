"""Parse /proc/<pid>/mountinfo (Documentation/filesystems/proc.rst, "3.5 /proc/<pid>/mountinfo").

A line is: ``ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS``.
Paths are octal-escaped by the kernel (space ``\\040``, tab ``\\011``, newline ``\\012``, backslash ``\\134``) and may
hold bytes that are not UTF-8; they are decoded with ``surrogateescape`` so that ``os.fsencode`` gives back the exact
bytes for system calls.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from storwatch.procfs import LineError

_OCTAL = re.compile(rb"\\([0-7]{3})")


@dataclass(frozen=True)
class MountInfo:
    mount_id: int
    """Unique ID of the mount (may be reused after umount)."""
    parent_id: int
    """ID of the parent mount (or of itself for the root of this mount namespace's tree)."""
    major: int
    """st_dev major of files on this filesystem."""
    minor: int
    """st_dev minor of files on this filesystem."""
    root: str
    """Path of the directory in the filesystem that forms the root of this mount (not "/" for bind mounts)."""
    mountpoint: str
    """Mount point relative to the process's root."""
    mount_options: tuple[str, ...]
    """Per-mount options (ro, nosuid, relatime, ...)."""
    optional_fields: tuple[str, ...]
    """Propagation tags such as shared:N, master:N, propagate_from:N, unbindable."""
    fstype: str
    """Filesystem type as ``type[.subtype]`` (e.g. ``fuse.s3fs``)."""
    source: str
    """Filesystem-specific source (a device path, ``server:/export``, or a name such as ``tmpfs``)."""
    super_options: tuple[str, ...]
    """Per-superblock options (the filesystem's own mount options)."""

    @property
    def readonly(self) -> bool:
        return "ro" in self.mount_options or "ro" in self.super_options

    @property
    def device_number(self) -> str:
        return f"{self.major}:{self.minor}"


class MountInfoError(LineError):
    """A line that is not a valid mountinfo record; ``lineno`` is 1-based."""


def unescape(field: bytes) -> str:
    """Undo the kernel's octal escapes and decode as the filesystem encoding would (surrogateescape)."""
    raw = _OCTAL.sub(lambda m: bytes((int(m.group(1), 8) & 0xFF,)), field)
    return os.fsdecode(raw)


def parse_line(line: bytes, lineno: int = 1) -> MountInfo:
    # The kernel separates fields with exactly one space and escapes only space, tab, newline and backslash: a path
    # may hold a raw \r, \v or \f, and a source given as "" prints as an empty field ("- tmpfs  rw"). Splitting on
    # any whitespace would cut such a path in two or shift the source into the super options.
    fields = line.split(b" ")
    shown = line.decode("utf-8", "backslashreplace")
    try:
        sep = fields.index(b"-", 6)
    except ValueError:
        raise MountInfoError(lineno, "no ' - ' separator after the optional fields", shown) from None
    if sep < 6 or len(fields) < sep + 3:
        raise MountInfoError(lineno, f"expected at least 10 fields, got {len(fields)}", shown)
    try:
        mount_id = int(fields[0])
        parent_id = int(fields[1])
        major_s, _, minor_s = fields[2].partition(b":")
        major, minor = int(major_s), int(minor_s)
    except ValueError:
        raise MountInfoError(lineno, "mount ID, parent ID or MAJOR:MINOR is not numeric", shown) from None
    # Super options can be absent on some kernels' lines for filesystems with none; tolerate a missing field.
    super_opts = fields[sep + 3] if len(fields) > sep + 3 else b""
    # The kernel prints C strings: a NUL byte, raw or escaped as \000, is never in a line it wrote. A path holding
    # one could not be passed to a system call (statvfs would fail on it), so the line is refused here, alone.
    for name, raw in (("root", fields[3]), ("mount point", fields[4]), ("source", fields[sep + 2])):
        if b"\x00" in raw or b"\\000" in raw:
            raise MountInfoError(lineno, f"{name} holds a NUL byte, which no path or name can hold", shown)
    return MountInfo(
        mount_id=mount_id,
        parent_id=parent_id,
        major=major,
        minor=minor,
        root=unescape(fields[3]),
        mountpoint=unescape(fields[4]),
        mount_options=tuple(os.fsdecode(o) for o in fields[5].split(b",") if o),
        optional_fields=tuple(os.fsdecode(f) for f in fields[6:sep]),
        fstype=os.fsdecode(fields[sep + 1]),
        source=unescape(fields[sep + 2]),
        super_options=tuple(unescape(o) for o in super_opts.split(b",") if o),
    )


def parse_mountinfo(data: bytes) -> tuple[list[MountInfo], list[MountInfoError]]:
    """Parse a whole mountinfo file. Bad lines are returned as errors; good lines are never lost to them."""
    mounts: list[MountInfo] = []
    errors: list[MountInfoError] = []
    for lineno, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            mounts.append(parse_line(line, lineno))
        except MountInfoError as err:
            errors.append(err)
    return mounts, errors
