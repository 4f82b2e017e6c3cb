"""A verified copy as it lies on disk: the names storwatch sync gives what it writes beside DEST, its manifest (read
bounded, and checked to describe the copy it sits beside), and the walk that finds the copies below a durable root.
The copy engine (storwatch/sync/) writes them; the copies source (sources/copies.py) reads them, in its helper
process. Standard library only."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MANIFEST_SUFFIX = ".storwatch-sync.json"
"""A verified copy's manifest is put beside it as ``NAME`` + this."""
TEMP_TAG = ".storwatch-sync-"
TEMP_NAME = re.compile(
    r"\.(?P<name>.+)\.storwatch-sync-(?P<token>[0-9a-f]{16})\.(?P<kind>tmp|manifest|old|gone)", re.DOTALL
)
"""What a copy writes before its commit, by kind: ``tmp`` (the copy being made), ``manifest`` (its manifest, written
once the copy is verified), ``old`` (the earlier copy at DEST, moved aside where no atomic exchange exists), ``gone``
(a copy keep-N retention removes)."""
MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 128 << 20
NAME_MAX = 255
SUMMARY_BYTES = 256 << 10
"""A manifest's fields before its list of entries are read from at most this much of its start (the entries, one
per file of the copy, can run to megabytes)."""


def temp_name(name: str, token: str, kind: str) -> str:
    return f".{name}{TEMP_TAG}{token}.{kind}"


def is_ours(name: str) -> bool:
    """Whether a name could be taken for one storwatch gives its own files (a temporary or a manifest)."""
    return TEMP_TAG in name or name.endswith(MANIFEST_SUFFIX)


def _kind(mode: int) -> str | None:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "link"
    return None


def read_manifest(dir_fd: int, name: str) -> dict[str, Any] | None:
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


def identity(entry: Mapping[str, Any]) -> dict[str, Any]:
    """What says a listed entry is the one a manifest recorded (not its hash, mode or owner)."""
    return {k: entry[k] for k in _IDENTITY if k in entry}


def manifest_run(manifest: Mapping[str, Any]) -> str | None:
    """The run a manifest's copy is of: what the copy recorded, or (a manifest written before runs were recorded)
    the directory holding its source."""
    run = manifest.get("run")
    if isinstance(run, str):
        return run
    source = manifest.get("source")
    return os.path.dirname(source) if isinstance(source, str) else None


def describes(manifest: Mapping[str, Any] | None, dir_fd: int, name: str) -> bool:
    """Whether ``manifest`` describes the copy at ``name``: the same inode, and the same type and mtime of its top (an
    inode number alone could have been reused by something else since)."""
    if manifest is None or not manifest["entries"] or not isinstance(manifest["entries"][0], dict):
        return False
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    top = manifest["entries"][0]
    same = (st.st_ino, _kind(st.st_mode), st.st_mtime_ns) == (manifest["inode"], top.get("type"), top.get("mtime_ns"))
    return same


def ours(dir_fd: int, name: str) -> dict[str, Any] | None:
    """The manifest of the copy at ``name``, when the copy there is the one it describes."""
    manifest = read_manifest(dir_fd, name + MANIFEST_SUFFIX)
    return manifest if describes(manifest, dir_fd, name) else None


# ----------------------------------------------------------------------------------------------------------------------
# Copies found below a durable root


@dataclass(frozen=True)
class FoundCopy:
    """One verified copy of ours, as its manifest describes it."""

    dest: str
    """The copy, as the walk reached it."""
    source: str
    """The checkpoint it is a copy of, as the copier reached it."""
    run: str
    """The run the checkpoint belongs to, as the copier reached it."""
    covers: float | None
    """The source's newest modification time when it was copied (UNIX seconds): the save the copy protects; None in
    a manifest that does not say."""
    finished: float
    """When the copy was put in place."""
    bytes: int
    files: int


def _summary(dir_fd: int, name: str) -> dict[str, Any] | None:
    """A manifest's fields before its entries (and its first entry, the copy's top), read from its first
    SUMMARY_BYTES: our own writer puts ``"entries"`` last, and a JSON string never holds an unescaped quote, so the
    text before ``,\n "entries": [`` is the rest of the object."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        # Ours only: the copy engine runs as root and leaves its manifests root's and written by no one else; a
        # manifest anyone else could have written names whatever it likes.
        if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None
        head = os.read(fd, SUMMARY_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    cut = head.find(b',\n "entries": [')
    if cut < 0:
        return None
    rest = head[cut + len(b',\n "entries": [') :].decode("utf-8", "replace").lstrip()
    try:
        data = json.loads(head[:cut] + b"}")
        top, _ = json.JSONDecoder().raw_decode(rest)  # the first entry; what follows it is not read
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("storwatch_sync") != MANIFEST_VERSION or not isinstance(top, dict):
        return None
    data["entries"] = [top]
    return data


def _found(dir_fd: int, name: str, shown: str) -> FoundCopy | None:
    manifest = _summary(dir_fd, name + MANIFEST_SUFFIX)
    if manifest is None or not describes(manifest, dir_fd, name):
        return None
    source, run = manifest.get("source"), manifest_run(manifest)
    covers, finished = manifest.get("source_mtime"), manifest.get("finished")
    size, files = manifest.get("bytes"), manifest.get("files")
    if not isinstance(source, str) or run is None:
        return None
    number = (int, float)
    return FoundCopy(
        dest=shown,
        source=source,
        run=run,
        covers=float(covers) if isinstance(covers, number) and not isinstance(covers, bool) else None,
        finished=float(finished) if isinstance(finished, number) and not isinstance(finished, bool) else 0.0,
        bytes=size if isinstance(size, int) and not isinstance(size, bool) else 0,
        files=files if isinstance(files, int) and not isinstance(files, bool) else 0,
    )


def find_copies(
    root: str, max_depth: int = 8, max_entries: int = 100_000, max_seconds: float = 10.0
) -> tuple[list[FoundCopy], str | None]:
    """The verified copies of ours below ``root`` (a durable root: ``sync.destinations``), each described by its
    manifest, and what stopped the walk early (None when it went through). Directories are entered without
    following a link, a copy is never walked into, temporaries are passed by; bounded in depth, entries and time."""
    found: list[FoundCopy] = []
    seen = 0
    stop = time.monotonic() + max_seconds
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    stack: list[tuple[str, int, int]] = [(root.rstrip("/") or "/", os.open(root, flags), 0)]
    try:
        while stack:
            shown, fd, depth = stack.pop()
            try:
                names = os.listdir(fd)
                copies = {n[: -len(MANIFEST_SUFFIX)] for n in names if n.endswith(MANIFEST_SUFFIX)}
                for n in names:
                    seen += 1
                    if seen > max_entries:
                        return found, f"more than {max_entries} entries below {root}"
                    if time.monotonic() > stop:
                        return found, f"the walk of {root} took more than {max_seconds:g} s"
                    if n.endswith(MANIFEST_SUFFIX) or TEMP_NAME.fullmatch(n):
                        continue
                    path = f"{shown}/{n}"
                    if n in copies:
                        copy = _found(fd, n, path)
                        if copy is not None:
                            found.append(copy)
                            continue
                    if depth + 1 >= max_depth:
                        continue
                    try:
                        sub = os.open(n, flags, dir_fd=fd)
                    except OSError:
                        continue  # not a directory, a link, or gone
                    stack.append((path, sub, depth + 1))
            finally:
                os.close(fd)
    finally:
        for _, fd, _ in stack:
            os.close(fd)
    return found, None
