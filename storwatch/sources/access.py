"""Access patterns of GPU workloads, the storage profile an operator would otherwise take with strace: for each GPU
process and the processes below it (its data loader workers), its I/O counters (bytes read and written at the storage
layer, read and write calls and the bytes they passed) and the mounts they have files open on, for reading or writing.

From ``<procfs>/<pid>/io`` (the counters), ``<procfs>/<pid>/task/<tid>/children`` (the workers), ``<procfs>/<pid>/fd``
and ``fdinfo`` (the open files: access mode and ``mnt_id``) and the process's own ``mountinfo``: a container sees its
volumes under its own paths and mount IDs, so a file is joined to the host's mount by the filesystem (device number)
and the directory the mount shows (its root), which a container's bind of a kubelet volume shares with the host's.

Bounded: at most ``max_processes`` processes known per GPU process, ``max_fds`` open files read from each, 64 KiB
per small file; only the processes NVML names and their descendants are read, never every process on the node. Each
pass also has a budget (``max_processes_per_pass`` processes read, ``max_fds_per_pass`` open files read,
``max_cpu_seconds_per_pass`` of this thread's CPU): the GPU processes' counters are read first, always, then their
descendants' from where the last pass stopped (within half the CPU budget), then the open files, the GPU processes'
first, each process's from where its last read stopped; so past the budget the pass samples, the rest is read on
later passes, and the facts say so (``sampled``). Nothing here touches the files
themselves (a file on a hung mount would hang a stat): the links in ``fd`` and the ``fdinfo`` lines are the kernel's.
A process that exits while it is read is skipped. A workload's counters are the sum of its processes' latest reads,
not rates: Prometheus takes the rates (the exporter's ``_total`` counters), so no rate is kept from pass to pass.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import stat
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from storwatch._events_worker import REOPEN_SECONDS
from storwatch.checkpoints.scan import checkpoint_member
from storwatch.config import number
from storwatch.paths import NOT_FILE_TARGETS, HostPaths
from storwatch.procfs.mountinfo import parse_mountinfo
from storwatch.procfs.pidio import ProcessIO, access_mode, parse_children, parse_io, summed
from storwatch.sources import Context, FactsKey, OnceLog, read_bounded
from storwatch.sources.gpu.facts import GPUFacts
from storwatch.sources.mounts import MOUNTS
from storwatch.vocabulary import Mount

log = logging.getLogger(__name__)

MAX_SMALL_FILE = 64 * 1024
MAX_MOUNTINFO = 4 << 20
PROCESS_CPU_SHARE = 0.5
"""Share of a pass's CPU budget that counters and children may take; the open files get the rest."""
FD_CPU_CHECK_EVERY = 64
"""Open files read between two looks at the pass's CPU time (one read of max_fds files may take tens of ms)."""
MAX_COMM = 64
"""``<pid>/comm`` is at most 16 bytes with its newline (TASK_COMM_LEN); more is not a comm."""
MOUNT_MEMORY_PASSES = 12
"""While a workload is sampled, a mount seen open is reported for this many passes after it was last seen (the open
files are read a part at a time); a pass that read everything reports exactly what it saw."""
WATCH_SECONDS = 0.25
"""Between passes, paced as the agent runs it, the source looks this often at two things: each open file a workload
writes (its one fd link), so the moment it closes (a save's end) is known to within this whatever
``interval_seconds`` is; and each GPU process's and known writer's write counter, so a save that begins between
passes is seen open while it goes on. Every IDLE_WATCH_SECONDS instead while the workloads are still."""
IDLE_WATCH_SECONDS = 1.0
"""The looks' interval while the workloads are still: no write counter moved for QUIET_SECONDS and no file they
write is open. A save then begins between two looks at most this far apart; its first look (the counter moved)
reads its open files, and the looks come every WATCH_SECONDS again. Most GPU workloads compute for minutes between
saves: four looks a second at counters standing still were a seventh of the agent's CPU on bench/at_scale.py's node."""
QUIET_SECONDS = 10.0
"""How long the write counters must stand still before the looks slow to IDLE_WATCH_SECONDS."""
WRITE_TRIGGER_BYTES = 1 << 20
"""Bytes a process passed to write calls since the last look that found its counter still (however many looks that
spans) that make a burst, and make the look read its open files."""
MAX_TRIGGERED_PER_LOOK = 8
"""Processes whose open files one look between passes may read."""
MAX_WATCH_SECONDS = 900.0
"""A file open for writing longer than this (a log, a stream) is no longer looked at between passes."""
MAX_WRITTEN_FILES = 256
"""Files remembered per workload as written (open for writing when a pass looked); past it the oldest closed ones go."""
ENDED_KEEP_SECONDS = 3600.0
"""How long the files an ended workload wrote are remembered (their saves' spans)."""
MAX_ENDED_FILES = 1024
MAX_BURSTS = 64
"""Write bursts remembered per workload (the newest)."""
MAX_WATCHED = 256
"""Open files watched between passes, over every workload."""
MAX_HELD_FILES = 64
"""Checkpoint files remembered per workload as held open read-only (the newest)."""


