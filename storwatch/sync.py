"""Verified copies of a checkpoint (a file or a directory) to durable storage, made safely as root: what is copied,
where it may go, and the helper process that makes it so that a destination that hangs never holds the caller.

**The copy** (:func:`copy_verified`). DEST is the copy's own final path: when it does not exist this is what
``cp -r SRC DEST`` makes. The source is read once, each chunk hashed (xxh3-128) as it is read; the copy is written
under a temporary name in DEST's directory (``.NAME.storwatch-sync-TOKEN.tmp``) through the page cache, as ``cp``
writes, the kernel asked to start writing each chunk out at once (``sync_file_range``). It is read back past the
page cache, its hash compared with the source's: a thread at most LAG chunks behind the writing waits until a chunk
is on the device, drops it from the page cache (``POSIX_FADV_DONTNEED``: its pages are clean by then) and reads it
back, so from the device. Writing through the page cache rather than with ``O_DIRECT`` lets the kernel's writeback keep
many requests in flight: it ran faster than ``dd oflag=direct`` here (BENCHMARKS.md), and needs no alignment. On
tmpfs and ramfs the page cache is the storage, and the read-back reads it. Files are fsynced on a thread of their
own while the next is written, every file is fsynced before its verdict, and the copy is never renamed into place
before every file is verified. Completeness markers (DCP ``.metadata``,
torchsnapshot ``.snapshot_metadata``, Orbax ``commit_success.txt`` and ``_CHECKPOINT_METADATA``, Megatron
``latest_checkpointed_iteration.txt``, DeepSpeed ``latest``) are written after every other file is verified and
fsynced. Then the directories are fsynced, the manifest (every entry with its size, mode, times and hash; the source;
when) is put beside the copy as ``NAME.storwatch-sync.json``, the copy renamed into place
(``renameat2(RENAME_NOREPLACE)``; an earlier copy of ours is exchanged atomically with ``RENAME_EXCHANGE`` where the
filesystem can, else moved aside first, leaving DEST briefly absent) and DEST's directory fsynced. So DEST is always
either absent, the earlier verified copy, or the new one complete.

The copy aborts, and nothing appears at DEST, when the source changes while it is read (a file's size, mtime, ctime
or inode before and after it is read, and the whole tree listed again at the end), when DEST's filesystem lacks the
space (checked before anything is written), on an I/O error or a read-back that differs, or when ``stop()`` says so.
Every copy into a directory first removes what earlier copies there left (entries named as above: temporaries,
copies moved aside, manifests of copies that are gone); copies into one directory take turns (``flock`` on it, where
the filesystem has one). A DEST that already holds a copy of ours whose manifest matches the source as it is now is
left alone (``unchanged``); one of ours of an older source is replaced; anything else at DEST is refused. Keep-N
retention (``keep``) then removes the oldest verified copies of ours in DEST's directory beyond N, never anything
else, and never anything of the source.

**As root, safely.** With ``root`` (an allowlisted root, :class:`Destinations`), every directory from the root down
to the copy is opened with ``openat(O_NOFOLLOW)`` from the one above (made, 0755, where missing), so no symlink
anyone planted leads the copy elsewhere; with ``source_root``, the source is reached the same way. The source's own
top must not be a symlink. Inside it, symlinks are never followed: one whose target stays inside the checkpoint
(resolved against the tree as listed, links within it included) is copied as a symlink with the same target; one
that is absolute or leads out of it makes the copy refused, as do FIFOs, sockets and devices. Copies keep each
entry's mode (without set-user-ID and set-group-ID bits) and times, and, when running as root, its owner and group,
which takes ``CAP_CHOWN`` (reading another user's files takes ``CAP_DAC_READ_SEARCH``; setting the mode and times
happens before the owner changes, so ``CAP_FOWNER`` is not needed). Not root, the owner is skipped and the manifest
says so; a filesystem that refuses the owner (NFS with root_squash) gives a note, not a failure.

**The helper** (:class:`SyncWorker`). ``submit(src, dest)`` returns a job id at once: it checks DEST against the
allowlist by its text alone (no file is touched in the caller) and queues the job. Jobs run one at a time by default,
each in a child process of its own (``python -I``, running :func:`copy_verified`), which reports its progress and its
result as JSON lines on a pipe. ``status()`` is a snapshot of every job (queued, running, done, failed, abandoned)
with its bytes done and total; ``poll()`` hands each finished job's :class:`SyncResult` once; ``wait()`` waits for
one. A job still running past its deadline is abandoned: its child is killed (SIGKILL) and never waited for, so a
child stuck in the kernel on a hung NFS or FUSE mount costs a process, never the caller's thread. ``cancel()`` asks a
child to stop (it closes the child's standard input: the copy stops at its next chunk and removes its temporaries)
and kills it after a grace period. ``close()`` cancels everything and returns within ``grace + 0.5`` seconds
whatever state the children are in. A child also stops when the caller dies (its standard input closes).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import itertools
import json
import math
import mmap
import os
import queue
import re
import secrets
import signal
import stat
import string
import subprocess
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import xxhash

if TYPE_CHECKING:  # the copy's helper process never reads the configuration: its start-up is the copy's time
    from storwatch.config import SyncConfig

HASH_NAME = "xxh3_128"
"""The hash of every file, read and read back: xxh3-128 hashes far faster than any disk writes (BENCHMARKS.md), so
it never limits the copy; BLAKE3 and SHA-256 would, at about a gigabyte a second on one core."""
CHUNK = 16 << 20
"""Bytes read and written at a time: each chunk is written out, waited for and read back as one range."""
READ_BACK = 8 << 20
"""Bytes read back at a time, each piece dropped from the page cache once hashed (the kernel's readahead keeps the
device busy between the reads)."""
LAG = 2
"""Chunks written and waiting for their read-back, at most: the reader's lead. The copy's memory is its two buffers
(CHUNK + READ_BACK, 24 MiB), and at most ``LAG + 2`` chunks of the copy (64 MiB) are in the page cache at once,
written or being read back: about 90 MiB in the DaemonSet's memory cgroup beside the agent. Of the settings tried
here, 16 MiB chunks two ahead and 32 MiB chunks one ahead copied fastest, a 2 GiB file and 64 shards alike, and
the first holds less (BENCHMARKS.md)."""
MARKERS = frozenset(
    {
        ".metadata",  # torch.distributed.checkpoint
        ".snapshot_metadata",  # torchsnapshot
        "commit_success.txt",  # Orbax on object stores
        "_CHECKPOINT_METADATA",  # Orbax
        "latest_checkpointed_iteration.txt",  # Megatron-LM
        "latest",  # DeepSpeed
        "latest_universal",  # DeepSpeed universal checkpoints
    }
)
"""Files whose presence says a checkpoint (or a run's newest one) is complete: written after every other file."""
MANIFEST_SUFFIX = ".storwatch-sync.json"
TEMP_TAG = ".storwatch-sync-"
_TEMP_NAME = re.compile(r"\.(?P<name>.+)\.storwatch-sync-(?P<token>[0-9a-f]{16})\.(?P<kind>tmp|old|manifest)")
MANIFEST_VERSION = 1
MAX_ENTRIES = 200_000
"""Entries of a source beyond this, and the copy is refused (a tenant's tree is bounded like any of its data)."""
MAX_DEPTH = 64
MAX_MANIFEST_BYTES = 128 << 20
MAX_LINK_HOPS = 40
NAME_MAX = 255

OUTCOMES = ("verified", "unchanged", "refused", "source_changed", "no_space", "failed", "stopped", "abandoned")
"""How a copy ended: ``verified`` (made and read back identical), ``unchanged`` (DEST already holds our verified copy
of the source as it is), ``refused`` (it may not be made: the allowlist, a template field, a symlink out of the
source, something at DEST that is not ours), ``source_changed``, ``no_space``, ``failed`` (an I/O error, a read-back
that differs), ``stopped`` (``stop()``, ``cancel()``), ``abandoned`` (past its deadline, or the worker closed)."""
OK_OUTCOMES = frozenset({"verified", "unchanged"})

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_NOATIME = getattr(os, "O_NOATIME", 0)


class SyncRefused(Exception):
    """The copy may not be made; the message says why, naming the field, path or entry at fault."""


class _Abort(Exception):
    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclass(frozen=True)
class SyncResult:
    ok: bool
    """The copy at ``dest`` is verified identical to the source (made now, or already there)."""
    source: str
    dest: str
    bytes: int
    """Bytes in the copy's files."""
    files: int
    """Regular files in the copy."""
    seconds: float
    error: str | None
    manifest: str | None
    """The manifest beside the copy, when there is a verified copy."""
    outcome: str = "verified"
    """One of OUTCOMES."""
    written_bytes: int = 0
    """Bytes written by this copy (0 when unchanged or failed before writing)."""
    hash: str = HASH_NAME
    removed: tuple[str, ...] = ()
    """Older copies removed by keep-N retention."""
    notes: tuple[str, ...] = ()
    """What is no failure but worth saying (the owner not kept, retention that stopped)."""
    job_id: int | None = None
    started: float = 0.0
    """Wall-clock time the copy started (seconds since the epoch)."""

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "removed": list(self.removed), "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SyncResult:
        """A result read back from a helper's pipe, every field checked against its type."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for name, value in data.items():
            if name not in fields:
                continue
            if name in ("removed", "notes"):
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"{name}: not a list of strings")
                value = tuple(value)
            values[name] = value
        result = cls(**values)
        checks = {
            "ok": bool,
            "source": str,
            "dest": str,
            "bytes": int,
            "files": int,
            "seconds": (int, float),
            "written_bytes": int,
            "hash": str,
            "started": (int, float),
        }
        for name, kind in checks.items():
            if not isinstance(getattr(result, name), kind):  # type: ignore[arg-type]
                raise ValueError(f"{name}: {getattr(result, name)!r} is not {kind}")
        for name in ("error", "manifest"):
            if getattr(result, name) is not None and not isinstance(getattr(result, name), str):
                raise ValueError(f"{name}: not a string")
        if result.outcome not in OUTCOMES:
            raise ValueError(f"outcome: {result.outcome!r} is not one of {OUTCOMES}")
        return result


def _failed(source: str, dest: str, outcome: str, error: str, seconds: float = 0.0, started: float = 0.0) -> SyncResult:
    return SyncResult(
        ok=False,
        source=source,
        dest=dest,
        bytes=0,
        files=0,
        seconds=seconds,
        error=error,
        manifest=None,
        outcome=outcome,
        started=started,
    )


# --------------------------------------------------------------------------------------------------------------------
# Where copies may go


def _field_problem(name: str, value: object) -> str | None:
    if not isinstance(value, str):
        return f"field {name!r} is not text"
    if value == "":
        return f"field {name!r} is empty"
    if value in (".", ".."):
        return f"field {name!r} is {value!r}, which would leave its directory"
    if "/" in value:
        return f"field {name!r} holds '/' ({value!r}): a field is one path component"
    for char in value:
        if char < " " or "\x7f" <= char <= "\x9f" or unicodedata.category(char) in ("Cs", "Zl", "Zp"):
            return f"field {name!r} holds the control character {char!r} (NUL, a control or a line separator)"
    if TEMP_TAG in value or value.endswith(MANIFEST_SUFFIX):
        return f"field {name!r} ({value!r}) could be taken for storwatch's own temporaries or manifests"
    if len(os.fsencode(value)) > NAME_MAX:
        return f"field {name!r} is longer than {NAME_MAX} bytes"
    return None


def safe_field(value: str) -> str:
    """``value`` made into one valid path component for a template field, reversibly (percent-encoding): ``%``,
    ``/``, control characters and a leading ``.`` as ``%XX``; empty as ``%00``; past NAME_MAX bytes cut and ended
    by a hash of the whole, so two values never meet on a name. For fields that are paths (a run below its root)."""
    if value == "":
        return "%00"
    out = []
    for i, char in enumerate(value):
        bad = char in "%/" or char < " " or "\x7f" <= char <= "\x9f"
        bad = bad or unicodedata.category(char) in ("Cs", "Zl", "Zp") or (i == 0 and char == ".")
        out.append("".join(f"%{b:02X}" for b in os.fsencode(char)) if bad else char)
    text = "".join(out)
    if TEMP_TAG in text:
        text = text.replace(TEMP_TAG, TEMP_TAG.replace(".", "%2E", 1))
    if text.endswith(MANIFEST_SUFFIX):
        text = text[: -len(MANIFEST_SUFFIX)] + "%2E" + MANIFEST_SUFFIX[1:]
    if len(os.fsencode(text)) > NAME_MAX:
        digest = xxhash.xxh3_64_hexdigest(os.fsencode(value))
        raw = os.fsencode(text)[: NAME_MAX - len(digest) - 1]
        text = raw.decode("utf-8", "ignore") + "~" + digest
    return text


class Destinations:
    """The allowlisted roots copies may be made under (``sync.destinations``), and the path of a copy below one.

    Nothing here touches a file: a root may sit on a mount that hangs, and the caller must not. The copy itself opens
    every component from the root down with ``O_NOFOLLOW`` (:func:`copy_verified` with ``root``)."""

    def __init__(self, roots: Iterable[str]) -> None:
        normal: list[str] = []
        for root in roots:
            if not os.path.isabs(root) or "\0" in root:
                raise ValueError(f"sync destination {root!r} is not an absolute path")
            root = "/" + os.path.normpath(root).strip("/")
            if root == "/":
                raise ValueError("sync destination '/' would allow every path on the host")
            if root not in normal:
                normal.append(root)
        self.roots: tuple[str, ...] = tuple(normal)

    @classmethod
    def from_config(cls, section: SyncConfig) -> Destinations:
        return cls(section.destinations)

    def root_of(self, path: str) -> str | None:
        """The allowlisted root ``path`` lies strictly below, by its text; None when none does, or when the path is
        not absolute, or holds ``.``, ``..``, an empty component or NUL (a path is never normalised into a root)."""
        if not os.path.isabs(path) or "\0" in path:
            return None
        parts = path.split("/")[1:]
        if any(p in ("", ".", "..") for p in parts):
            return None
        for root in self.roots:
            if path.startswith(root + "/") and len(path) > len(root) + 1:
                return root
        return None

    def check(self, path: str) -> str:
        """The root ``path`` lies below; :class:`SyncRefused` when it lies below none."""
        root = self.root_of(path)
        if root is None:
            allowed = ", ".join(self.roots) or "none configured (sync.destinations)"
            raise SyncRefused(f"{path!r} is not below an allowlisted sync destination ({allowed})")
        return root

    def resolve(self, template: str, fields: Mapping[str, str], *, root: str | None = None) -> str:
        """The copy's path: ``template`` filled from ``fields`` below ``root`` (default: the first root).

        Every field the template names must be one path component: :class:`SyncRefused`, naming the field, for one
        missing, empty, ``.`` or ``..``, holding ``/``, NUL or another control character, or longer than NAME_MAX
        (:func:`safe_field` makes any text such a component)."""
        if not self.roots:
            raise SyncRefused("no sync destination is configured (sync.destinations)")
        if root is None:
            root = self.roots[0]
        elif "/" + os.path.normpath(root).strip("/") not in self.roots:
            raise SyncRefused(f"{root!r} is not an allowlisted sync destination ({', '.join(self.roots)})")
        root = "/" + os.path.normpath(root).strip("/")
        from storwatch.config import sync_template_problem

        problem = sync_template_problem(template)
        if problem is not None:
            raise SyncRefused(f"sync template: {problem}")
        out: list[str] = []
        for literal, name, _spec, _conversion in string.Formatter().parse(template):
            out.append(literal)
            if name is None:
                continue
            if name not in fields:
                raise SyncRefused(f"field {name!r} has no value (the template {template!r} names it)")
            problem = _field_problem(name, fields[name])
            if problem is not None:
                raise SyncRefused(problem)
            out.append(fields[name])
        rel = "".join(out)
        for component in rel.split("/"):
            if len(os.fsencode(component)) > NAME_MAX:
                raise SyncRefused(f"the path component {component[:40]!r}... is longer than {NAME_MAX} bytes")
            if TEMP_TAG in component or component.endswith(MANIFEST_SUFFIX):
                raise SyncRefused(f"the path component {component!r} could be taken for storwatch's own files")
        path = f"{root}/{rel}"
        if self.root_of(path) != root:  # pragma: no cover - the checks above make this impossible
            raise SyncRefused(f"{path!r} would leave {root}")
        return path


# --------------------------------------------------------------------------------------------------------------------
# The source as listed


@dataclass
class _Entry:
    rel: tuple[str, ...]
    """The path below the source's top; () is the top itself."""
    kind: str
    """``dir``, ``file`` or ``link``."""
    st: os.stat_result
    target: str | None = None
    digest: str | None = None

    @property
    def path(self) -> str:
        return "/".join(self.rel) or "."

    def state(self) -> tuple[Any, ...]:
        """What says the entry is the same: for the final listing, with the inode and ctime."""
        st = self.st
        size = st.st_size if self.kind == "file" else 0
        return (self.rel, self.kind, size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, self.target)


def _what(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device node"
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "neither a file, a directory nor a symlink"


def _kind(mode: int) -> str | None:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "link"
    return None


def _walk(top_fd: int, top: _Entry, shown: str) -> list[_Entry]:
    """Every entry of the source, directories before what they hold, names sorted; bounded in entries and depth.
    Directories are opened from the one above with O_NOFOLLOW and checked to be the ones listed."""
    entries = [top]
    if top.kind != "dir":
        return entries
    dirs: dict[tuple[str, ...], os.stat_result] = {(): top.st}
    stack: list[tuple[tuple[str, ...], int]] = [((), os.dup(top_fd))]
    try:
        while stack:
            rel, fd = stack.pop()
            try:
                names = sorted(os.listdir(fd))
                subdirs: list[tuple[str, ...]] = []
                for name in names:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    kind = _kind(st.st_mode)
                    child = (*rel, name)
                    if kind is None:
                        raise SyncRefused(
                            f"{shown}/{'/'.join(child)} is {_what(st.st_mode)}: a checkpoint holds files, directories "
                            "and symlinks only"
                        )
                    target = os.readlink(name, dir_fd=fd) if kind == "link" else None
                    entries.append(_Entry(child, kind, st, target))
                    if len(entries) > MAX_ENTRIES:
                        raise SyncRefused(f"{shown} holds more than {MAX_ENTRIES} entries")
                    if kind == "dir":
                        if len(child) >= MAX_DEPTH:
                            raise SyncRefused(f"{shown} nests deeper than {MAX_DEPTH} directories")
                        subdirs.append(child)
                        dirs[child] = st
                for child in reversed(subdirs):
                    sub = os.open(child[-1], _DIR_FLAGS, dir_fd=fd)
                    stack.append((child, sub))
                    sst = os.fstat(sub)
                    if (sst.st_dev, sst.st_ino) != (dirs[child].st_dev, dirs[child].st_ino):
                        raise _Abort("source_changed", f"{shown}/{'/'.join(child)} was replaced while listed")
            except (FileNotFoundError, NotADirectoryError) as err:
                raise _Abort("source_changed", f"{shown}: an entry went away while listed ({err.filename})") from None
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise _Abort("source_changed", f"{shown}: a directory became a symlink while listed") from None
                raise
            finally:
                os.close(fd)
    finally:
        for _, fd in stack:
            os.close(fd)
    # Pre-order: a directory before its children (the stack gave depth-first order per directory; sort by path).
    entries[1:] = sorted(entries[1:], key=lambda e: e.rel)
    return entries


def _check_links(entries: Sequence[_Entry], shown: str) -> None:
    """Refuse a symlink that is absolute or, resolved against the tree as listed (links in it followed, at most
    MAX_LINK_HOPS), leads out of the checkpoint: the copy must hold the checkpoint and nothing outside it."""
    links = {e.rel: e.target for e in entries if e.kind == "link"}

    def resolve(base: tuple[str, ...], target: str, hops: int, where: str) -> None:
        if target.startswith("/"):
            raise SyncRefused(f"{where} is a symlink to the absolute path {target!r}: it leads out of the checkpoint")
        path = list(base)
        for comp in target.split("/"):
            if comp in ("", "."):
                continue
            if comp == "..":
                if not path:
                    raise SyncRefused(f"{where} is a symlink ({target!r}) that leads out of the checkpoint")
                path.pop()
                continue
            path.append(comp)
            inner = links.get(tuple(path))
            if inner is not None:
                if hops >= MAX_LINK_HOPS:
                    raise SyncRefused(f"{where}: more than {MAX_LINK_HOPS} symlinks in a row")
                path.pop()
                resolve(tuple(path), inner, hops + 1, where)
                # Where the inner link leads stays inside; what follows it is resolved from the link's own place,
                # which is as strict (a '..' after it cannot climb above the checkpoint either way).
                path.append(comp)

    for rel, target in links.items():
        assert target is not None
        if not rel:
            raise SyncRefused(f"{shown} is a symlink: name what it points to")
        resolve(rel[:-1], target, 0, f"{shown}/{'/'.join(rel)}")


class _Dirs:
    """Descriptors of the directories below a top one, each opened from the one above without following a link;
    only those on the current path are held."""

    def __init__(self, top_fd: int, expect: Mapping[tuple[str, ...], os.stat_result] | None = None) -> None:
        self.top = top_fd
        self.expect = expect
        self.stack: list[tuple[str, int]] = []

    def fd(self, rel: tuple[str, ...]) -> int:
        n = 0
        while n < len(self.stack) and n < len(rel) and self.stack[n][0] == rel[n]:
            n += 1
        for _, fd in reversed(self.stack[n:]):
            os.close(fd)
        del self.stack[n:]
        for i in range(n, len(rel)):
            parent = self.stack[-1][1] if self.stack else self.top
            fd = os.open(rel[i], _DIR_FLAGS, dir_fd=parent)
            self.stack.append((rel[i], fd))
            if self.expect is not None:
                listed = self.expect.get(rel[: i + 1])
                st = os.fstat(fd)
                if listed is None or (st.st_dev, st.st_ino) != (listed.st_dev, listed.st_ino):
                    raise _Abort("source_changed", f"the directory {'/'.join(rel[: i + 1])} changed during the copy")
        return self.stack[-1][1] if self.stack else self.top

    def close(self) -> None:
        for _, fd in reversed(self.stack):
            os.close(fd)
        self.stack.clear()


def _open_below(root: str, rel: str, create: bool, shown: str) -> int:
    """A descriptor of the directory ``root/rel``: ``root`` opened as given (it is trusted configuration), every
    component below it opened from the one above with O_NOFOLLOW, made (0755, and its parent fsynced) where missing
    when ``create``."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        done = root
        for part in [p for p in rel.split("/") if p]:
            if part in (".", ".."):
                raise SyncRefused(f"{shown}: the path below {root} holds {part!r}")
            made = False
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    made = True
                except FileExistsError:
                    pass
            try:
                below = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    try:
                        st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
                    except OSError:
                        what = "not a directory"
                    raise SyncRefused(f"{done}/{part} is {what}: never followed") from None
                raise
            if made:
                os.fsync(fd)
            os.close(fd)
            fd = below
            done = f"{done}/{part}"
        return fd
    except BaseException:
        os.close(fd)
        raise


# --------------------------------------------------------------------------------------------------------------------
# The copy of the files: read and hash, write, read back and hash


@dataclass
class _FileJob:
    entry: _Entry
    fd: int
    """The copy, open for writing."""
    verify_fd: int
    """The copy, open for reading, opened before any mode is applied."""
    size: int
    expected: str | None = None
    verified: int = 0
    """Bytes read back and hashed, in order."""
    hasher: Any = field(default_factory=xxhash.xxh3_128)
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


_SYNC_FILE_RANGE_ALL = 1 | 2 | 4
"""SYNC_FILE_RANGE_WAIT_BEFORE | WRITE | WAIT_AFTER: the range is written out, and on the device, when the call
returns."""
_SYNC_FILE_RANGE_WRITE = 2
"""Start writing the range out, without waiting."""


def _libc_function(name: str) -> Any:
    """The C library's function ``name`` (errno kept for ``ctypes.get_errno``), or None where it has none."""
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name, None)
    except OSError:
        return None


_sync_file_range = _libc_function("sync_file_range")
if _sync_file_range is not None:
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]


