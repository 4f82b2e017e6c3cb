"""Parsers for a process's I/O accounting and open files: ``<procfs>/<pid>/io``, the access mode and inode in
``<procfs>/<pid>/fdinfo/<fd>``, the children lists in ``<procfs>/<pid>/task/<tid>/children`` and the signal mask and
user IDs in ``<procfs>/<pid>/status``.

``io`` (proc(5)): ``rchar``/``wchar`` are bytes passed to read and write calls (page cache hits included), ``syscr``/
``syscw`` the number of those calls, ``read_bytes``/``write_bytes`` what reached (or will reach) the storage layer,
``cancelled_write_bytes`` what was truncated before it was written back. Pure functions over bytes; a malformed line
is a LineError and the others still count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from storwatch.procfs import LineError

IO_FIELDS = ("rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes", "cancelled_write_bytes")
_MAX_COUNTER = 1 << 64


@dataclass(frozen=True)
class ProcessIO:
    """A process's I/O counters since it started, its reaped children's included (the kernel adds a child's counters
    to its parent's when the parent waits for it; a child reaped by no one, as under ``SIGCHLD`` ignored, is lost)."""

    rchar: int = 0
    """Bytes returned by read calls (read, pread, readv, sendfile...), page cache hits, pipes and sockets included."""
    wchar: int = 0
    """Bytes passed to write calls, likewise."""
    syscr: int = 0
    """Read calls."""
    syscw: int = 0
    """Write calls."""
    read_bytes: int = 0
    """Bytes this process caused to be fetched from the storage layer."""
    write_bytes: int = 0
    """Bytes this process caused to be sent to the storage layer (counted as pages are dirtied)."""
    cancelled_write_bytes: int = 0
    """Of write_bytes, those never written back (the file was truncated or deleted first)."""


def summed(records: Iterable[ProcessIO]) -> ProcessIO:
    """The counters of several processes together."""
    rows = list(records)
    return ProcessIO(*(sum(getattr(r, f.name) for r in rows) for f in fields(ProcessIO)))


def field_max(a: ProcessIO, b: ProcessIO) -> ProcessIO:
    """Each counter's larger value of the two."""
    return ProcessIO(*(max(getattr(a, f.name), getattr(b, f.name)) for f in fields(ProcessIO)))


def parse_io(data: bytes) -> tuple[ProcessIO | None, list[LineError]]:
    """The counters of a ``<pid>/io`` file; None when no field parsed."""
    values: dict[str, int] = {}
    errors: list[LineError] = []
    for n, raw in enumerate(data.splitlines(), start=1):
        line = raw.decode("ascii", "replace").strip()
        if not line:
            continue
        name, sep, rest = line.partition(":")
        if not sep or name not in IO_FIELDS:
            if name.isidentifier() and sep:
                continue  # a field added by a newer kernel
            errors.append(LineError(n, "expected 'name: value'", line[:200]))
            continue
        text = rest.strip()
        if not text.isdigit() or int(text) >= _MAX_COUNTER:
            errors.append(LineError(n, f"{name}: not a counter", line[:200]))
            continue
        values[name] = int(text)
    return (ProcessIO(**values) if values else None), errors


def access_mode(fdinfo: bytes) -> str | None:
    """``r``, ``w`` or ``rw`` from the ``flags:`` line (octal open flags) of a ``<pid>/fdinfo/<fd>`` file."""
    for raw in fdinfo.splitlines():
        name, _, rest = raw.partition(b":")
        if name.strip() == b"flags":
            try:
                flags = int(rest.strip(), 8)
            except ValueError:
                return None
            return ("r", "w", "rw", None)[flags & 3]
    return None


def parse_children(data: bytes) -> list[int]:
    """The PIDs of a ``task/<tid>/children`` file (space-separated); anything else is skipped."""
    return [int(w) for w in data.split() if w.isdigit() and 0 < int(w) < 1 << 22]


def caught_signals(status: bytes) -> int | None:
    """The ``SigCgt`` mask of ``<procfs>/<pid>/status``: bit N-1 is set when the process has a handler for signal N
    (neither the default action nor ignored). None when the line is missing or not hexadecimal."""
    for line in status.splitlines():
        if line.startswith(b"SigCgt:"):
            text = line[len(b"SigCgt:") :].strip()
            if not text or len(text) > 32 or any(c not in b"0123456789abcdefABCDEF" for c in text):
                return None
            return int(text, 16)
    return None


def fd_inode(fdinfo: bytes) -> int | None:
    """The inode number of the open file, from the ``ino:`` line (decimal) of a ``<pid>/fdinfo/<fd>`` file (Linux
    5.14 and later); None when the line is missing or not a number."""
    for raw in fdinfo.splitlines():
        name, _, rest = raw.partition(b":")
        if name.strip() == b"ino":
            text = rest.strip()
            return int(text) if text.isdigit() and len(text) <= 20 else None
    return None


def status_uids(status: bytes) -> tuple[int, ...] | None:
    """The real, effective, saved and filesystem user IDs from the ``Uid:`` line of ``<procfs>/<pid>/status`` (the
    filesystem one owns the files the process creates). None when the line is missing or malformed."""
    for line in status.splitlines():
        if line.startswith(b"Uid:"):
            words = line[len(b"Uid:") :].split()
            if len(words) != 4 or not all(w.isdigit() and len(w) <= 10 for w in words):
                return None
            return tuple(int(w) for w in words)
    return None
