"""Access patterns of GPU workloads, the storage profile an operator would otherwise take with strace: for each GPU
process and the processes below it (its data loader workers), the bytes read and written at the storage layer per
second, the average size of a read and of a write call, and the mounts they have files open on, for reading or
writing.

From ``<procfs>/<pid>/io`` (the counters), ``<procfs>/<pid>/task/<tid>/children`` (the workers), ``<procfs>/<pid>/fd``
and ``fdinfo`` (the open files: access mode and ``mnt_id``) and the process's own ``mountinfo``: a container sees its
volumes under its own paths and mount IDs, so a file is joined to the host's mount by the filesystem (device number)
and the directory the mount shows (its root), which a container's bind of a kubelet volume shares with the host's.

Bounded: at most ``max_processes`` processes per GPU process, ``max_fds`` open files each, 64 KiB per small file;
only the processes NVML names and their descendants are read, never every process on the node. Nothing here touches
the files themselves (a file on a hung mount would hang a stat): the links in ``fd`` and the ``fdinfo`` lines are the
kernel's. A process that exits while it is read is skipped. Rates are over the processes seen at both of two reads.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from storwatch.config import number
from storwatch.paths import NOT_FILE_TARGETS, HostPaths
from storwatch.procfs.mountinfo import parse_mountinfo
from storwatch.procfs.pidio import ProcessIO, access_mode, parse_children, parse_io
from storwatch.sources import Context, FactsKey, OnceLog, read_bounded
from storwatch.sources.gpu.facts import GPUFacts
from storwatch.sources.mounts import MOUNTS
from storwatch.vocabulary import Mount

log = logging.getLogger(__name__)

MAX_SMALL_FILE = 64 * 1024
MAX_MOUNTINFO = 4 << 20


@dataclass(frozen=True)
class AccessConfig:
    enabled: bool = True
    interval_seconds: float = number(5.0, 0.5, 3600)
    max_processes: int = number(256, 1, 100_000)
    """Processes read per GPU process (itself and its descendants)."""
    max_fds: int = number(1024, 1, 1_000_000)
    """Open files looked at per process."""


@dataclass(frozen=True)
class WorkloadAccess:
    """One GPU process and the processes below it."""

    pid: int
    """The GPU process (as NVML names it)."""
    processes: int
    io: ProcessIO
    """The counters summed over the processes read now."""
    read_bytes_per_second: float | None = None
    """Storage-layer reads (``read_bytes``) per second over the last interval; None on the first read."""
    write_bytes_per_second: float | None = None
    read_calls_per_second: float | None = None
    write_calls_per_second: float | None = None
    read_size_bytes: float | None = None
    """Average bytes per read call over the last interval (``rchar`` / ``syscr``)."""
    write_size_bytes: float | None = None
    mounts_read: tuple[str, ...] = ()
    """Host mountpoints it has files open on for reading."""
    mounts_written: tuple[str, ...] = ()


@dataclass(frozen=True)
class AccessFacts:
    timestamp: float
    workloads: dict[int, WorkloadAccess] = field(default_factory=dict)
    """By GPU process PID."""


ACCESS: FactsKey[AccessFacts] = FactsKey("access")


def _read_small(path: str, limit: int = MAX_SMALL_FILE) -> bytes | None:
    """The file's first ``limit`` bytes, or None when it cannot be read (the process exited)."""
    try:
        return read_bounded(path, limit)
    except OSError:
        return None


_IO_FIELDS = tuple(ProcessIO.__dataclass_fields__)


def _summed(records: Iterable[ProcessIO]) -> ProcessIO:
    rows = list(records)
    return ProcessIO(*(sum(getattr(r, f) for r in rows) for f in _IO_FIELDS))


def _delta(before: ProcessIO, after: ProcessIO) -> ProcessIO:
    """What a process did between two reads (never negative: a counter that went back is a reused PID)."""
    return ProcessIO(*(max(0, getattr(after, f) - getattr(before, f)) for f in _IO_FIELDS))


class HostMounts:
    """The host's mounts by (device, root): where a container's view of a filesystem directory is on the host."""

    def __init__(self, mounts: Iterable[Mount]) -> None:
        self.by_dev_root: dict[tuple[int, int, str], str] = {}
        for m in sorted(mounts, key=lambda m: ("/kubelet/pods/" not in m.mountpoint, len(m.mountpoint))):
            self.by_dev_root.setdefault((m.major, m.minor, m.root), m.mountpoint)

    def host_mountpoint(self, major: int, minor: int, root: str) -> str | None:
        return self.by_dev_root.get((major, minor, root))