def _write_out(fd: int, offset: int, n: int, wait: bool) -> None:
    """Have the kernel write ``n`` bytes of ``fd`` at ``offset`` out of the page cache: start it (``wait`` False), or
    return once they are on the device. Where ``sync_file_range`` is missing or refused, nothing is started and a wait
    is an fdatasync of the whole file."""
    if _sync_file_range is not None:
        if _sync_file_range(fd, offset, n, _SYNC_FILE_RANGE_ALL if wait else _SYNC_FILE_RANGE_WRITE) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ESPIPE):
            raise OSError(code, os.strerror(code))
    if wait:
        os.fdatasync(fd)


class _Pipeline:
    """Two threads behind the reader (the copy's own thread, which reads, hashes and writes each chunk through the
    page cache, as ``cp`` does, and asks the kernel to start writing it out): a verifier and a syncer.

    The verifier takes each range written, waits until it is on the device, drops it from the page cache
    (``POSIX_FADV_DONTNEED``: clean pages go), reads it back (so from the device) and hashes it; at a file's end it
    compares the hashes and hands the file to the syncer, which fsyncs it while the next is written. The reader is
    at most ``LAG`` ranges ahead of the read-back. The first failure in any thread is kept (``check()`` raises it)
    and they then only drain their queues, so nobody waits on them; ``shutdown()`` returns once none touches a
    descriptor."""

    def __init__(self) -> None:
        self.buf = mmap.mmap(-1, CHUNK, flags=mmap.MAP_PRIVATE)
        """The reader's buffer."""
        self._verify_q: queue.Queue[tuple[str, _FileJob, int, int] | None] = queue.Queue(maxsize=LAG)
        self._sync_q: queue.Queue[_FileJob | None] = queue.Queue()
        self.failure: BaseException | None = None
        self._aborted = False
        self._ended = False
        self._threads = [
            threading.Thread(target=self._verifier, name="sync-verifier", daemon=True),
            threading.Thread(target=self._syncer, name="sync-fsync", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _fail(self, err: BaseException) -> None:
        if self.failure is None:
            self.failure = err

    def _skipping(self) -> bool:
        return self.failure is not None or self._aborted

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _hand(self, item: tuple[str, _FileJob, int, int], stop: Callable[[], bool]) -> None:
        while True:
            self.check()
            if stop():
                raise _Abort("stopped", "stopped before the copy was complete")
            try:
                self._verify_q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def written(self, job: _FileJob, offset: int, n: int, stop: Callable[[], bool]) -> None:
        """``n`` bytes at ``offset`` were written: start writing them out, and queue their read-back (waiting while
        ``LAG`` ranges wait for theirs)."""
        _write_out(job.fd, offset, n, wait=False)
        self._hand(("range", job, offset, n), stop)

    def close_file(self, job: _FileJob, stop: Callable[[], bool]) -> None:
        self._hand(("close", job, 0, 0), stop)

    def finish(self, stop: Callable[[], bool]) -> None:
        """Wait until every file handed over is read back, verified and fsynced."""
        self._end()
        for t in self._threads:
            while t.is_alive():
                t.join(0.1)
                if stop() and not self._aborted:
                    self._aborted = True
                    self._fail(_Abort("stopped", "stopped before the copy was complete"))
        self.check()

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            while True:  # the verifier drains its queue whatever happens, so there is room soon
                try:
                    self._verify_q.put(None, timeout=0.1)
                    return
                except queue.Full:
                    continue

    def shutdown(self) -> None:
        """Stop the threads, skipping what is left, and wait until they have (a thread stuck in the kernel on a
        hung destination holds this, in the helper process that the worker kills)."""
        self._aborted = True
        self._end()
        for t in self._threads:
            t.join()

    def _verifier(self) -> None:
        # Its buffer is never closed: a failure kept with its traceback may hold a slice of it; it goes with them.
        view = memoryview(mmap.mmap(-1, READ_BACK, flags=mmap.MAP_PRIVATE))
        while True:
            item = self._verify_q.get()
            if item is None:
                self._sync_q.put(None)
                return
            what, job, offset, n = item
            try:
                if self._skipping():
                    if what == "close":
                        job.done.set()
                elif what == "range":
                    self._read_back(job, view, offset, n)
                else:
                    self._compare(job)
                    self._sync_q.put(job)
            except BaseException as err:
                self._fail(err)
                if what == "close":
                    job.done.set()

    @staticmethod
    def _read_back(job: _FileJob, view: memoryview, offset: int, n: int) -> None:
        _write_out(job.fd, offset, n, wait=True)
        os.posix_fadvise(job.fd, offset, n, os.POSIX_FADV_DONTNEED)  # written out, so clean: dropped
        got = 0
        while got < n:
            want = min(n - got, len(view))
            more = os.preadv(job.verify_fd, [view[:want]], offset + got)
            if more == 0:
                raise _Abort(
                    "failed", f"{job.entry.path}: reading the copy back gave {offset + got} of {job.size} bytes"
                )
            job.hasher.update(view[:more])
            os.posix_fadvise(job.fd, offset + got, more, os.POSIX_FADV_DONTNEED)  # what the read brought in goes too
            got += more
        job.verified += n

    @staticmethod
    def _compare(job: _FileJob) -> None:
        got = job.hasher.hexdigest()
        length = os.fstat(job.fd).st_size
        if job.verified != job.size or length != job.size:
            job.error = f"{job.entry.path}: the copy holds {length} bytes, not the {job.size} written"
        elif got != job.expected:
            job.error = (
                f"{job.entry.path}: read back past the page cache, the copy's {HASH_NAME} {got} differs from the "
                f"source's {job.expected}"
            )
        else:
            job.entry.digest = got
        if job.error is not None:
            raise _Abort("failed", job.error)

    def _syncer(self) -> None:
        while True:
            job = self._sync_q.get()
            if job is None:
                return
            try:
                if not self._skipping():
                    os.fsync(job.fd)
            except BaseException as err:
                self._fail(err)
            finally:
                job.done.set()


def _read_full(fd: int, view: memoryview) -> int:
    """Fill ``view`` from ``fd``, less only at the end of the file (a read may return less than asked): whole chunks
    are written out and read back as one range each."""
    n = 0
    while n < len(view):
        got = os.readv(fd, [view[n:]])
        if got == 0:
            break
        n += got
    return n


_renameat2_call = _libc_function("renameat2")


def _renameat2(dir_fd: int, old: str, new: str, flags: int) -> None:
    if _renameat2_call is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if _renameat2_call(dir_fd, os.fsencode(old), dir_fd, os.fsencode(new), ctypes.c_uint(flags)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _remove_tree(dir_fd: int, name: str, depth: int = 0) -> None:
    """Remove ``name`` below ``dir_fd`` and everything in it, never following a link."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    if depth > MAX_DEPTH * 2:
        raise OSError(errno.ELOOP, f"{name}: nested too deep to remove; left as it is")
    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != (st.st_dev, st.st_ino):
            raise OSError(errno.EAGAIN, f"{name} changed while it was removed")
        for child in os.listdir(fd):
            _remove_tree(fd, child, depth + 1)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def _read_manifest(dir_fd: int, name: str) -> dict[str, Any] | None:
    """A manifest of ours, or None for anything else (unreadable, too large, not our schema)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        total = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > MAX_MANIFEST_BYTES:
                return None
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        data = json.loads(b"".join(chunks))
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("storwatch_sync") != MANIFEST_VERSION:
        return None
    if not isinstance(data.get("inode"), int) or not isinstance(data.get("entries"), list):
        return None
    return data


_IDENTITY = ("path", "type", "size", "mtime_ns", "target")


def _identity(entry: Mapping[str, Any]) -> dict[str, Any]:
    """What says a listed entry is the one a manifest recorded (not its hash, mode or owner)."""
    return {k: entry[k] for k in _IDENTITY if k in entry}


def _ours(dir_fd: int, name: str) -> dict[str, Any] | None:
    """The manifest of the copy at ``name``, when the copy there is the one it describes: the same inode, and the
    same type and mtime of its top (an inode number alone could have been reused by something else since)."""
    manifest = _read_manifest(dir_fd, name + MANIFEST_SUFFIX)
    if manifest is None or not manifest["entries"] or not isinstance(manifest["entries"][0], dict):
        return None
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    top = manifest["entries"][0]
    if st.st_ino != manifest["inode"] or top.get("type") != _kind(st.st_mode) or top.get("mtime_ns") != st.st_mtime_ns:
        return None
    return manifest


def _clean_leftovers(dir_fd: int, problems: list[str]) -> list[str]:
    """Remove what earlier copies into this directory left: temporaries, copies moved aside, manifests never put in
    place (one whose copy was renamed into place is put in place instead) and manifests whose copy is gone. What
    cannot be removed is said in ``problems`` and left."""
    removed: list[str] = []
    for name in sorted(os.listdir(dir_fd)):
        m = _TEMP_NAME.fullmatch(name)
        if m is not None:
            final = m["name"]
            if m["kind"] == "manifest":
                manifest = _read_manifest(dir_fd, name)
                try:
                    st = os.stat(final, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    st = None
                if manifest is not None and st is not None and st.st_ino == manifest["inode"]:
                    # The copy was renamed into place and its writer died before its manifest followed.
                    os.rename(name, final + MANIFEST_SUFFIX, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                    continue
            try:
                _remove_tree(dir_fd, name)
            except FileNotFoundError:
                continue
            except OSError as err:
                problems.append(f"{name}: {err.strerror or err}")
                continue
            removed.append(name)
        elif name.endswith(MANIFEST_SUFFIX) and len(name) > len(MANIFEST_SUFFIX):
            final = name[: -len(MANIFEST_SUFFIX)]
            try:
                os.stat(final, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                if _read_manifest(dir_fd, name) is not None:
                    os.unlink(name, dir_fd=dir_fd)
                    removed.append(name)
    return removed


def _retain(dir_fd: int, keep: int, current: str, shown_dir: str) -> list[str]:
    """Keep the ``keep`` newest verified copies of ours in this directory (``current`` among them); remove the rest,
    each first moved aside (so no final path ever holds half a copy), then its manifest, then its tree."""
    if keep <= 0:
        return []
    copies: list[tuple[float, str]] = []
    for name in os.listdir(dir_fd):
        if not name.endswith(MANIFEST_SUFFIX) or _TEMP_NAME.fullmatch(name):
            continue
        final = name[: -len(MANIFEST_SUFFIX)]
        manifest = _ours(dir_fd, final)
        if manifest is None:
            continue
        finished = manifest.get("finished")
        copies.append((float(finished) if isinstance(finished, (int, float)) else 0.0, final))
    copies.sort(reverse=True)
    kept = [name for _, name in copies[:keep]]
    if current not in kept and copies:
        kept = [current, *kept[: keep - 1]]
    removed: list[str] = []
    for _, name in copies:
        if name in kept:
            continue
        aside = f".{name}{TEMP_TAG}{secrets.token_hex(8)}.old"
        os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.unlink(name + MANIFEST_SUFFIX, dir_fd=dir_fd)
        _remove_tree(dir_fd, aside)
        removed.append(f"{shown_dir}/{name}")
    if removed:
        os.fsync(dir_fd)
    return removed


@contextlib.contextmanager
def _dir_lock(dir_fd: int, stop: Callable[[], bool]) -> Iterator[None]:
    """Copies into one directory take turns (their cleanup removes what is not running); a filesystem without
    flock on directories goes without."""
    while True:
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if stop():
                raise _Abort("stopped", "stopped while another copy into the same directory ran") from None
            time.sleep(0.05)
        except OSError as err:
            if err.errno in (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                break
            raise
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(dir_fd, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------------------------------
# copy_verified


class _Copy:
    """One copy, from the source's listing to the manifest; :func:`copy_verified` is its only user."""

    def __init__(
        self,
        src: str,
        dest: str,
        root: str | None,
        source_root: str | None,
        bandwidth: float | None,
        keep: int,
        progress: Callable[[int, int], None] | None,
        stop: Callable[[], bool],
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self.src = src
        self.dest = dest
        self.root = root
        self.source_root = source_root
        self.bandwidth = bandwidth if bandwidth and bandwidth > 0 else None
        self.keep = keep
        self.progress = progress
        self.stop = stop
        self.clock = clock
        self.sleep = sleep
        self.started_wall = time.time()
        self.t0 = clock()
        self.notes: list[str] = []
        self.keep_owner = os.geteuid() == 0
        self.owner_failed = False
        self.name = os.path.basename(dest)
        self.parent_shown = os.path.dirname(dest)
        self.token = secrets.token_hex(8)
        self.tmp = f".{self.name}{TEMP_TAG}{self.token}.tmp"
        self.tmp_manifest = f".{self.name}{TEMP_TAG}{self.token}.manifest"
        self.read_bytes = 0

    def result(self, outcome: str, error: str | None, entries: Sequence[_Entry] = (), **kw: Any) -> SyncResult:
        files = [e for e in entries if e.kind == "file"]
        return SyncResult(
            ok=outcome in OK_OUTCOMES,
            source=self.src,
            dest=self.dest,
            bytes=sum(e.st.st_size for e in files),
            files=len(files),
            seconds=self.clock() - self.t0,
            error=error,
            manifest=kw.pop("manifest", None),
            outcome=outcome,
            notes=tuple(self.notes),
            started=self.started_wall,
            **kw,
        )

    # -- the source

    def open_source(self) -> tuple[int, _Entry]:
        """A descriptor of the source's directory and the source's top entry (never a symlink)."""
        parent, base = os.path.split(self.src)
        if not base:
            raise SyncRefused(f"{self.src!r} names no file or directory")
        if self.source_root is not None:
            rel = os.path.relpath(parent, self.source_root)
            if rel == ".." or rel.startswith("../") or os.path.isabs(rel):
                raise SyncRefused(f"{self.src!r} is not below its source root {self.source_root!r}")
            parent_fd = _open_below(self.source_root, "" if rel == "." else rel, False, self.src)
        else:
            parent_fd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            st = os.stat(base, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            os.close(parent_fd)
            raise SyncRefused(f"{self.src!r}: no such file or directory") from None
        kind = _kind(st.st_mode)
        if kind in (None, "link"):
            os.close(parent_fd)
            raise SyncRefused(f"{self.src!r} is {_what(st.st_mode)}: name a checkpoint file or directory itself")
        return parent_fd, _Entry((), kind, st)

    def list_source(self, parent_fd: int, top: _Entry) -> tuple[list[_Entry], int | None]:
        """The source's entries, and a descriptor of its top when it is a directory."""
        if top.kind == "file":
            return [top], None
        fd = os.open(os.path.basename(self.src), _DIR_FLAGS, dir_fd=parent_fd)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (top.st.st_dev, top.st.st_ino):
                raise _Abort("source_changed", f"{self.src} was replaced while it was opened")
            entries = _walk(fd, top, self.src)
            _check_links(entries, self.src)
        except BaseException:
            os.close(fd)
            raise
        return entries, fd

    # -- the destination

    def open_dest_dir(self) -> int:
        if not self.name or self.name in (".", ".."):
            raise SyncRefused(f"{self.dest!r} names no file or directory to make")
        if TEMP_TAG in self.name or self.name.endswith(MANIFEST_SUFFIX):
            raise SyncRefused(f"{self.dest!r} could be taken for storwatch's own temporaries or manifests")
        if self.root is not None:
            rel = os.path.relpath(self.parent_shown, self.root)
            if rel == ".." or rel.startswith("../") or os.path.isabs(rel) or self.dest == self.root:
                raise SyncRefused(f"{self.dest!r} is not below the sync destination {self.root!r}")
            return _open_below(self.root, "" if rel == "." else rel, True, self.dest)
        try:
            return os.open(self.parent_shown or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SyncRefused(f"{self.parent_shown!r}: no such directory (DEST's directory must exist)") from None
        except NotADirectoryError:
            raise SyncRefused(f"{self.parent_shown!r} is not a directory") from None

    # -- the copy

    def run(self) -> SyncResult:
        src_parent, top = self.open_source()
        src_top: int | None = None
        try:
            entries, src_top = self.list_source(src_parent, top)
            dest_dir = self.open_dest_dir()
            try:
                with _dir_lock(dest_dir, self.stop):
                    return self.into(dest_dir, src_parent, src_top, entries)
            finally:
                os.close(dest_dir)
        finally:
            if src_top is not None:
                os.close(src_top)
            os.close(src_parent)

    def into(self, dest_dir: int, src_parent: int, src_top: int | None, entries: list[_Entry]) -> SyncResult:
        problems: list[str] = []
        _clean_leftovers(dest_dir, problems)
        self.notes += [f"a leftover of an earlier copy could not be removed: {p}" for p in problems]
        state = [_identity(self.manifest_entry(e)) for e in entries]
        replacing = False
        try:
            there = os.stat(self.name, dir_fd=dest_dir, follow_symlinks=False)
        except FileNotFoundError:
            there = None
        if there is not None:
            manifest = _ours(dest_dir, self.name)
            if manifest is None:
                raise SyncRefused(
                    f"{self.dest} exists and is not a copy storwatch made (no manifest of ours describes it): "
                    "left as it is"
                )
            recorded = [_identity(e) for e in manifest["entries"] if isinstance(e, dict)]
            if recorded == state and manifest.get("source") == self.src:
                removed = self.retain(dest_dir)
                return self.result(
                    "unchanged",
                    None,
                    entries,
                    manifest=self.dest + MANIFEST_SUFFIX,
                    removed=tuple(removed),
                )
            replacing = True
        total = sum(e.st.st_size for e in entries if e.kind == "file")
        vfs = os.fstatvfs(dest_dir)
        free = vfs.f_bavail * vfs.f_frsize
        needed = total + 4096 * len(entries)
        if needed > free:
            raise _Abort(
                "no_space",
                f"{self.parent_shown} has {free} bytes free for unprivileged use; the copy needs {needed}: nothing "
                "was written",
            )
        try:
            self.write_all(dest_dir, src_parent, src_top, entries, total)
            self.check_source_again(src_parent, src_top, entries)
            tmp_ino = os.stat(self.tmp, dir_fd=dest_dir, follow_symlinks=False).st_ino
            finished = time.time()
            self.write_manifest(dest_dir, entries, tmp_ino, finished)
            self.commit(dest_dir, replacing)
        except BaseException:
            for name in (self.tmp, self.tmp_manifest):
                with contextlib.suppress(OSError):
                    _remove_tree(dest_dir, name)
            raise
        removed = self.retain(dest_dir)
        return self.result(
            "verified",
            None,
            entries,
            manifest=self.dest + MANIFEST_SUFFIX,
            written_bytes=total,
            removed=tuple(removed),
        )

    def retain(self, dest_dir: int) -> list[str]:
        try:
            return _retain(dest_dir, self.keep, self.name, self.parent_shown)
        except OSError as err:
            self.notes.append(f"keep-{self.keep} retention stopped: {err.strerror or err} ({err.filename})")
            return []

    @staticmethod
    def manifest_entry(e: _Entry) -> dict[str, Any]:
        st = e.st
        out: dict[str, Any] = {"path": e.path, "type": e.kind, "mtime_ns": st.st_mtime_ns}
        if e.kind == "file":
            out["size"] = st.st_size
        if e.kind == "link":
            out["target"] = e.target
        out.update(mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid)
        if e.kind == "file":
            out[HASH_NAME] = e.digest
        return out

    def write_all(self, dest_dir: int, src_parent: int, src_top: int | None, entries: list[_Entry], total: int) -> None:
        is_dir = entries[0].kind == "dir"
        tmp_top: int | None = None
        if is_dir:
            os.mkdir(self.tmp, 0o700, dir_fd=dest_dir)
            tmp_top = os.open(self.tmp, _DIR_FLAGS, dir_fd=dest_dir)
        try:
            self.write_files(dest_dir, src_parent, src_top, tmp_top, entries, total)
            self.apply_dir_meta(dest_dir, tmp_top, entries)
        finally:
            if tmp_top is not None:
                os.close(tmp_top)

    def write_files(
        self,
        dest_dir: int,
        src_parent: int,
        src_top: int | None,
        tmp_top: int | None,
        entries: list[_Entry],
        total: int,
    ) -> None:
        expect = {e.rel: e.st for e in entries if e.kind == "dir"}
        src_dirs = _Dirs(src_top, expect) if src_top is not None else None
        dest_dirs = _Dirs(tmp_top) if tmp_top is not None else None
        pipeline = _Pipeline()
        jobs: list[_FileJob] = []
        started = self.clock()
        try:

            def dest_place(rel: tuple[str, ...]) -> tuple[int, str]:
                if not rel:
                    return dest_dir, self.tmp
                assert dest_dirs is not None
                return dest_dirs.fd(rel[:-1]), rel[-1]

            def src_place(rel: tuple[str, ...]) -> tuple[int, str]:
                if not rel:
                    return src_parent, os.path.basename(self.src)
                assert src_dirs is not None
                return src_dirs.fd(rel[:-1]), rel[-1]

            later = []
            for e in entries:
                if not e.rel and e.kind == "dir":
                    continue
                if e.kind == "dir":
                    fd, name = dest_place(e.rel)
                    os.mkdir(name, 0o700, dir_fd=fd)
                elif e.kind == "link":
                    fd, name = dest_place(e.rel)
                    assert e.target is not None
                    os.symlink(e.target, name, dir_fd=fd)
                elif e.rel and e.rel[-1] in MARKERS:
                    later.append(e)
                else:
                    self.copy_file(e, src_place, dest_place, pipeline, total, started, jobs)
            for e in later:
                # Markers only once every other file is written, read back and fsynced: a reader that trusts a
                # marker never meets a file still being written, even inside the temporary.
                self.wait_jobs(jobs, pipeline)
                self.copy_file(e, src_place, dest_place, pipeline, total, started, jobs)
            pipeline.finish(self.stop)
            self.wait_jobs(jobs, pipeline)
        finally:
            pipeline.shutdown()  # before any descriptor it writes is closed (a number closed could be reused)
            for job in jobs:
                for fd in (job.fd, job.verify_fd):
                    with contextlib.suppress(OSError):
                        os.close(fd)
            if src_dirs is not None:
                src_dirs.close()
            if dest_dirs is not None:
                dest_dirs.close()

    def wait_jobs(self, jobs: Sequence[_FileJob], pipeline: _Pipeline) -> None:
        for job in jobs:
            while not job.done.wait(0.1):
                pipeline.check()
                if self.stop():
                    raise _Abort("stopped", "stopped before the copy was complete")
            pipeline.check()

    def copy_file(
        self,
        e: _Entry,
        src_place: Callable[[tuple[str, ...]], tuple[int, str]],
        dest_place: Callable[[tuple[str, ...]], tuple[int, str]],
        pipeline: _Pipeline,
        total: int,
        started: float,
        jobs: list[_FileJob],
    ) -> None:
        sfd, sname = src_place(e.rel)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            src = os.open(sname, flags | _O_NOATIME, dir_fd=sfd)
        except PermissionError:
            src = os.open(sname, flags, dir_fd=sfd)  # O_NOATIME needs the file's owner (or CAP_FOWNER)
        except OSError as err:
            if err.errno in (errno.ENOENT, errno.ELOOP):
                raise _Abort("source_changed", f"{e.path} went away or was replaced during the copy") from None
            raise
        try:
            before = os.fstat(src)
            self.same(e, before)
            dfd, dname = dest_place(e.rel)
            out = os.open(dname, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            try:
                vfd = os.open(dname, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                vst, ost = os.fstat(vfd), os.fstat(out)
                if (vst.st_dev, vst.st_ino) != (ost.st_dev, ost.st_ino):
                    os.close(vfd)
                    raise _Abort("failed", f"{e.path}: the copy was replaced while it was opened")
            except BaseException:
                os.close(out)
                raise
            job = _FileJob(e, out, vfd, e.st.st_size)
            jobs.append(job)  # its descriptors closed with the others, once no thread of the pipeline touches them
            with contextlib.suppress(OSError):
                os.posix_fadvise(src, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            hasher = xxhash.xxh3_128()
            view = memoryview(pipeline.buf)
            try:
                offset = 0
                while True:
                    if self.stop():
                        raise _Abort("stopped", "stopped before the copy was complete")
                    pipeline.check()
                    n = _read_full(src, view)
                    if n == 0:
                        break
                    if offset + n > job.size:
                        raise _Abort("source_changed", f"{e.path} grew during the copy")
                    hasher.update(view[:n])
                    written = 0
                    while written < n:
                        written += os.pwrite(out, view[written:n], offset + written)
                    pipeline.written(job, offset, n, self.stop)
                    offset += n
                    self.read_bytes += n
                    if self.progress is not None:
                        self.progress(self.read_bytes, total)
                    self.throttle(started)
            finally:
                view.release()
            after = os.fstat(src)
            if offset != job.size:
                raise _Abort("source_changed", f"{e.path} shrank during the copy ({offset} of {job.size} bytes)")
            self.same(e, after)
            job.expected = hasher.hexdigest()
            self.apply_file_meta(job)
            pipeline.close_file(job, self.stop)
        finally:
            os.close(src)

    def same(self, e: _Entry, st: os.stat_result) -> None:
        listed = e.st
        if (st.st_dev, st.st_ino) != (listed.st_dev, listed.st_ino) or not stat.S_ISREG(st.st_mode):
            raise _Abort("source_changed", f"{e.path} was replaced during the copy")
        if (st.st_size, st.st_mtime_ns, st.st_ctime_ns) != (listed.st_size, listed.st_mtime_ns, listed.st_ctime_ns):
            raise _Abort("source_changed", f"{e.path} changed during the copy (size, mtime or ctime)")

    def throttle(self, started: float) -> None:
        if self.bandwidth is None:
            return
        due = started + self.read_bytes / self.bandwidth
        while True:
            left = due - self.clock()
            if left <= 0:
                return
            if self.stop():
                raise _Abort("stopped", "stopped before the copy was complete")
            self.sleep(min(left, 0.1))

    def apply_file_meta(self, job: _FileJob) -> None:
        st = job.entry.st
        os.fchmod(job.fd, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
        os.utime(job.fd, ns=(st.st_atime_ns, st.st_mtime_ns))
        if self.keep_owner:
            self.chown(os.fchown, job.fd, st.st_uid, st.st_gid)

    def chown(self, call: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        try:
            call(*args, **kwargs)
        except PermissionError as err:
            if not self.owner_failed:
                self.owner_failed = True
                self.notes.append(f"the owner was not kept: the destination refused it ({err.strerror})")

    def apply_dir_meta(self, dest_dir: int, tmp_top: int | None, entries: Sequence[_Entry]) -> None:
        """Links' and directories' times and owners, and directories' modes, deepest first (a directory's mode and
        times last, after what is made in it); then every directory fsynced."""
        if tmp_top is None:
            os.fsync(dest_dir)
            return
        dirs = _Dirs(tmp_top)
        try:
            for e in sorted(entries, key=lambda e: len(e.rel), reverse=True):
                if e.kind == "file":
                    continue
                st = e.st
                fd, name = (dirs.fd(e.rel[:-1]), e.rel[-1]) if e.rel else (dest_dir, self.tmp)
                if e.kind == "link":
                    os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=fd, follow_symlinks=False)
                    if self.keep_owner:
                        self.chown(os.chown, name, st.st_uid, st.st_gid, dir_fd=fd, follow_symlinks=False)
                    continue
                dfd = tmp_top if not e.rel else os.open(name, _DIR_FLAGS, dir_fd=fd)
                try:
                    os.fsync(dfd)
                    os.fchmod(dfd, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
                    os.utime(dfd, ns=(st.st_atime_ns, st.st_mtime_ns))
                    if self.keep_owner:
                        self.chown(os.fchown, dfd, st.st_uid, st.st_gid)
                    os.fsync(dfd)
                finally:
                    if dfd != tmp_top:
                        os.close(dfd)
        finally:
            dirs.close()
        if not self.keep_owner and "owner" not in " ".join(self.notes):
            self.notes.append("the owner was not kept: not running as root (CAP_CHOWN)")

    def check_source_again(self, src_parent: int, src_top: int | None, entries: list[_Entry]) -> None:
        """The whole source listed again: any entry added, gone or changed since the first listing aborts."""
        st = os.stat(os.path.basename(self.src), dir_fd=src_parent, follow_symlinks=False)
        top = _Entry((), entries[0].kind, st)
        again = [top] if src_top is None else _walk(src_top, top, self.src)
        if [e.state() for e in again] != [e.state() for e in entries]:
            raise _Abort(
                "source_changed",
                f"{self.src} changed during the copy (an entry was added, removed or "
                "changed): nothing was put in place",
            )

    def write_manifest(self, dest_dir: int, entries: Sequence[_Entry], inode: int, finished: float) -> None:
        manifest = {
            "storwatch_sync": MANIFEST_VERSION,
            "source": self.src,
            "dest": self.dest,
            "inode": inode,
            "hash": HASH_NAME,
            "started": self.started_wall,
            "finished": finished,
            "seconds": self.clock() - self.t0,
            "bytes": sum(e.st.st_size for e in entries if e.kind == "file"),
            "files": sum(1 for e in entries if e.kind == "file"),
            "owner_kept": self.keep_owner and not self.owner_failed,
            "host": os.uname().nodename,
            "entries": [self.manifest_entry(e) for e in entries],
        }
        data = json.dumps(manifest, indent=1, allow_nan=False).encode()
        fd = os.open(
            self.tmp_manifest,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=dest_dir,
        )
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)

    def commit(self, dest_dir: int, replacing: bool) -> None:
        """Rename the copy into place, then its manifest; fsync the directory."""
        if replacing:
            try:
                _renameat2(dest_dir, self.tmp, self.name, RENAME_EXCHANGE)
            except OSError as err:
                if err.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                # No atomic exchange here (NFS, FUSE): the earlier copy moved aside first, DEST absent meanwhile.
                aside = f".{self.name}{TEMP_TAG}{self.token}.old"
                os.rename(self.name, aside, src_dir_fd=dest_dir, dst_dir_fd=dest_dir)
                os.rename(self.tmp, self.name, src_dir_fd=dest_dir, dst_dir_fd=dest_dir)
                os.rename(aside, self.tmp, src_dir_fd=dest_dir, dst_dir_fd=dest_dir)
            # The earlier copy is now at the temporary name.
            os.rename(self.tmp_manifest, self.name + MANIFEST_SUFFIX, src_dir_fd=dest_dir, dst_dir_fd=dest_dir)
            os.fsync(dest_dir)
            _remove_tree(dest_dir, self.tmp)
            os.fsync(dest_dir)
            return
        try:
            _renameat2(dest_dir, self.tmp, self.name, RENAME_NOREPLACE)
        except OSError as err:
            if err.errno == errno.EEXIST:
                raise SyncRefused(f"{self.dest} appeared during the copy: left as it is") from None
            if err.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            try:
                os.stat(self.name, dir_fd=dest_dir, follow_symlinks=False)
            except FileNotFoundError:
                os.rename(self.tmp, self.name, src_dir_fd=dest_dir, dst_dir_fd=dest_dir)
            else:
                raise SyncRefused(f"{self.dest} appeared during the copy: left as it is") from None
        os.rename(self.tmp_manifest, self.name + MANIFEST_SUFFIX, src_dir_fd=dest_dir, dst_dir_fd=dest_dir)
        os.fsync(dest_dir)


def copy_verified(
    src: str,
    dest: str,
    *,
    bandwidth: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    stop: Callable[[], bool] | None = None,
    root: str | None = None,
    source_root: str | None = None,
    keep: int = 0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> SyncResult:
    """Copy ``src`` (a file or a directory) to ``dest``, its final path, verified (see the module's docstring).

    ``bandwidth``: bytes per second read, at most (None or 0: unlimited). ``progress(done, total)``: bytes read so
    far, after each chunk, on the copying thread. ``stop()``: asked after each chunk; True aborts (``stopped``).
    ``root``: the allowlisted root ``dest`` lies below (every directory from it down opened with O_NOFOLLOW, made
    where missing); without it ``dest``'s directory must exist and is opened as named, as ``cp`` would.
    ``source_root``: a trusted directory above ``src``, opened the same way down to it. ``keep``: verified copies
    of ours kept in ``dest``'s directory (0: all). ``clock`` and ``sleep`` pace the bandwidth limit. Never raises
    for a copy that could not be made: the result says how it ended (``outcome``, ``error``)."""
    src = os.path.abspath(src)
    dest = os.path.abspath(dest)
    copy = _Copy(src, dest, root, source_root, bandwidth, keep, progress, stop or (lambda: False), clock, sleep)
    try:
        return copy.run()
    except SyncRefused as err:
        return copy.result("refused", str(err))
    except _Abort as err:
        return copy.result(err.outcome, str(err))
    except OSError as err:
        where = f" ({err.filename})" if err.filename else ""
        if err.errno == errno.ENOSPC:
            return copy.result("no_space", f"the destination ran out of space{where}: nothing was put in place")
        return copy.result("failed", f"{err.strerror or err}{where}")


# --------------------------------------------------------------------------------------------------------------------
# The helper process and the worker that runs it


STATES = ("queued", "running", "done", "failed", "abandoned")


@dataclass(frozen=True)
class SyncJob:
    """A job as :meth:`SyncWorker.status` sees it."""

    job_id: int
    source: str
    dest: str
    state: str
    """One of STATES: ``done`` is a verified copy (made or already there), ``failed`` any other end the copy
    reported, ``abandoned`` a job whose helper was killed (past its deadline, cancelled, the worker closed)."""
    bytes_done: int = 0
    bytes_total: int = 0
    submitted: float = 0.0
    """Wall-clock times (seconds since the epoch); 0 until they happen."""
    started: float = 0.0
    finished: float = 0.0
    deadline_seconds: float = 0.0
    result: SyncResult | None = None


@dataclass
class _Job:
    job_id: int
    source: str
    dest: str
    root: str | None
    source_root: str | None
    deadline_seconds: float
    keep: int
    bandwidth: float | None
    submitted: float
    state: str = "queued"
    bytes_done: int = 0
    bytes_total: int = 0
    started: float = 0.0
    started_mono: float = 0.0
    finished: float = 0.0
    result: SyncResult | None = None
    proc: subprocess.Popen[bytes] | None = None
    cancel_at: float | None = None
    """When a job asked to stop is killed, if its helper has not ended by then (monotonic)."""
    cancel_why: str = ""


def helper_command() -> list[str]:
    """How a copy's helper process is started: isolated (``-I``), this tree first on ``sys.path``."""
    tree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"import sys; sys.path.insert(0, {tree!r}); from storwatch.sync import helper_main; helper_main()"
    return [sys.executable, "-I", "-c", code]


class SyncWorker:
    """Runs copies in helper processes, each with a deadline, so a destination that hangs never blocks the caller.

    ``destinations``: the allowlist every DEST is checked against (by its text, in ``submit``); None takes any DEST
    whose directory exists, opened as named (the command line without ``sync.destinations``: a person's own copy,
    as ``cp`` would make it). Thread-safe; nothing here ever touches a file but the pipes."""

    def __init__(
        self,
        destinations: Destinations | None,
        *,
        deadline_seconds: float = 3600.0,
        bandwidth: float | None = None,
        keep: int = 0,
        max_parallel: int = 1,
        max_jobs_kept: int = 64,
        cancel_grace_seconds: float = 2.0,
        command: Sequence[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.destinations = destinations
        self.deadline_seconds = deadline_seconds
        self.bandwidth = bandwidth
        self.keep = keep
        self.max_parallel = max(1, max_parallel)
        self.max_jobs_kept = max_jobs_kept
        self.cancel_grace_seconds = cancel_grace_seconds
        self._command = list(command) if command is not None else helper_command()
        self._clock = clock
        self._wall = wall
        self._lock = threading.Condition()
        self._ids = itertools.count(1)
        self._jobs: dict[int, _Job] = {}
        self._queue: list[int] = []
        self._results: list[SyncResult] = []
        self._closed = False
        self._thread = threading.Thread(target=self._schedule, name="sync-worker", daemon=True)
        self._thread.start()

    # -- the caller's side

    def submit(
        self,
        src: str,
        dest: str,
        *,
        deadline_seconds: float | None = None,
        keep: int | None = None,
        bandwidth: float | None = None,
        source_root: str | None = None,
    ) -> int:
        """Queue a copy of ``src`` to ``dest`` (its final path); the job's id. Never blocks, never touches a file:
        a DEST outside the allowlist, or a worker closed, makes a job that has already failed (``refused`` or
        ``abandoned``)."""
        root: str | None = None
        refused: str | None = None
        if self.destinations is not None:
            # Judged by its text as given: a '..' or '.' in it is refused, never normalised away.
            dest = dest.rstrip("/") if len(dest) > 1 else dest
            try:
                root = self.destinations.check(dest)
            except SyncRefused as err:
                refused = str(err)
        src, dest = os.path.abspath(src), os.path.abspath(dest)
        with self._lock:
            job = _Job(
                job_id=next(self._ids),
                source=src,
                dest=dest,
                root=root,
                source_root=source_root,
                deadline_seconds=self.deadline_seconds if deadline_seconds is None else deadline_seconds,
                keep=self.keep if keep is None else keep,
                bandwidth=self.bandwidth if bandwidth is None else bandwidth,
                submitted=self._wall(),
            )
            self._jobs[job.job_id] = job
            if refused is not None:
                self._finish(job, "failed", _failed(src, dest, "refused", refused))
            elif self._closed:
                self._finish(job, "abandoned", _failed(src, dest, "abandoned", "the sync worker is closed"))
            else:
                self._queue.append(job.job_id)
            self._forget()
            self._lock.notify_all()
            return job.job_id

    def status(self) -> list[SyncJob]:
        """Every job still remembered (queued and running ones, and the newest finished), oldest first."""
        with self._lock:
            return [self._snapshot(j) for j in sorted(self._jobs.values(), key=lambda j: j.job_id)]

    def job(self, job_id: int) -> SyncJob | None:
        with self._lock:
            j = self._jobs.get(job_id)
            return None if j is None else self._snapshot(j)

    def poll(self) -> list[SyncResult]:
        """The results of the jobs finished since the last poll, each once, in the order they finished."""
        with self._lock:
            out, self._results = self._results, []
            return out

    def wait(self, job_id: int, timeout: float | None = None) -> SyncJob | None:
        """The job once finished, or as it is when ``timeout`` seconds passed (None: until it finishes)."""
        end = None if timeout is None else self._clock() + timeout
        with self._lock:
            while True:
                j = self._jobs.get(job_id)
                if j is None:
                    return None
                if j.state not in ("queued", "running"):
                    return self._snapshot(j)
                left = None if end is None else end - self._clock()
                if left is not None and left <= 0:
                    return self._snapshot(j)
                self._lock.wait(0.25 if left is None else min(left, 0.25))

    def cancel(self, job_id: int, why: str = "cancelled") -> None:
        """Drop a queued job; ask a running one to stop (its copy removes its temporaries), and kill its helper if
        it has not ended within ``cancel_grace_seconds``."""
        with self._lock:
            j = self._jobs.get(job_id)
            if j is None:
                return
            if j.state == "queued":
                self._queue.remove(job_id)
                self._finish(j, "abandoned", _failed(j.source, j.dest, "stopped", f"{why} before it started"))
            elif j.state == "running" and j.cancel_at is None:
                j.cancel_at = self._clock() + self.cancel_grace_seconds
                j.cancel_why = why
                if j.proc is not None and j.proc.stdin is not None:
                    with contextlib.suppress(OSError):
                        j.proc.stdin.close()
            self._lock.notify_all()

    def close(self, grace: float = 0.0) -> None:
        """Stop: queued jobs abandoned, running ones asked to stop, and killed if still running after ``grace``
        seconds. Returns within ``grace`` + about half a second, whatever the helpers are stuck in: a helper that
        does not die at once (stuck in the kernel) is left to a reaper thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for job_id in list(self._queue):
                j = self._jobs[job_id]
                self._finish(j, "abandoned", _failed(j.source, j.dest, "abandoned", "the sync worker closed"))
            self._queue.clear()
            running = [j for j in self._jobs.values() if j.state == "running"]
            for j in running:
                if j.proc is not None and j.proc.stdin is not None:
                    with contextlib.suppress(OSError):
                        j.proc.stdin.close()
            self._lock.notify_all()
        end = self._clock() + grace
        with self._lock:
            while any(j.state == "running" for j in running) and self._clock() < end:
                self._lock.wait(min(0.05, max(0.0, end - self._clock())))
            for j in running:
                if j.state == "running":
                    self._kill(j, "abandoned", "the sync worker closed while the copy ran: its helper was killed")
            self._lock.notify_all()
        self._thread.join(0.2)

    # -- the scheduler

    def _snapshot(self, j: _Job) -> SyncJob:
        return SyncJob(
            job_id=j.job_id,
            source=j.source,
            dest=j.dest,
            state=j.state,
            bytes_done=j.bytes_done,
            bytes_total=j.bytes_total,
            submitted=j.submitted,
            started=j.started,
            finished=j.finished,
            deadline_seconds=j.deadline_seconds,
            result=j.result,
        )

    def _finish(self, j: _Job, state: str, result: SyncResult) -> None:
        j.state = state
        j.finished = self._wall()
        j.result = dataclasses.replace(result, job_id=j.job_id)
        self._results.append(j.result)
        if len(self._results) > 4 * self.max_jobs_kept:  # a caller that never polls keeps only the newest
            del self._results[: len(self._results) - 4 * self.max_jobs_kept]
        self._lock.notify_all()

    def _forget(self) -> None:
        done = [j for j in self._jobs.values() if j.state not in ("queued", "running")]
        for j in sorted(done, key=lambda j: j.job_id)[: max(0, len(done) - self.max_jobs_kept)]:
            del self._jobs[j.job_id]

    def _schedule(self) -> None:
        with self._lock:
            while not self._closed:
                now = self._clock()
                running = [j for j in self._jobs.values() if j.state == "running"]
                for j in running:
                    if j.cancel_at is not None and now >= j.cancel_at:
                        self._kill(j, "abandoned", f"{j.cancel_why}: its helper did not stop in time and was killed")
                    elif now - j.started_mono > j.deadline_seconds:
                        self._kill(
                            j,
                            "abandoned",
                            f"past its deadline of {j.deadline_seconds:g} s (the destination may hang): its helper "
                            "was killed",
                        )
                while self._queue and sum(j.state == "running" for j in self._jobs.values()) < self.max_parallel:
                    self._start(self._jobs[self._queue.pop(0)])
                upcoming = [
                    min(j.started_mono + j.deadline_seconds, j.cancel_at or math.inf)
                    for j in self._jobs.values()
                    if j.state == "running"
                ]
                wake = min(upcoming, default=now + 1.0)
                self._lock.wait(max(0.01, min(1.0, wake - now)))

    def _start(self, j: _Job) -> None:
        request = {
            "source": j.source,
            "dest": j.dest,
            "root": j.root,
            "source_root": j.source_root,
            "bandwidth": j.bandwidth,
            "keep": j.keep,
        }
        j.state = "running"
        j.started = self._wall()
        j.started_mono = self._clock()
        try:
            proc = subprocess.Popen(
                self._command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,  # a terminal's Ctrl-C reaches the caller, which asks the helper to stop
            )
        except OSError as err:
            self._finish(j, "failed", _failed(j.source, j.dest, "failed", f"cannot start the sync helper: {err}"))
            return
        j.proc = proc
        assert proc.stdin is not None
        try:
            # One short line: it fits the pipe's buffer, so this never blocks on a helper that does not read.
            proc.stdin.write((json.dumps(request, allow_nan=False) + "\n").encode())
            proc.stdin.flush()
        except OSError:
            pass  # the helper died at once: its reader says so
        threading.Thread(target=self._read, args=(j, proc), name=f"sync-job-{j.job_id}", daemon=True).start()

    def _read(self, j: _Job, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        result: SyncResult | None = None
        problem = ""
        for raw in proc.stdout:
            try:
                message = json.loads(raw)
                if "progress" in message:
                    done, total = message["progress"]
                    if isinstance(done, int) and isinstance(total, int):
                        with self._lock:
                            j.bytes_done, j.bytes_total = done, total
                elif "result" in message:
                    result = SyncResult.from_dict(message["result"])
            except (ValueError, TypeError, KeyError) as err:
                problem = f"the sync helper answered something unreadable: {err}"
        code = proc.wait()
        with self._lock:
            if j.state != "running":
                return
            if result is not None:
                self._finish(j, "done" if result.ok else "failed", result)
            else:
                why = problem or f"the sync helper ended ({_exit_text(code)}) without a result"
                self._finish(j, "failed", _failed(j.source, j.dest, "failed", why))
            self._forget()
            self._lock.notify_all()

    def _kill(self, j: _Job, state: str, why: str) -> None:
        proc = j.proc
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()
            threading.Thread(target=proc.wait, name=f"sync-reap-{j.job_id}", daemon=True).start()
        seconds = self._clock() - j.started_mono if j.started_mono else 0.0
        self._finish(j, state, _failed(j.source, j.dest, "abandoned", why, seconds, j.started))
        self._forget()


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def helper_main() -> None:
    """The helper: one request line in, progress and the result as JSON lines out. Its standard input closing (the
    caller cancelled, closed, or died) stops the copy at its next chunk."""
    line = sys.stdin.buffer.readline()
    stopped = threading.Event()

    def watch() -> None:
        with contextlib.suppress(OSError):
            while sys.stdin.buffer.read(4096):
                pass
        stopped.set()

    threading.Thread(target=watch, name="sync-stdin", daemon=True).start()
    out = sys.stdout.buffer
    last = [0.0]

    def emit(message: Mapping[str, Any]) -> None:
        with contextlib.suppress(OSError):
            out.write((json.dumps(message, allow_nan=False) + "\n").encode())
            out.flush()

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.2 or done >= total:
            last[0] = now
            emit({"progress": [done, total]})

    try:
        request = json.loads(line)
        result = copy_verified(
            request["source"],
            request["dest"],
            root=request.get("root"),
            source_root=request.get("source_root"),
            bandwidth=request.get("bandwidth"),
            keep=int(request.get("keep") or 0),
            progress=progress,
            stop=stopped.is_set,
        )
    except Exception as err:  # a bug must still come back as a result, not a silent exit
        result = _failed("", "", "failed", f"{type(err).__name__}: {err}")
    emit({"result": result.to_dict()})
    os._exit(0)
