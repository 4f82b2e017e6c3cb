"""The Lustre client source: per-mount operation counts, bytes and times from the client's llite ``stats`` files
(on-prem Lustre and FSx for Lustre), each joined to the mount it belongs to.

A client mount's counters live in ``llite/<fsname>-<instance>/stats``: in debugfs on Lustre 2.12 and later
(``<sysfs>/kernel/debug/lustre/llite``), in procfs before (``<procfs>/fs/lustre/llite``). The directory names only
the filesystem, so a client is joined to a mount by that name (the ``:/fsname`` of its mount source). Bind mounts of
one client mount (a pod's view of a hostPath onto Lustre) share its superblock and its counters: they are given to
the mount that shows the filesystem's top (the shortest root), the others get none, so a sum over mountpoints counts
each byte once. Two separate client mounts of one filesystem (different superblocks) cannot be told apart from the
directory names: their counters are kept, with no mountpoint.

Reading these files never waits on a server: they are the client's own counters.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from storwatch.config import number
from storwatch.paths import HostPaths
from storwatch.procfs.lustre import LliteLineError, LliteStats, fsname_of_instance, fsname_of_source, parse_llite_stats
from storwatch.sources import Context, FactsKey, OnceLog, read_bounded
from storwatch.sources.mounts import MOUNTS
from storwatch.vocabulary import Mount

log = logging.getLogger(__name__)

MAX_CLIENTS = 256
"""Client mounts read per collection at most (a node mounts a handful)."""

MAX_FILE_BYTES = 64 * 1024
"""Bytes read of one stats file at most (a client writes about 4 KiB)."""


@dataclass(frozen=True)
class LustreConfig:
    enabled: bool = True
    interval_seconds: float = number(5.0, 0.1, 3600)


@dataclass(frozen=True)
class LustreClient:
    """One client mount's counters and the mount they are joined to."""

    instance: str
    """The client's directory name (``scratch-ffff9bc043537800``)."""
    fsname: str
    mountpoint: str | None
    """None when no mount of this filesystem is in the mount table, or when more than one client mount is."""
    stats: LliteStats


@dataclass(frozen=True)
class LustreFacts:
    timestamp: float
    clients: tuple[LustreClient, ...] = ()
    errors: tuple[str, ...] = field(default=())
    """Clients whose stats could not be read, one sentence each (the others still count)."""


LUSTRE: FactsKey[LustreFacts] = FactsKey("lustre")
"""The Lustre source's facts in a Snapshot."""


def stats_dirs(paths: HostPaths) -> tuple[str, ...]:
    """Where a client keeps its per-mount directories, newest layout first."""
    return (paths.sys("kernel", "debug", "lustre", "llite"), paths.proc("fs", "lustre", "llite"))


def join_mounts(fsnames: Sequence[str], mounts: Sequence[Mount]) -> dict[str, str | None]:
    """For each filesystem name, the mountpoint its client counters belong to (None: no mount of it, or several
    client mounts that the counters' directory names cannot tell apart)."""
    by_fs: dict[str, dict[tuple[int, int], list[Mount]]] = {}
    for m in mounts:
        if m.fstype != "lustre":
            continue
        name = fsname_of_source(m.device)
        if name is not None:
            by_fs.setdefault(name, {}).setdefault((m.major, m.minor), []).append(m)
    joined: dict[str, str | None] = {}
    for name in fsnames:
        superblocks = by_fs.get(name, {})
        if len(superblocks) != 1:
            joined[name] = None
            continue
        (binds,) = superblocks.values()
        top = min(binds, key=lambda m: (len(m.root), m.mount_id))
        joined[name] = top.mountpoint
    return joined


class LustreSource:
    name = "lustre"

    def __init__(
        self,
        paths: HostPaths,
        config: LustreConfig,
        mounts: Callable[[], Sequence[Mount] | None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.paths = paths
        self.mounts = mounts
        self.clock = clock
        self.parse_errors = 0
        self.off_reason: str | None = None
        """Set while the node has no Lustre client mount: the collector is then off, not a success that read
        nothing (it comes on by itself when a client mounts)."""
        self._bad = OnceLog(log)
        self.configure(config)

    def configure(self, config: LustreConfig) -> None:
        self.interval_seconds = config.interval_seconds

    def _clients(self) -> tuple[str | None, list[str]]:
        """The first directory that holds client directories, and their names."""
        for d in stats_dirs(self.paths):
            try:
                with os.scandir(d) as it:
                    names = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
            except (FileNotFoundError, NotADirectoryError):
                continue
            if names:
                return d, names
        return None, []

    def collect(self) -> LustreFacts:
        now = self.clock()
        mounts = self.mounts() or ()
        lustre_mounts = [m.mountpoint for m in mounts if m.fstype == "lustre"]
        where, names = self._clients()
        self.off_reason = None
        if where is None:
            if lustre_mounts:
                raise OSError(
                    f"{len(lustre_mounts)} Lustre mount(s) ({', '.join(lustre_mounts[:3])}) but no client statistics "
                    f"in {' or '.join(stats_dirs(self.paths))} (is debugfs mounted and readable?)"
                )
            self.off_reason = "no Lustre client mount on this node"
            return LustreFacts(now)
        if len(names) > MAX_CLIENTS:
            self._bad.warning(
                "too many", "lustre: %d client mounts in %s, reading the first %d", len(names), where, MAX_CLIENTS
            )
            names = names[:MAX_CLIENTS]
        fsnames = {n: fsname_of_instance(n) for n in names}
        joined = join_mounts([f for f in fsnames.values() if f is not None], mounts)
        clients: list[LustreClient] = []
        errors: list[str] = []
        for instance, fsname in fsnames.items():
            path = os.path.join(where, instance, "stats")
            if fsname is None:
                errors.append(f"{path}: not a client directory name (expected FSNAME-HEXINSTANCE)")
                continue
            try:
                data = read_bounded(path, MAX_FILE_BYTES)
            except OSError as e:
                errors.append(f"{path}: {e.strerror or e}")
                continue
            stats, bad = parse_llite_stats(data)
            self._report(path, bad)
            if not stats.counters and bad:
                errors.append(f"{path}: no counter could be parsed; the first bad line: {bad[0]}")
                continue
            clients.append(LustreClient(instance, fsname, joined.get(fsname), stats))
        for error in errors:
            self._bad.warning(error, "lustre: %s", error)
        if errors and not clients:
            raise OSError(
                f"no Lustre client statistics could be read: {errors[0]}"
                + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
            )
        return LustreFacts(now, tuple(clients), tuple(errors))

    def _report(self, path: str, bad: list[LliteLineError]) -> None:
        self.parse_errors += len(bad)
        for err in bad:
            self._bad.warning(f"{path}:{err}", "lustre: skipping malformed line of %s: %s", path, err)

    def close(self) -> None:
        pass


def make(ctx: Context, section: LustreConfig) -> LustreSource:
    """The source as the registry makes it: joined against the mount source's newest mount table."""
    return LustreSource(ctx.paths, section, lambda: ctx.latest(MOUNTS), ctx.clock)