@dataclass(frozen=True)
class AccessConfig:
    enabled: bool = True
    interval_seconds: float = number(5.0, 0.5, 3600)
    max_processes: int = number(256, 1, 100_000)
    """Processes read per GPU process (itself and its descendants)."""
    max_fds: int = number(1024, 1, 1_000_000)
    """Open files looked at per process in one read."""
    max_processes_per_pass: int = number(512, 1, 1_000_000)
    """Processes read in one pass, over every GPU workload (the GPU processes first)."""
    max_fds_per_pass: int = number(4096, 1, 10_000_000)
    """Open files read in one pass, over every GPU workload."""
    max_cpu_seconds_per_pass: float = number(0.05, 0.001, 60)
    """CPU time one pass may take; the pass stops reading past it."""
    max_workloads: int = number(64, 1, 100_000)
    """Workloads exported, each with its own series of every storwatch_workload_* family; the rest are left out, and
    counted (storwatch_workload_series_dropped)."""
    max_mounts_per_workload: int = number(32, 1, 100_000)
    """Mounts exported per workload (storwatch_workload_mount); the rest are left out, and counted."""


@dataclass(frozen=True)
class WrittenFile:
    """A regular file a workload's process was seen holding open for writing: the kernel's word that this process
    writes it, and, looked at again every WATCH_SECONDS while it stays open, when it stopped."""

    path: str
    """Where the file is, as the host names it (the link in the writer's ``fd``, moved from the writer's mount of the
    filesystem to the host's)."""
    pid: int
    """The process that held it open (the GPU process or one below it)."""
    first_seen: float
    """The first look that found it open."""
    looked_before: float | None
    """The look at that process's open files before ``first_seen`` (it was not open then, or not yet looked at): the
    open came after this; None when no look came before."""
    last_open: float
    """The newest look that found it still open."""
    closed_by: float | None = None
    """The first look that found it closed (the close came after ``last_open``, by this); None while open."""

    @property
    def open(self) -> bool:
        return self.closed_by is None


@dataclass(frozen=True)
class HeldFile:
    """A checkpoint's file a workload's process was seen holding open read-only: a reader's, or its writer's second
    descriptor, opened to fsync what it has just written (``torch.save`` then open and fsync); analysis/writes.py
    tells which from the file events and the process's write counters."""

    path: str
    """Where the file is, as the host names it (as ``WrittenFile.path``)."""
    pid: int
    """The process that held it open."""
    first_seen: float
    """The first look that found this descriptor open on it."""
    last_seen: float
    """The newest look that found it still open."""


@dataclass(frozen=True)
class WorkloadAccess:
    """One GPU process and the processes below it."""

    pid: int
    """The GPU process (as NVML names it)."""
    processes: int
    """Its processes whose counters are in ``io`` (itself and the descendants read, in this pass or earlier)."""
    io: ProcessIO
    """Its processes' counters, each as last read, summed: it grows while they run. A worker that exits keeps its
    share once its parent in the tree reaps it (the kernel then adds the child's counters to the parent's ``io``);
    the sum drops when counters leave the tree: an exited process not yet seen in its parent's counters (between two
    reads, or while the pass samples), a child reaped by no one in the tree (its parent ignores SIGCHLD, or it was
    orphaned), a PID reused by a younger process."""
    comm: str | None = None
    """The GPU process's command name (``<pid>/comm``): set by the process itself, so a claim of at most 15 bytes;
    None when it could not be read."""
    within: int | None = None
    """The GPU process whose tree holds this one (a GPU process started by another): its counters are in that one's
    ``io`` too, so a sum over workloads counts them there only."""
    mounts_read: tuple[str, ...] = ()
    """Host mountpoints it has files open on for reading."""
    mounts_written: tuple[str, ...] = ()
    sampled: bool = False
    """Not every process or open file of it was read in this pass (the pass's budget): counters and mounts come from
    the parts read lately."""
    processes_known: int = 0
    """Its processes known (read in this pass or earlier, still alive), at most ``max_processes``."""
    written: tuple[WrittenFile, ...] = ()
    """The regular files its processes were seen writing while it lives (at most MAX_WRITTEN_FILES, the newest),
    oldest first: which run directories this GPU work writes, and when each file was open."""
    write_bursts: tuple[tuple[float, float, int], ...] = ()
    """The bursts its processes wrote between two looks at their write counters (every WATCH_SECONDS): (the look
    before, the look that saw it, bytes passed to write calls), each of at least WRITE_TRIGGER_BYTES, the newest
    MAX_BURSTS: a save too quick to be seen open is seen here, to be matched with the file events' saves."""
    uid: int | None = None
    """The GPU process's user (the owner of its ``<procfs>/<pid>``, which the kernel sets to its effective uid)."""
    held: tuple[HeldFile, ...] = ()
    """The checkpoints' files (by their names: checkpoints.scan.checkpoint_member) its processes were seen holding
    open read-only while it lives, at most MAX_HELD_FILES (the newest), oldest first."""


