"""The source as listed, and what a checkpoint may hold: its entries (directories, files and symlinks only), walked
from a descriptor without following a link, bounded in entries and depth; symlinks judged as the kernel would
resolve them; and a tree removed without following a link."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from storwatch.nofollow import DIR_FLAGS, file_kind
from storwatch.sync.result import Abort, SyncRefused

MAX_ENTRIES = 200_000
"""Entries of a source beyond this, and the copy is refused (a tenant's tree is bounded like any of its data)."""
MAX_DEPTH = 64
MAX_LINK_HOPS = 40
"""Symlinks met while resolving one, at most (the kernel's own limit)."""


@dataclass
class Entry:
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


def kind_of(mode: int) -> str | None:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "link"
    return None


def walk(top_fd: int, top: Entry, shown: str) -> list[Entry]:
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
                    kind = kind_of(st.st_mode)
                    child = (*rel, name)
                    if kind is None:
                        raise SyncRefused(
                            f"{shown}/{'/'.join(child)} is {file_kind(st.st_mode)}: a checkpoint holds files, "
                            "directories and symbolic links only"
                        )
                    target = os.readlink(name, dir_fd=fd) if kind == "link" else None
                    entries.append(Entry(child, kind, st, target))
                    if len(entries) > MAX_ENTRIES:
                        raise SyncRefused(f"{shown} holds more than {MAX_ENTRIES} entries")
                    if kind == "dir":
                        if len(child) >= MAX_DEPTH:
                            raise SyncRefused(f"{shown} nests deeper than {MAX_DEPTH} directories")
                        subdirs.append(child)
                        dirs[child] = st
                for child in reversed(subdirs):
                    sub = os.open(child[-1], DIR_FLAGS, dir_fd=fd)
                    stack.append((child, sub))
                    sst = os.fstat(sub)
                    if (sst.st_dev, sst.st_ino) != (dirs[child].st_dev, dirs[child].st_ino):
                        raise Abort("source_changed", f"{shown}/{'/'.join(child)} was replaced while listed")
            except (FileNotFoundError, NotADirectoryError) as err:
                raise Abort("source_changed", f"{shown}: an entry went away while listed ({err.filename})") from None
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise Abort("source_changed", f"{shown}: a directory became a symbolic link while listed") from None
                raise
            finally:
                os.close(fd)
    finally:
        for _, fd in stack:
            os.close(fd)
    # Pre-order: a directory before its children (the stack gave depth-first order per directory; sort by path).
    entries[1:] = sorted(entries[1:], key=lambda e: e.rel)
    return entries


def check_links(entries: Sequence[Entry], shown: str) -> None:
    """Refuse a symlink that is absolute or that, resolved as the kernel would against the tree as listed, leads out
    of the checkpoint: the copy must hold the checkpoint and nothing outside it.

    Each component is resolved from the directory reached so far: a link met on the way is replaced by where its own
    target leads (at most MAX_LINK_HOPS links in all) before the next component applies, so ``..`` after a link
    climbs from the link's target, not from the link's name (``a -> .`` then ``b -> a/a/../../x`` climbs twice from
    the top). A component that names nothing listed, or a file with more to follow, ends the resolution where the
    kernel's would end (ENOENT, ENOTDIR): what follows it is never reached, here or in the copy."""
    kinds = {e.rel: e.kind for e in entries}
    links = {e.rel: e.target for e in entries if e.kind == "link"}

    def resolve(start: tuple[str, ...], target: str, hops: list[int], where: str) -> tuple[str, ...] | None:
        """Where ``target``, read in the directory ``start``, leads: a path below the top, or None where the
        kernel's resolution would stop inside the checkpoint."""
        if target.startswith("/"):
            raise SyncRefused(
                f"{where} is a symbolic link to the absolute path {target!r}: it leads out of the checkpoint"
            )
        path = start
        comps = [c for c in target.split("/") if c not in ("", ".")]
        for i, comp in enumerate(comps):
            if comp == "..":
                if not path:
                    raise SyncRefused(f"{where} is a symbolic link ({target!r}) that leads out of the checkpoint")
                path = path[:-1]
                continue
            here = (*path, comp)
            kind = kinds.get(here)
            if kind == "link":
                hops[0] += 1
                if hops[0] > MAX_LINK_HOPS:
                    raise SyncRefused(f"{where}: more than {MAX_LINK_HOPS} symbolic links in a row")
                inner = links[here]
                assert inner is not None
                reached = resolve(path, inner, hops, where)
                if reached is None:
                    return None
                path = reached
            elif kind == "dir" or (kind == "file" and i == len(comps) - 1):
                path = here
            else:
                return None
        return path

    for rel, target in links.items():
        assert target is not None
        if not rel:
            raise SyncRefused(f"{shown} is a symbolic link: name what it points to")
        resolve(rel[:-1], target, [0], f"{shown}/{'/'.join(rel)}")


class Dirs:
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
            fd = os.open(rel[i], DIR_FLAGS, dir_fd=parent)
            self.stack.append((rel[i], fd))
            if self.expect is not None:
                listed = self.expect.get(rel[: i + 1])
                st = os.fstat(fd)
                if listed is None or (st.st_dev, st.st_ino) != (listed.st_dev, listed.st_ino):
                    raise Abort("source_changed", f"the directory {'/'.join(rel[: i + 1])} changed during the copy")
        return self.stack[-1][1] if self.stack else self.top

    def close(self) -> None:
        for _, fd in reversed(self.stack):
            os.close(fd)
        self.stack.clear()


def remove_tree(dir_fd: int, name: str, depth: int = 0) -> None:
    """Remove ``name`` below ``dir_fd`` and everything in it, never following a link."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    if depth > MAX_DEPTH * 2:
        raise OSError(errno.ELOOP, f"{name}: nested too deep to remove; left as it is")
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    try:
        if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != (st.st_dev, st.st_ino):
            raise OSError(errno.EAGAIN, f"{name} changed while it was removed")
        for child in os.listdir(fd):
            remove_tree(fd, child, depth + 1)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)
