"""Whether a process a tenant's file names as a checkpoint's writer really writes there: the kernel's word for it.

An event line's ``pid`` and an atomic_save temporary's name are written by the tenant, so each is a claim. A claim
holds when the process, or one below it (an async save's worker), has one of the run's checkpoint files (or a
temporary of one: ``checkpoints.scan.checkpoint_member``) open for writing, read from ``<procfs>/<pid>/fd`` (the
link: where the file is, in the writer's mount namespace) and ``fdinfo`` (its access mode). A log or any other file
written under the run says nothing: a tenant who makes a shared directory a run, and names in it the PID of someone
whose log lies there, backs no claim. Once seen, the process stays a writer of that run, so the event line of a save
that was seen in progress is believed after the file is closed, and after the writer exits (its last save's line comes
then); a PID that now names another process (another start time) is no longer that writer.
The links are the kernel's: nothing here opens or stats the files themselves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from storwatch.checkpoints.scan import checkpoint_member
from storwatch.labels import WRITER_REJECT_REASONS
from storwatch.paths import HostPaths
from storwatch.procfs.pidio import access_mode, caught_signals, parse_children
from storwatch.sources import read_bounded

MAX_PROCESSES = 64
"""Processes looked at per claim: the claimed one and those below it."""
MAX_FDS = 4096
"""Open files looked at per process."""
MAX_REMEMBERED = 4096
"""(process, run) pairs remembered as seen writing."""
REJECT_REASONS = WRITER_REJECT_REASONS
GONE = "gone"


@dataclass(frozen=True)
class Writer:
    pid: int
    start_ticks: int
    """The process's start time (``stat`` field 22): a PID reused by another process is another writer."""


class WriterCheck:
    """Corroborates PID claims against the processes' open files, and remembers what it saw."""

    def __init__(self, paths: HostPaths | None = None) -> None:
        self.paths = paths or HostPaths()
        self._seen: dict[int, tuple[int, set[str]]] = {}
        """Each process seen writing, by PID: its start time and the run directories it was seen writing under."""

    def _writer(self, pid: int) -> Writer | None:
        try:
            data = read_bounded(self.paths.proc(str(pid), "stat"), 4096)
        except OSError:
            return None
        # The command name (field 2) may hold spaces and parentheses: fields after it follow the last ')'.
        fields = data.rpartition(b")")[2].split()
        if len(fields) < 20 or not fields[19].isdigit():
            return None
        return Writer(pid, int(fields[19]))

    def _tree(self, pid: int) -> list[int]:
        out: list[int] = []
        queue, seen = [pid], {pid}
        while queue and len(out) < MAX_PROCESSES:
            p = queue.pop(0)
            out.append(p)
            try:
                tids = os.listdir(self.paths.proc(str(p), "task"))
            except OSError:
                continue
            for tid in tids[:MAX_PROCESSES]:
                try:
                    children = parse_children(read_bounded(self.paths.proc(str(p), "task", tid, "children"), 65536))
                except OSError:
                    continue
                for child in children:
                    if child not in seen:
                        seen.add(child)
                        queue.append(child)
        return out

    def _writes_under(self, pid: int, directory: str) -> bool | None:
        """Whether the process has a checkpoint file (or a temporary of one) open for writing under ``directory``;
        None when the kernel refused to show its open files (EACCES, EPERM) and none of those it showed is one."""
        prefix = directory.rstrip("/") + "/"
        fd_dir = self.paths.proc(str(pid), "fd")
        refused = False
        try:
            names = os.listdir(fd_dir)
        except PermissionError:
            return None
        except OSError:
            return False
        for name in names[:MAX_FDS]:
            try:
                target = os.readlink(os.path.join(fd_dir, name))
            except PermissionError:
                refused = True
                continue
            except OSError:
                continue
            if not target.startswith("/"):
                continue  # a pipe, socket or anonymous inode
            # The link is the path in the writer's mount namespace; off Kubernetes (where PIDs are claimed at all)
            # that is the host's, which this agent sees under its rootfs.
            seen_at = self.paths.root(target.removesuffix(" (deleted)"))
            if not seen_at.startswith(prefix) or not checkpoint_member(seen_at[len(prefix) :]):
                continue
            try:
                mode = access_mode(read_bounded(self.paths.proc(str(pid), "fdinfo", name), 4096))
            except OSError:
                continue
            if mode is not None and "w" in mode:
                return True
        return None if refused else False

    def look(self, pid: int, run: str) -> str | None:
        """None when the process (or one below it) writes under ``run`` now or was seen to, else the reason the
        claim is refused: one of REJECT_REASONS, or GONE when no such process lives and none was seen."""
        writer = self._writer(pid)
        known = self._seen.get(pid)
        if known is not None and writer is not None and writer.start_ticks != known[0]:
            del self._seen[pid]  # the PID names another process now
            known = None
        if known is not None and run in known[1]:
            return None
        if writer is None:
            return GONE
        refused = False
        for p in self._tree(pid):
            writes = self._writes_under(p, run)
            if writes:
                if known is None and len(self._seen) >= MAX_REMEMBERED:
                    self._seen.pop(next(iter(self._seen)))
                self._seen.setdefault(pid, (writer.start_ticks, set()))[1].add(run)
                return None
            refused = refused or writes is None
        return "not_visible" if refused else "not_writer"

    def forget_reused(self) -> None:
        """Drop the writers whose PID now names another process (a writer that exited is kept: its last lines come
        after it is gone, and a PID of no process ties nothing to a GPU)."""
        for pid, (ticks, _) in list(self._seen.items()):
            now = self._writer(pid)
            if now is not None and now.start_ticks != ticks:
                del self._seen[pid]


def started_at(paths: HostPaths, pid: int) -> float | None:
    """When the process started, in seconds since the epoch (``stat`` field 22 after the boot time in ``stat``'s
    ``btime``, which the kernel gives to the second); None when either cannot be read."""
    writer = WriterCheck(paths)._writer(pid)
    if writer is None:
        return None
    try:
        text = read_bounded(paths.proc("stat"), 1 << 20)
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(b"btime "):
            boot = line.split()[1]
            if boot.isdigit():
                return int(boot) + writer.start_ticks / os.sysconf("SC_CLK_TCK")
    return None


def catches(paths: HostPaths, pid: int, signum: int) -> bool | None:
    """Whether the process has a handler for signal ``signum`` (its ``SigCgt``); None when that cannot be read."""
    try:
        mask = caught_signals(read_bounded(paths.proc(str(pid), "status"), 1 << 16))
    except OSError:
        return None
    return None if mask is None else bool(mask >> (signum - 1) & 1)
