"""The kernel's file events as ``read(2)`` of an inotify descriptor gives them (inotify(7)): a buffer of
``struct inotify_event {int wd; uint32_t mask; uint32_t cookie; uint32_t len; char name[len];}`` records, the name
NUL-padded. Pure: bytes in, records out; a record cut short ends the parse and is said so.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

IN_MODIFY = 0x00000002
"""A write to the file (its data changed)."""
IN_CLOSE_WRITE = 0x00000008
"""A file opened for writing was closed."""
IN_CLOSE_NOWRITE = 0x00000010
"""A file (or directory) not opened for writing was closed."""
IN_OPEN = 0x00000020
"""A file (or directory) was opened."""
IN_MOVED_FROM = 0x00000040
"""A file or directory was renamed away from the watched directory (``cookie`` pairs it with its MOVED_TO)."""
IN_MOVED_TO = 0x00000080
"""A file or directory was renamed into the watched directory."""
IN_CREATE = 0x00000100
"""A file or directory was made in the watched directory."""
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
"""The watched directory itself was removed."""
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
"""The filesystem holding the watched directory was unmounted."""
IN_Q_OVERFLOW = 0x00004000
"""The kernel's event queue overflowed: events were lost (``wd`` is -1)."""
IN_IGNORED = 0x00008000
"""The watch is gone (removed, or its directory deleted or unmounted)."""
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
"""The subject of the event is a directory."""

WATCH_MASK = (
    IN_MODIFY
    | IN_CLOSE_WRITE
    | IN_CLOSE_NOWRITE
    | IN_OPEN
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
    | IN_DONT_FOLLOW
    | IN_EXCL_UNLINK
)
"""What a run directory is watched for: a file made, written, closed after writing, moved in or out, removed; opened
and closed again (a writer's fsync through a second descriptor: the helper passes on only the opens that follow a
close after writing within moments, and their closes); never through a link, only a directory."""

_HEADER = struct.Struct("=iIII")


class InotifyEvent(NamedTuple):
    """One record (a NamedTuple, not a dataclass: the events helper imports this module, and ``dataclasses`` would
    add 2 MB to its RSS)."""

    wd: int
    """The watch the event is of (-1 for a queue overflow)."""
    mask: int
    cookie: int
    """Pairs an IN_MOVED_FROM with its IN_MOVED_TO (0 otherwise)."""
    name: bytes
    """The entry's name in the watched directory (empty for an event of the directory itself)."""


def parse_events(data: bytes) -> tuple[list[InotifyEvent], bool]:
    """The events in one read's buffer, and whether it ended cleanly (False: a record was cut short; the kernel
    never does that, so the buffer was not all read)."""
    out: list[InotifyEvent] = []
    at = 0
    while at + _HEADER.size <= len(data):
        wd, mask, cookie, length = _HEADER.unpack_from(data, at)
        at += _HEADER.size
        if at + length > len(data):
            return out, False
        name = data[at : at + length].split(b"\0", 1)[0]
        at += length
        out.append(InotifyEvent(wd, mask, cookie, name))
    return out, at == len(data)