@dataclass(frozen=True)
class AccessFacts:
    timestamp: float
    workloads: dict[int, WorkloadAccess] = field(default_factory=dict)
    """By GPU process PID."""
    processes_read: int = 0
    """Processes whose counters and children this pass read."""
    fds_read: int = 0
    """Open files (fd links) this pass read."""
    cpu_seconds: float = 0.0
    """CPU time of this pass (the collecting thread's)."""
    sampled: tuple[str, ...] = ()
    """The budgets this pass reached (``processes``, ``fds``, ``cpu``); empty when it read everything."""
    max_workloads: int = AccessConfig.max_workloads
    """The exporter's bound on workloads (``access.max_workloads``), carried with the facts so that a reload of the
    section reaches the exporter with the next pass."""
    max_mounts_per_workload: int = AccessConfig.max_mounts_per_workload
    """Likewise ``access.max_mounts_per_workload``."""
    ended: tuple[WrittenFile, ...] = ()
    """The files written by workloads that have ended (the GPU process exited) within ENDED_KEEP_SECONDS, at most
    MAX_ENDED_FILES, oldest first: when their saves were written is still known, though no GPU waits on them now."""


ACCESS: FactsKey[AccessFacts] = FactsKey("access")


def _read_small(path: str, limit: int = MAX_SMALL_FILE) -> bytes | None:
    """The file's first ``limit`` bytes, or None when it cannot be read (the process exited)."""
    try:
        return read_bounded(path, limit)
    except OSError:
        return None


class _PassBudget:
    """What one pass may read: processes, open files, and this thread's CPU time."""

    def __init__(self, processes: int, fds: int, cpu_seconds: float) -> None:
        self.max_processes, self.max_fds, self.max_cpu = processes, fds, cpu_seconds
        self.processes = 0
        self.fds = 0
        self._cpu_start = time.thread_time()

        self._stopped: set[str] = set()

    def cpu_used(self) -> float:
        return time.thread_time() - self._cpu_start

    def _left(self, used: int, most: int, name: str, cpu_share: float) -> bool:
        if used >= most:
            self._stopped.add(name)
            return False
        if self.cpu_used() >= self.max_cpu * cpu_share:
            self._stopped.add("cpu")
            return False
        return True

    def processes_left(self, cpu_share: float) -> bool:
        """Whether another process may be read (with at most ``cpu_share`` of the CPU budget used so far)."""
        return self._left(self.processes, self.max_processes, "processes", cpu_share)

    def fds_left(self) -> int:
        """How many more open files may be read (0 once the fd or the CPU budget is spent)."""
        return self.max_fds - self.fds if self._left(self.fds, self.max_fds, "fds", 1.0) else 0

    def stop(self, name: str) -> None:
        self._stopped.add(name)

    def reached(self) -> tuple[str, ...]:
        """The budgets that stopped this pass."""
        return tuple(n for n in ("processes", "fds", "cpu") if n in self._stopped)


@dataclass
class _ProcessRecord:
    counters: ProcessIO | None
    """Its counters at its last read (None: known as a child, not read yet). Kept because a pass that samples sums
    the latest read of every process it did not read this time."""
    read_pass: int
    """The pass that read it last."""


@dataclass
class _Written:
    path: str
    pid: int
    fd: str
    link: str
    """The fd's link when first seen: the file is still open while ``<pid>/fd/<fd>`` links to it."""
    first_seen: float
    looked_before: float | None
    last_open: float
    closed_by: float | None = None

    def frozen(self) -> WrittenFile:
        return WrittenFile(self.path, self.pid, self.first_seen, self.looked_before, self.last_open, self.closed_by)


@dataclass
class _Held:
    pid: int
    fd: str
    link: str
    first_seen: float
    last_seen: float