class AccessSource:
    name = "access"

    def __init__(
        self,
        paths: HostPaths,
        config: AccessConfig,
        gpu_pids: Callable[[], Iterable[int]],
        mounts: Callable[[], Sequence[Mount] | None],
        clock: Callable[[], float],
    ) -> None:
        self.paths = paths
        self.gpu_pids = gpu_pids
        self.mounts = mounts
        self.clock = clock
        self.configure(config)
        self._before: dict[int, tuple[float, dict[int, ProcessIO]]] = {}
        self.parse_errors = 0
        self._bad = OnceLog(log)
        self.off_reason: str | None = None
        """Set while no GPU process is on this node: there is nothing to read, which is not a success."""

    def configure(self, config: AccessConfig) -> None:
        self.interval_seconds = config.interval_seconds
        self.max_processes = config.max_processes
        self.max_fds = config.max_fds

    def _tree(self, root: int) -> list[int]:
        """The process and its descendants, breadth first, at most max_processes."""
        out: list[int] = []
        queue, seen = [root], {root}
        while queue and len(out) < self.max_processes:
            pid = queue.pop(0)
            out.append(pid)
            try:
                tids = os.listdir(self.paths.proc(str(pid), "task"))
            except OSError:
                continue
            for tid in tids[: self.max_processes]:
                data = _read_small(self.paths.proc(str(pid), "task", tid, "children"))
                for child in parse_children(data or b""):
                    if child not in seen:
                        seen.add(child)
                        queue.append(child)
        return out

    def _io(self, pid: int) -> ProcessIO | None:
        path = self.paths.proc(str(pid), "io")
        data = _read_small(path)
        if data is None:
            return None
        counters, errors = parse_io(data)
        self.parse_errors += len(errors)
        for err in errors:
            self._bad.warning(str(err), "%s: skipping malformed %s", path, err)
        return counters

    def _namespace(self, pid: int) -> dict[int, tuple[int, int, str]]:
        """mnt_id -> (major, minor, root) in the process's own mount namespace."""
        data = _read_small(self.paths.proc(str(pid), "mountinfo"), MAX_MOUNTINFO)
        if not data:
            return {}
        entries, _ = parse_mountinfo(data)
        return {e.mount_id: (e.major, e.minor, e.root) for e in entries}

    def _open_files(self, pid: int, ns: dict[int, tuple[int, int, str]], host: HostMounts) -> tuple[set[str], set[str]]:
        reads: set[str] = set()
        writes: set[str] = set()
        fd_dir = self.paths.proc(str(pid), "fd")
        try:
            names = os.listdir(fd_dir)
        except OSError:
            return reads, writes
        for name in names[: self.max_fds]:
            try:
                target = os.readlink(os.path.join(fd_dir, name))
            except OSError:
                continue
            if target.encode(errors="replace").startswith(NOT_FILE_TARGETS) or not target.startswith("/"):
                continue
            info = _read_small(self.paths.proc(str(pid), "fdinfo", name), 4096)
            if not info:
                continue
            mode = access_mode(info)
            mnt_id = next(
                (
                    int(v)
                    for k, _, v in (ln.partition(b":") for ln in info.splitlines())
                    if k.strip() == b"mnt_id" and v.strip().isdigit()
                ),
                None,
            )
            where = ns.get(mnt_id) if mnt_id is not None else None
            if mode is None or where is None:
                continue
            # The mount's root is the directory of the filesystem it shows: the container's bind of a volume and
            # the host's volume mount show the same one.
            mountpoint = host.host_mountpoint(*where)
            if mountpoint is None:
                continue
            if "r" in mode:
                reads.add(mountpoint)
            if "w" in mode:
                writes.add(mountpoint)
        return reads, writes

    def collect(self) -> AccessFacts:
        now = self.clock()
        host = HostMounts(self.mounts() or ())
        out: dict[int, WorkloadAccess] = {}
        before_all, after_all = self._before, {}
        roots = sorted(set(self.gpu_pids()))
        self.off_reason = None if roots else "no GPU process on this node (NVML names none)"
        for root in roots:
            pids = self._tree(root)
            counters: dict[int, ProcessIO] = {}
            reads: set[str] = set()
            writes: set[str] = set()
            ns = self._namespace(root)
            for pid in pids:
                io = self._io(pid)
                if io is None:
                    continue  # exited, or not ours to read
                counters[pid] = io
                r, w = self._open_files(pid, ns, host)
                reads |= r
                writes |= w
            if not counters:
                continue
            after_all[root] = (now, counters)
            rates: dict[str, float | None] = {}
            before = before_all.get(root)
            if before is not None and now > before[0]:
                seconds = now - before[0]
                d = _summed(_delta(before[1][p], counters[p]) for p in counters if p in before[1])
                rates = {
                    "read_bytes_per_second": d.read_bytes / seconds,
                    "write_bytes_per_second": d.write_bytes / seconds,
                    "read_calls_per_second": d.syscr / seconds,
                    "write_calls_per_second": d.syscw / seconds,
                    "read_size_bytes": d.rchar / d.syscr if d.syscr else None,
                    "write_size_bytes": d.wchar / d.syscw if d.syscw else None,
                }
            out[root] = WorkloadAccess(
                root,
                len(counters),
                _summed(counters.values()),
                **rates,
                mounts_read=tuple(sorted(reads)),
                mounts_written=tuple(sorted(writes)),
            )
        self._before = after_all
        return AccessFacts(now, out)

    def close(self) -> None:
        pass


def _gpu_pids(ctx: Context) -> list[int]:
    from storwatch.sources.gpu import GPUS

    facts: GPUFacts | None = ctx.latest(GPUS)
    return sorted({p.pid for g in facts.gpus for p in g.processes}) if facts is not None else []


def make(ctx: Context, section: AccessConfig) -> AccessSource:
    """The source as the registry makes it: the GPU source's processes, joined against the newest mount table."""
    return AccessSource(ctx.paths, section, lambda: _gpu_pids(ctx), lambda: ctx.latest(MOUNTS), ctx.clock)
