"""Which processes on the node hold a checkpoint's files open for writing, in the kernel's word: every process's
``<procfs>/<pid>/fd`` links and ``fdinfo`` (access mode, inode), read through ``HostPaths`` within fixed bounds. For
``storwatch verify``: a checkpoint no process writes has been closed by its writer and is judged at once; one still
held is being written, which is no damage.

A link names the file in the writer's own mount namespace. One that is the checkpoint's path on this side
(``HostPaths.root``) matches by path; one that ends with the checkpoint's name and a member's path below it matches
when fdinfo's inode is that member's (a trainer in a container writes ``/ckpt/checkpoint-5/model.safetensors``, which
the host sees under the pod's volume). Only the checkpoint's own files are stat'ed, never the processes' other files
(one on a hung mount would hang the stat).

A process whose open files cannot be read (another user's, when not run as root; one hidden by ``hidepid``) may or may
not be writing. Files are owned by the user a process creates them as, so only a process running as an owner of one
of the checkpoint's files (root, where root owns one) keeps the answer open: ``Writers.unseen`` counts those (every
such process, when the checkpoint itself cannot be stat'ed).
"""

from __future__ import annotations

import os
import stat
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from storwatch.paths import HostPaths
from storwatch.procfs.pidio import access_mode, fd_inode, status_uids

MAX_PROCESSES = 100_000
"""Processes read per look (a node runs a few thousand)."""
MAX_FDS = 2_000_000
"""Open files read per look, over every process."""
MAX_MEMBERS = 200_000
"""Files of the checkpoints looked for, all together (their paths and inodes)."""
MAX_HOLDERS = 16
"""Holders kept per checkpoint."""
_MAX_DEPTH = 64
_SMALL = 4096


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str
    """The process's name (``comm``, at most 15 characters, its own choice: escape it where shown)."""
    path: str
    """The file it holds open for writing, as the process sees it."""


@dataclass(frozen=True)
class Writers:
    """What the node's processes hold open for writing of one checkpoint."""

    holders: tuple[Holder, ...] = ()
    unseen: int = 0
    """Processes that could be writing it (they run as an owner of its files) whose open files could not be read."""
    bound: str | None = None
    """The bound that stopped the look before every process was read, in words."""

    @property
    def closed(self) -> bool:
        """No process holds any of its files open for writing, as far as every process that could was seen."""
        return not self.holders and not self.unseen and self.bound is None


@dataclass
class _Target:
    real: str
    """The checkpoint's path with symlinks resolved (what a link on this side names)."""
    tail: str
    """Its last name, which a link from another mount namespace ends with."""
    owners: set[int] | None
    """The owners of its files; None when it cannot be stat'ed (no process can then be ruled out)."""
    members: dict[str, int]
    """Path below it ("" for a file checkpoint) -> inode."""
    holders: list[Holder]


def writers_of(paths: HostPaths, checkpoints: Sequence[str]) -> dict[str, Writers]:
    """For each path in ``checkpoints`` (a file or a directory), what holds it, or a file below it, open for writing
    now; one pass over the node's processes for all of them."""
    targets = {path: _target(path) for path in dict.fromkeys(checkpoints)}
    budget = MAX_MEMBERS
    by_real: dict[str, list[_Target]] = defaultdict(list)
    by_name: dict[str, list[tuple[_Target, str, int]]] = defaultdict(list)
    for target in targets.values():
        by_real[target.real].append(target)
        for rel, ino in _members(target, budget):
            budget -= 1
            by_name[os.path.basename(rel) or target.tail].append((target, rel, ino))
    bound: str | None = None
    unseen: list[int] = []
    fds = 0
    for n, pid in enumerate(_pids(paths)):
        if n >= MAX_PROCESSES:
            bound = f"more than {MAX_PROCESSES} processes"
            break
        fd_dir = paths.proc(str(pid), "fd")
        try:
            with os.scandir(fd_dir) as it:
                for entry in it:
                    fds += 1
                    if fds > MAX_FDS:
                        bound = f"more than {MAX_FDS} open files"
                        break
                    _look(paths, pid, entry.name, fd_dir, by_real, by_name)
        except PermissionError:
            unseen.append(pid)
        except OSError:
            continue  # gone, or no fd directory: it holds nothing
        if bound is not None:
            break
    unseen_uids = [uids for uids in (_uids(paths, pid) for pid in unseen) if uids is not None]
    return {
        path: Writers(
            tuple(t.holders[:MAX_HOLDERS]),
            sum(1 for uids in unseen_uids if t.owners is None or uids & t.owners),
            None if t.holders else bound,
        )
        for path, t in targets.items()
    }