@dataclass
class _Workload:
    """A GPU process and its descendants as known across passes."""

    records: dict[int, _ProcessRecord] = field(default_factory=dict)
    """By PID, the GPU process first, then in the order found."""
    cursor: int = 0
    """The last descendant whose counters were read: the next pass goes on after it."""
    fd_cursor: int = 0
    """The last descendant whose open files were read: likewise."""
    ns: dict[int, tuple[int, int, str, str]] = field(default_factory=dict)
    seen_read: dict[str, int] = field(default_factory=dict)
    """Mountpoint -> the pass it was last seen open for reading."""
    seen_written: dict[str, int] = field(default_factory=dict)
    written: dict[str, _Written] = field(default_factory=dict)
    """Files seen open for writing, by host path."""
    held: dict[str, _Held] = field(default_factory=dict)
    """Checkpoints' files seen open read-only, by host path (the newest MAX_HELD_FILES)."""
    looked: dict[int, float] = field(default_factory=dict)
    """Each process's last full look at its open files (when the pass read all of them)."""
    bursts: deque[tuple[float, float, int]] = field(default_factory=lambda: deque(maxlen=MAX_BURSTS))

    def queue(self, root: int) -> Iterator[int]:
        """Its descendants once each, starting after the one read last, then those found on the way."""
        order = [p for p in self.records if p != root]
        start = order.index(self.cursor) + 1 if self.cursor in order else 0
        given = {root}
        while order:
            for pid in order[start:] + order[:start]:
                if pid in self.records and pid not in given:
                    given.add(pid)
                    yield pid
            order, start = [p for p in self.records if p not in given], 0

    def fd_queue(self, root: int) -> Iterator[int]:
        """Its descendants read at least once, once each, starting after the one whose open files were read last."""
        order = [p for p, rec in self.records.items() if p != root and rec.counters is not None]
        start = order.index(self.fd_cursor) + 1 if self.fd_cursor in order else 0
        yield from order[start:] + order[:start]

    def update(self, pid: int, io: ProcessIO, pass_: int) -> None:
        self.records[pid] = _ProcessRecord(io, pass_)

    def unread(self, pass_: int) -> bool:
        return any(rec.read_pass != pass_ for rec in self.records.values())


class HostMounts:
    """The host's mounts by (device, root): where a container's view of a filesystem directory is on the host."""

    def __init__(self, mounts: Iterable[Mount]) -> None:
        self.by_dev_root: dict[tuple[int, int, str], str] = {}
        for m in sorted(mounts, key=lambda m: ("/kubelet/pods/" not in m.mountpoint, len(m.mountpoint))):
            self.by_dev_root.setdefault((m.major, m.minor, m.root), m.mountpoint)

    def host_mountpoint(self, major: int, minor: int, root: str) -> str | None:
        return self.by_dev_root.get((major, minor, root))


def host_file(link: str, ns_mountpoint: str, host_mountpoint: str) -> str | None:
    """The host's path of a file a process's fd links to (``link``, in its own namespace), on its mount at
    ``ns_mountpoint`` there that the host has at ``host_mountpoint`` (the same filesystem directory); None for a file
    deleted since it was opened, or a link outside that mount."""
    if link.endswith(" (deleted)"):
        return None
    if ns_mountpoint != "/":
        if not link.startswith(ns_mountpoint + "/"):
            return None
        link = link[len(ns_mountpoint) :]
    return host_mountpoint.rstrip("/") + link


