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

import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

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
class _Workload:
    """A GPU process and its descendants as known across passes."""

    records: dict[int, _ProcessRecord] = field(default_factory=dict)
    """By PID, the GPU process first, then in the order found."""
    cursor: int = 0
    """The last descendant whose counters were read: the next pass goes on after it."""
    fd_cursor: int = 0
    """The last descendant whose open files were read: likewise."""
    ns: dict[int, tuple[int, int, str]] = field(default_factory=dict)
    seen_read: dict[str, int] = field(default_factory=dict)
    """Mountpoint -> the pass it was last seen open for reading."""
    seen_written: dict[str, int] = field(default_factory=dict)

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
        self._workloads: dict[int, _Workload] = {}
        """Each GPU process's workload as known across passes."""
        self._fd_cursor: dict[int, int] = {}
        """Where the next read of a process's open files starts (its fd directory's order)."""
        self._pass = 0
        self.parse_errors = 0
        self._bad = OnceLog(log)
        self.off_reason: str | None = None
        """Set while no GPU process is on this node: there is nothing to read, which is not a success."""

    def configure(self, config: AccessConfig) -> None:
        self.interval_seconds = config.interval_seconds
        self.max_processes = config.max_processes
        self.max_fds = config.max_fds
        self.max_processes_per_pass = config.max_processes_per_pass
        self.max_fds_per_pass = config.max_fds_per_pass
        self.max_cpu_seconds_per_pass = config.max_cpu_seconds_per_pass
        self.max_workloads = config.max_workloads
        self.max_mounts_per_workload = config.max_mounts_per_workload

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

    def _namespace(self, pid: int) -> dict[int, tuple[int, int, str]]:
        """mnt_id -> (major, minor, root) in the process's own mount namespace."""
        data = _read_small(self.paths.proc(str(pid), "mountinfo"), MAX_MOUNTINFO)
        if not data:
            return {}
        entries, _ = parse_mountinfo(data)
        return {e.mount_id: (e.major, e.minor, e.root) for e in entries}

    def _open_files(
        self, pid: int, ns: dict[int, tuple[int, int, str]], host: HostMounts, budget: _PassBudget
    ) -> tuple[set[str], set[str], bool]:
        """The host mountpoints of the process's open files read in this pass (at most max_fds and what is left of
        the pass's fd budget, from where its last read stopped), and whether all of them were read."""
        reads: set[str] = set()
        writes: set[str] = set()
        fd_dir = self.paths.proc(str(pid), "fd")
        start = self._fd_cursor.get(pid, 0)
        want = min(self.max_fds, budget.fds_left())
        if want <= 0:
            return reads, writes, False
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
            return reads, writes, True
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
            mountpoint = host.host_mountpoint(*where)
            if mountpoint is None:
                continue
            if "r" in mode:
                reads.add(mountpoint)
            if "w" in mode:
                writes.add(mountpoint)
        self._fd_cursor[pid] = 0 if listed_all else start + len(names)
        return reads, writes, listed_all and not start

    def collect(self) -> AccessFacts:
        now = self.clock()
        budget = _PassBudget(self.max_processes_per_pass, self.max_fds_per_pass, self.max_cpu_seconds_per_pass)
        host = HostMounts(self.mounts() or ())
        roots = sorted(set(self.gpu_pids()))
        self.off_reason = None if roots else "no GPU process on this node (NVML names none)"
        self._pass += 1
        self._workloads = {r: self._workloads.get(r) or _Workload() for r in roots}
        # First the counters and children: the GPU processes always (a few small reads each, so every workload is
        # known every pass), then their descendants, a process of each workload in turn, each from where its last
        # pass stopped. Half the CPU budget at most: the open files get the rest.
        for root in roots:
            self._read(root, root)
            budget.processes += 1
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
            )
        known = {p for w in self._workloads.values() for p in w.records}
        self._fd_cursor = {p: c for p, c in self._fd_cursor.items() if p in known}
        return AccessFacts(
            now,
            out,
            budget.processes,
            budget.fds,
            budget.cpu_used(),
            budget.reached(),
            self.max_workloads,
            self.max_mounts_per_workload,
        )

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
        reads, writes, complete = self._open_files(pid, self._workloads[root].ns, host, budget)
        into[0].update(reads)
        into[1].update(writes)
        if complete:
            into[2].add(pid)

    def close(self) -> None:
        pass


def _gpu_pids(ctx: Context) -> list[int]:
    from storwatch.sources.gpu import GPUS

    facts: GPUFacts | None = ctx.latest(GPUS)
    return sorted({p.pid for g in facts.gpus for p in g.processes}) if facts is not None else []


def make(ctx: Context, section: AccessConfig) -> AccessSource:
    """The source as the registry makes it: the GPU source's processes, joined against the newest mount table."""
    return AccessSource(ctx.paths, section, lambda: _gpu_pids(ctx), lambda: ctx.latest(MOUNTS), ctx.clock)