def _target(path: str) -> _Target:
    real = os.path.realpath(path)
    return _Target(real, os.path.basename(real), set(), {}, [])


def _members(target: _Target, budget: int) -> Iterator[tuple[str, int]]:
    """The checkpoint's regular files (below it, for a directory), as (path below it, inode), at most ``budget``;
    symlinks are never followed. Their owners go into ``target.owners``."""
    try:
        st = os.lstat(target.real)
    except OSError:
        target.owners = None
        return
    owners = target.owners = {st.st_uid}
    if not stat.S_ISDIR(st.st_mode):
        if stat.S_ISREG(st.st_mode) and budget > 0:
            target.members[""] = st.st_ino
            yield "", st.st_ino
        return
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(os.path.join(target.real, rel_dir)) as it:
                for entry in it:
                    try:
                        est = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                    owners.add(est.st_uid)
                    if stat.S_ISDIR(est.st_mode):
                        if rel.count("/") < _MAX_DEPTH:
                            stack.append(rel)
                    elif stat.S_ISREG(est.st_mode):
                        if budget <= 0:
                            return
                        budget -= 1
                        target.members[rel] = est.st_ino
                        yield rel, est.st_ino
        except OSError:
            continue


def _pids(paths: HostPaths) -> Iterator[int]:
    try:
        with os.scandir(paths.proc()) as it:
            for entry in it:
                if entry.name.isdigit() and entry.name.isascii():
                    yield int(entry.name)
    except OSError:
        return


def _look(
    paths: HostPaths,
    pid: int,
    fd: str,
    fd_dir: str,
    by_real: dict[str, list[_Target]],
    by_name: dict[str, list[tuple[_Target, str, int]]],
) -> None:
    """Note the process as a holder of every checkpoint this open file is one of, when it is open for writing."""
    try:
        link = os.readlink(os.path.join(fd_dir, fd))
    except OSError:
        return  # closed since it was listed
    if not link.startswith("/") or link.endswith(" (deleted)"):
        return  # a pipe, socket or anonymous inode; or a file no longer in any checkpoint
    matches: list[tuple[_Target, int | None]] = [(t, None) for t in _by_path(paths.root(link), by_real)]
    for target, rel, ino in by_name.get(os.path.basename(link), ()):
        tail = f"{target.tail}/{rel}" if rel else target.tail
        if link.endswith("/" + tail) and not any(t is target for t, _ in matches):
            matches.append((target, ino))
    if not matches:
        return
    info = _read_small(paths.proc(str(pid), "fdinfo", fd))
    mode = access_mode(info) if info else None
    if mode is None or "w" not in mode:
        return
    inode = fd_inode(info)
    for target, want in matches:
        if (want is None or inode == want) and not any(h.pid == pid for h in target.holders):
            target.holders.append(Holder(pid, _comm(paths, pid), link))


def _by_path(seen_at: str, by_real: dict[str, list[_Target]]) -> list[_Target]:
    """The checkpoints that ``seen_at`` is, or lies below."""
    found: list[_Target] = []
    path = seen_at
    for _ in range(_MAX_DEPTH):
        found.extend(by_real.get(path, ()))
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return found


def _read_small(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, _SMALL)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _comm(paths: HostPaths, pid: int) -> str:
    return _read_small(paths.proc(str(pid), "comm")).decode("utf-8", "replace").strip()[:64]


def _uids(paths: HostPaths, pid: int) -> set[int] | None:
    uids = status_uids(_read_small(paths.proc(str(pid), "status")))
    return None if uids is None else set(uids)