class AccessSource:
    name = "access"

    def __init__(
        self,
        paths: HostPaths,
        config: AccessConfig,
        gpu_pids: Callable[[], Iterable[int]],
        mounts: Callable[[], Sequence[Mount] | None],
        clock: Callable[[], float],
        paced: bool = False,
    ) -> None:
        """``paced``: as the agent runs it, a call of collect before the configured interval is over (the worker
        calls sooner while a written file is open) only looks at the open files being written; otherwise every call
        is a whole pass."""
        self.paths = paths
        self.paced = paced
        self.gpu_pids = gpu_pids
        self.mounts = mounts
        self.clock = clock
        self.configure(config)
        self._workloads: dict[int, _Workload] = {}
        """Each GPU process's workload as known across passes."""
        self._fd_cursor: dict[int, int] = {}
        """Where the next read of a process's open files starts (its fd directory's order)."""
        self._files_read_at: dict[int, float] = {}
        """When the looks between passes last read each process's open files (the longest ago go first)."""
        self._due: set[int] = set()
        """Processes a look found due for a read of their open files and left for the next (past its cap)."""
        self._closed_at: dict[int, float] = {}
        """Processes a look found closing a file they wrote, with when: their open files are read at each look for
        REOPEN_SECONDS after it (``_triggered``)."""
        self._pass = 0
        self._facts: AccessFacts | None = None
        """The last pass's facts, which a look at the watched files between passes brings up to date."""
        self._next_pass = -float("inf")
        self._ended: deque[tuple[float, WrittenFile]] = deque()
        """What ended workloads wrote, with when each ended."""
        self._wchar: dict[int, int] = {}
        """Each watched process's write counter where its next burst starts (``_burst``)."""
        self._wchar_at: dict[int, float] = {}
        """When each write counter in ``_wchar`` was read."""
        self._wchar_read: dict[int, int] = {}
        """Each watched process's write counter as last read."""
        self._moved_at = -math.inf
        """When a look or a pass last found a watched process's write counter moved since its last read
        (QUIET_SECONDS)."""
        self.parse_errors = 0
        self._bad = OnceLog(log)
        self.off_reason: str | None = None
        """Set while no GPU process is on this node: there is nothing to read, which is not a success."""

    def configure(self, config: AccessConfig) -> None:
        self.pass_seconds = config.interval_seconds
        self.max_processes = config.max_processes
        self.max_fds = config.max_fds
        self.max_processes_per_pass = config.max_processes_per_pass
        self.max_fds_per_pass = config.max_fds_per_pass
        self.max_cpu_seconds_per_pass = config.max_cpu_seconds_per_pass
        self.max_workloads = config.max_workloads
        self.max_mounts_per_workload = config.max_mounts_per_workload

    @property
    def interval_seconds(self) -> float:
        """The configured interval between passes, or, paced, while there is a GPU workload, the looks' between
        passes: WATCH_SECONDS while its write counters move or a file it writes is open, IDLE_WATCH_SECONDS once
        they have stood still for QUIET_SECONDS."""
        if not (self.paced and self._workloads):
            return self.pass_seconds
        still = self.clock() - self._moved_at > QUIET_SECONDS and not self.keeps_pace
        return min(self.pass_seconds, IDLE_WATCH_SECONDS if still else WATCH_SECONDS)

    @property
    def keeps_pace(self) -> bool:
        """A file a workload writes is open (a save in progress, seen by a pass or a look): the looks between passes
        then come every WATCH_SECONDS whatever the second's budget (the agent asks this after each collection). Its
        close is the save's end, and ``torch.save``'s writer opens the file again at once to sync it, for a fraction
        of a second that a look must see (only a look that finds the writer holding it ties that sync to the save:
        a reader's would not count); a look a second later missed it on a busy machine, and the save was timed
        without its sync."""
        now = self.clock()
        return any(
            w.closed_by is None and now - w.first_seen <= MAX_WATCH_SECONDS
            for work in self._workloads.values()
            for w in work.written.values()
        )

    def _children(self, pid: int) -> list[int]:
        """The process's children, from every thread's ``children`` file (at most max_processes)."""
        try:
            tids = os.listdir(self.paths.proc(str(pid), "task"))
        except OSError:
            return []
        found: list[int] = []
        for tid in tids[: self.max_processes]:
            data = _read_small(self.paths.proc(str(pid), "task", tid, "children"))
            found.extend(parse_children(data or b""))
        return found

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

    def _namespace(self, pid: int) -> dict[int, tuple[int, int, str, str]]:
        """mnt_id -> (major, minor, root, mountpoint) in the process's own mount namespace."""
        data = _read_small(self.paths.proc(str(pid), "mountinfo"), MAX_MOUNTINFO)
        if not data:
            return {}
        entries, _ = parse_mountinfo(data)
        return {e.mount_id: (e.major, e.minor, e.root, e.mountpoint) for e in entries}

    def _open_files(
        self, pid: int, ns: dict[int, tuple[int, int, str, str]], host: HostMounts, budget: _PassBudget
    ) -> tuple[set[str], set[str], bool, list[tuple[str, str, str]], list[tuple[str, str, str]]]:
        """The host mountpoints of the process's open files read in this pass (at most max_fds and what is left of
        the pass's fd budget, from where its last read stopped), whether all of them were read, the files open for
        writing among them, and the checkpoints' files open read-only: each (host path, fd, link)."""
        reads: set[str] = set()
        writes: set[str] = set()
        files: list[tuple[str, str, str]] = []
        held: list[tuple[str, str, str]] = []
        fd_dir = self.paths.proc(str(pid), "fd")
        start = self._fd_cursor.get(pid, 0)
        want = min(self.max_fds, budget.fds_left())
        if want <= 0:
            return reads, writes, False, files, held
        # scandir, not listdir: a process with 19,500 open files is listed only as far as this read goes.
        names: list[str] = []
        complete = True
        try:
            with os.scandir(fd_dir) as it:
                for entry in itertools.islice(it, start, None):
                    if len(names) >= want:
                        complete = False
                        break
                    names.append(entry.name)
        except OSError:
            return reads, writes, True, files, held
        listed_all = complete
        for done, name in enumerate(names):
            if done and not done % FD_CPU_CHECK_EVERY and budget.cpu_used() >= budget.max_cpu:
                names, listed_all = names[:done], False  # the CPU budget is spent: the rest waits for a later pass
                budget.stop("cpu")
                break
            budget.fds += 1
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
            mountpoint = host.host_mountpoint(*where[:3])
            if mountpoint is None:
                continue
            if "r" in mode:
                reads.add(mountpoint)
            if "w" in mode:
                writes.add(mountpoint)
                path = host_file(target, where[3], mountpoint)
                if path is not None:
                    files.append((path, name, target))
            elif checkpoint_member(os.path.basename(target)):
                path = host_file(target, where[3], mountpoint)
                if path is not None:
                    held.append((path, name, target))
        self._fd_cursor[pid] = 0 if listed_all else start + len(names)
        return reads, writes, listed_all and not start, files, held

    def collect(self) -> AccessFacts:
        now = self.clock()
        if self.paced and self._facts is not None and now < self._next_pass:
            # Between passes: only the open files being written, and the write counters, are looked at again.
            self._triggered(self._watch())
            return dataclasses.replace(
                self._facts,
                timestamp=now,
                workloads={
                    pid: dataclasses.replace(
                        w,
                        written=self._written(pid),
                        held=self._held(pid),
                        write_bursts=tuple(self._workloads[pid].bursts) if pid in self._workloads else w.write_bursts,
                    )
                    for pid, w in self._facts.workloads.items()
                },
            )
        self._next_pass = now + self.pass_seconds
        self._watch()
        budget = _PassBudget(self.max_processes_per_pass, self.max_fds_per_pass, self.max_cpu_seconds_per_pass)
        host = HostMounts(self.mounts() or ())
        roots = sorted(set(self.gpu_pids()))
        self.off_reason = None if roots else "no GPU process on this node (NVML names none)"
        self._pass += 1
        for gone in set(self._workloads) - set(roots):
            self._end(self._workloads[gone], now)
        self._workloads = {r: self._workloads.get(r) or _Workload() for r in roots}
        # First the counters and children: the GPU processes always (a few small reads each, so every workload is
        # known every pass), then their descendants, a process of each workload in turn, each from where its last
        # pass stopped. Half the CPU budget at most: the open files get the rest.
        for root in roots:
            self._read(root, root)
            budget.processes += 1
            if root not in self._workloads[root].records:
                self._end(self._workloads[root], now)  # exited, though the driver still names it
        pending = {r: self._workloads[r].queue(r) for r in roots if r in self._workloads[r].records}
        while pending and budget.processes_left(PROCESS_CPU_SHARE):
            for root in list(pending):
                pid = next(pending[root], None)
                if pid is None:
                    del pending[root]
                    continue
                self._workloads[root].cursor = pid
                self._read(root, pid)
                budget.processes += 1
                if not budget.processes_left(PROCESS_CPU_SHARE):
                    break
        # Then the open files: each GPU process's, then its descendants' in turn from where the last pass stopped.
        opened: dict[int, tuple[set[str], set[str], set[int]]] = {r: (set(), set(), set()) for r in roots}
        for root in roots:
            work = self._workloads[root]
            if root in work.records and budget.fds_left():
                work.ns = self._namespace(root)
                self._files_of(root, root, host, budget, opened[root])
        fd_pending = {r: self._workloads[r].fd_queue(r) for r in roots if r in self._workloads[r].records}
        while fd_pending and budget.fds_left():
            for root in list(fd_pending):
                pid = next(fd_pending[root], None)
                if pid is None:
                    del fd_pending[root]
                    continue
                self._workloads[root].fd_cursor = pid
                self._files_of(root, pid, host, budget, opened[root])
                if not budget.fds_left():
                    break
        out: dict[int, WorkloadAccess] = {}
        for root in roots:
            work = self._workloads[root]
            if root not in work.records:
                continue
            reads, writes, complete = opened[root]
            sampled = work.unread(self._pass) or not complete >= set(work.records)
            if sampled:
                for mp in reads:
                    work.seen_read[mp] = self._pass
                for mp in writes:
                    work.seen_written[mp] = self._pass
                floor = self._pass - MOUNT_MEMORY_PASSES
                work.seen_read = {m: p for m, p in work.seen_read.items() if p > floor}
                work.seen_written = {m: p for m, p in work.seen_written.items() if p > floor}
                reads, writes = set(work.seen_read), set(work.seen_written)
            else:
                work.seen_read = dict.fromkeys(reads, self._pass)
                work.seen_written = dict.fromkeys(writes, self._pass)
            read = [rec.counters for rec in work.records.values() if rec.counters is not None]
            out[root] = WorkloadAccess(
                root,
                len(read),
                summed(read),
                comm=self._comm(root),
                within=next((r for r in roots if r != root and root in self._workloads[r].records), None),
                mounts_read=tuple(sorted(reads)),
                mounts_written=tuple(sorted(writes)),
                sampled=sampled,
                processes_known=len(work.records),
                written=self._written(root),
                write_bursts=tuple(work.bursts),
                uid=self._uid(root),
                held=self._held(root),
            )
        known = {p for w in self._workloads.values() for p in w.records}
        self._fd_cursor = {p: c for p, c in self._fd_cursor.items() if p in known}
        self._files_read_at = {p: t for p, t in self._files_read_at.items() if p in known}
        # the write counters as this pass read them: the looks until the next pass compare with these
        fresh = {
            p: (w, rec.counters.wchar)
            for w in self._workloads.values()
            for p, rec in w.records.items()
            if rec.counters is not None and rec.read_pass == self._pass
        }
        for p, (w, wchar) in fresh.items():  # a burst between the last look and this pass is a burst all the same
            burst = self._burst(p, wchar, now)
            if burst is not None:
                w.bursts.append(burst)
        self._wchar = {p: self._wchar[p] for p in fresh}
        self._wchar_read = {p: self._wchar_read[p] for p in fresh}
        self._wchar_at = {p: self._wchar_at[p] for p in fresh}
        self._facts = AccessFacts(
            now,
            out,
            budget.processes,
            budget.fds,
            budget.cpu_used(),
            budget.reached(),
            self.max_workloads,
            self.max_mounts_per_workload,
            tuple(w for _, w in self._ended),
        )
        return self._facts

    def _end(self, work: _Workload, now: float) -> None:
        """Keep what an ended workload wrote (a file open at its end was closed by then)."""
        for w in work.written.values():
            if w.closed_by is None:
                w.closed_by = now
            self._ended.append((now, w.frozen()))
        work.written.clear()
        while self._ended and (len(self._ended) > MAX_ENDED_FILES or self._ended[0][0] < now - ENDED_KEEP_SECONDS):
            self._ended.popleft()

    def _written(self, root: int) -> tuple[WrittenFile, ...]:
        work = self._workloads.get(root)
        return tuple(w.frozen() for w in work.written.values()) if work is not None else ()

    def _held(self, root: int) -> tuple[HeldFile, ...]:
        work = self._workloads.get(root)
        if work is None:
            return ()
        return tuple(HeldFile(p, h.pid, h.first_seen, h.last_seen) for p, h in work.held.items())

    def _uid(self, pid: int) -> int | None:
        try:
            return os.stat(self.paths.proc(str(pid))).st_uid
        except OSError:
            return None

    def _comm(self, pid: int) -> str | None:
        data = _read_small(self.paths.proc(str(pid), "comm"), MAX_COMM)
        name = (data or b"").removesuffix(b"\n")
        if not name or len(name) >= 16:
            return None
        return name.decode("utf-8", "replace")

    def _read(self, root: int, pid: int) -> None:
        """One process of a workload: its counters and its children (now known to the workload); a process that is
        gone is forgotten."""
        work = self._workloads[root]
        io = self._io(pid)
        if io is None:
            work.records.pop(pid, None)  # exited, or not ours to read
            return
        work.update(pid, io, self._pass)
        for child in self._children(pid):
            if child not in work.records and len(work.records) < self.max_processes:
                work.records[child] = _ProcessRecord(None, 0)

    def _files_of(
        self, root: int, pid: int, host: HostMounts, budget: _PassBudget, into: tuple[set[str], set[str], set[int]]
    ) -> None:
        work = self._workloads[root]
        reads, writes, complete, files, held = self._open_files(pid, work.ns, host, budget)
        into[0].update(reads)
        into[1].update(writes)
        now = self.clock()
        for path, fd, link in held:
            known = work.held.get(path)
            if known is not None and (known.pid, known.fd, known.link) == (pid, fd, link):
                known.last_seen = now
                continue
            work.held.pop(path, None)  # another descriptor: another hold
            work.held[path] = _Held(pid, fd, link, now, now)
            while len(work.held) > MAX_HELD_FILES:
                work.held.pop(next(iter(work.held)))
        for path, fd, link in files:
            seen = work.written.get(path)
            if seen is not None and seen.closed_by is None and seen.pid == pid:
                seen.last_open = now
                continue
            work.written.pop(path, None)  # opened again (the next save to the same name): a new write
            work.written[path] = _Written(path, pid, fd, link, now, work.looked.get(pid), now)
        if complete:
            into[2].add(pid)
            work.looked[pid] = now
        if len(work.written) > MAX_WRITTEN_FILES:
            closed = [p for p, w in work.written.items() if w.closed_by is not None]
            for p in (closed + list(work.written))[: len(work.written) - MAX_WRITTEN_FILES]:
                work.written.pop(p, None)

    def _watch(self) -> set[int]:
        """Look again at each open file a workload writes (its one fd link): still linked to it, still open. The
        processes that closed one since the last look: a writer may open it again at once to sync it (``torch.save``,
        then the file opened and fsynced), writing nothing meanwhile, so the next read of its open files is now."""
        now = self.clock()
        watched = 0
        closed: set[int] = set()
        for work in self._workloads.values():
            for w in work.written.values():
                if w.closed_by is not None or now - w.first_seen > MAX_WATCH_SECONDS or watched >= MAX_WATCHED:
                    continue
                watched += 1
                link = self.paths.proc(str(w.pid), "fd", w.fd)
                try:
                    # The same file on the same descriptor, still open for writing: a file closed and opened again
                    # at once to be synced takes the lowest free descriptor, most often the one it just left, and
                    # the kernel gives a descriptor's link the permission bits of its open mode.
                    still = os.readlink(link) == w.link and bool(os.lstat(link).st_mode & stat.S_IWUSR)
                except OSError:
                    still = False
                if still:
                    w.last_open = now
                else:
                    w.closed_by = now
                    closed.add(w.pid)
        return closed

    def _burst(self, pid: int, wchar: int, now: float) -> tuple[float, float, int] | None:
        """A process's write counter read at ``now``: the burst it wrote since the last look that found it still,
        once that comes to WRITE_TRIGGER_BYTES, as (that look, now, bytes). Less is kept until it adds up, never
        dropped: a writer the device holds back (dirty pages throttled, a slow network filesystem) passes less than
        that to write calls between two looks all through its save, and would otherwise never be seen writing. A
        counter that did not move moves the burst's start to now."""
        last = self._wchar_read.get(pid)
        if last is not None and wchar != last:
            self._moved_at = now
        self._wchar_read[pid] = wchar
        before, at = self._wchar.get(pid), self._wchar_at.get(pid)
        if before is None or at is None or wchar <= before:
            self._wchar[pid], self._wchar_at[pid] = wchar, now
            return None
        if wchar - before < WRITE_TRIGGER_BYTES:
            return None
        self._wchar[pid], self._wchar_at[pid] = wchar, now
        return (at, now, wchar - before)

    def _triggered(self, closed: Collection[int] = ()) -> None:
        """Read the open files of the GPU processes and known writers that wrote WRITE_TRIGGER_BYTES since the last
        look (a save begun between passes), or that ``closed`` a file they were seen writing (the save's sync may
        follow on a second descriptor), at most MAX_TRIGGERED_PER_LOOK of them, each within one pass's budget: those
        read longest ago first, and one left out stays due for the next look (where many jobs save at once, each is
        read in turn, never the same few)."""
        # A writer that closed a file it wrote is read at each look for REOPEN_SECONDS: the sync on a second
        # descriptor follows the close at once, but a look can fall between the two (a writer descheduled there on
        # a busy node), and the sync writes nothing that would ask for another read.
        now = self.clock()
        self._closed_at = {p: t for p, t in self._closed_at.items() if now - t <= REOPEN_SECONDS}
        self._closed_at.update(dict.fromkeys(closed, now))
        due: list[tuple[int, int]] = []
        for root, work in self._workloads.items():
            if root not in work.records:
                continue
            for pid in sorted({root} | {w.pid for w in work.written.values()}):
                data = _read_small(self.paths.proc(str(pid), "io"))
                counters = parse_io(data)[0] if data is not None else None
                if counters is None:
                    self._wchar.pop(pid, None)
                    self._wchar_read.pop(pid, None)
                    continue
                burst = self._burst(pid, counters.wchar, self.clock())
                if burst is not None:
                    work.bursts.append(burst)
                elif pid not in self._due and pid not in self._closed_at:  # _closed_at holds this look's closes
                    continue
                due.append((root, pid))
        due.sort(key=lambda rp: self._files_read_at.get(rp[1], -math.inf))
        self._due = {pid for _, pid in due[MAX_TRIGGERED_PER_LOOK:]}
        host: HostMounts | None = None
        for root, pid in due[:MAX_TRIGGERED_PER_LOOK]:
            work = self._workloads[root]
            self._files_read_at[pid] = self.clock()
            if host is None:
                host = HostMounts(self.mounts() or ())
            if not work.ns:
                work.ns = self._namespace(root)
            budget = _PassBudget(1, self.max_fds, self.max_cpu_seconds_per_pass)
            self._fd_cursor.pop(pid, None)  # from its first open file: the new one is likely the last
            self._files_of(root, pid, host, budget, (set(), set(), set()))

    def close(self) -> None:
        pass


def _gpu_pids(ctx: Context) -> list[int]:
    from storwatch.sources.gpu import GPUS

    facts: GPUFacts | None = ctx.latest(GPUS)
    return sorted({p.pid for g in facts.gpus for p in g.processes}) if facts is not None else []


def make(ctx: Context, section: AccessConfig) -> AccessSource:
    """The source as the registry makes it: the GPU source's processes, joined against the newest mount table."""
    return AccessSource(ctx.paths, section, lambda: _gpu_pids(ctx), lambda: ctx.latest(MOUNTS), ctx.clock, paced=True)
