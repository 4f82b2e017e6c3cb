"""The file events source: the kernel's own word on each checkpoint write, from inotify on the run directories the
checkpoint scan has found and on its roots. A file's write span runs from its creation (or, for a file rewritten in
place, the first write to it) to its close after writing, or to its move into place (a save through a temporary and a
rename: the temporary's span, ending at the rename, becomes the final name's); a directory's from its creation to its
move into place. A file opened again at once after its close after writing (``torch.save``, then the file opened and
fsynced) says so, with when that second descriptor closed: analysis/writes.py counts it as the save's where the
kernel shows that writer's own process holding the file. Exact to the event: the helper that reads them stamps each
with the time it read it.

The watches are bounded (``max_watches``; a directory the kernel refuses, past its ``max_user_watches``, is counted
and left to the fallback), and added by a helper process (``_events_worker.py``), so a run directory on a hung mount
strands a thread there, never one of the agent's. Where the kernel gives no inotify at all, the collector fails saying
so, and write spans fall back to the writers' open files and the files' birth times (analysis/writes.py). Only
checkpoint files and their temporaries (``checkpoints.scan.checkpoint_member``) make spans: a log written beside them
makes none. The events say nothing of which process wrote: who writes a run stays the kernel's open files' word.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass

from storwatch._events_worker import REOPEN_SECONDS, command
from storwatch.checkpoints.scan import checkpoint_member
from storwatch.config import number
from storwatch.procfs.inotify import (
    IN_CLOSE_NOWRITE,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_IGNORED,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_OPEN,
    IN_Q_OVERFLOW,
)
from storwatch.sources import Context, FactsKey
from storwatch.sources.checkpoint_key import CHECKPOINTS
from storwatch.threadname import name_this_thread

log = logging.getLogger(__name__)

MAX_LINES = 200_000
"""Event lines waiting between two collections at most; past it they are dropped and counted as lost."""
SPAN_KEEP_SECONDS = 3600.0
"""Ended spans are kept this long (the write spans of the saves the scan has yet to judge)."""
MAX_OPEN = 4096
"""Files being written tracked at most (a save of thousands of shards): past it the oldest are forgotten."""
MAX_SUBDIR_DEPTH = 2
"""Directories below a watched run directory (a checkpoint's own directory, and one level in it) are watched, those
there and those that appear, this deep at most."""
ROOT_DEPTH = 3
"""Directories below a scan root watched, this deep (a root's users, their projects, their runs): the first saves of
a run the scan has not found yet are timed too."""
START_SECONDS = 10.0
"""How long the helper may take to start and say it reads requests."""
MISSING_RETRY_SECONDS = 60.0
"""A wanted directory that is not there (a run removed since the scan that found it, a root not made yet) is asked
for again this long after, or at once when the wanted directories change; not every second."""
MAX_REOPEN_SECONDS = 900.0
"""A file opened again after its close after writing and still held this long after is a reader's hold, not a save's
fsync: the reopen is forgotten (the save ends at its close after writing)."""


@dataclass(frozen=True)
class FileEventsConfig:
    enabled: bool = True
    interval_seconds: float = number(1.0, 0.1, 3600)
    """How often the events read are turned into spans (they are read as they come)."""
    max_watches: int = number(4096, 1, 1_000_000)
    """Directories watched at most (each costs about 1 KiB of the kernel's memory)."""
    max_spans: int = number(8192, 16, 1_000_000)
    """Ended write spans kept at most (the newest)."""


@dataclass(frozen=True)
class FileSpan:
    """A file's write, or a directory's making, as the kernel's events tell it."""

    path: str
    """Where it is now, as this process reaches it."""
    kind: str
    """``file`` or ``dir``."""
    start: float | None
    """Its creation, or (a file rewritten in place) its first write; None when it began out of sight (moved in from
    a directory not watched, or before its directory was watched)."""
    end: float | None
    """A file: its close after writing, or its move into place; None while it is being written. A directory: its
    move into place; None when it was made where it is."""
    end_how: str = ""
    """``closed`` or ``moved``."""
    moved_from: str | None = None
    """The temporary it was renamed from."""
    reopened: float | None = None
    """A file closed after writing (``end``) and opened again within REOPEN_SECONDS: when (a writer syncing through a
    second descriptor; or a reader: the events do not say which process, analysis/writes.py asks the open files)."""
    reclosed: float | None = None
    """When that second descriptor, and any opened while it was, were closed; None while one is still open."""


@dataclass(frozen=True)
class FileEventFacts:
    spans: tuple[FileSpan, ...] = ()
    """The ended spans of the last SPAN_KEEP_SECONDS (bounded) and the files being written now."""
    watched: int = 0
    """Directories watched."""
    refused: int = 0
    """Directories the kernel refused to watch (counted since start): their saves are timed by the fallback."""
    lost: int = 0
    """Events lost (the kernel's queue overflowed, or too many waited): spans around them may be missing."""
    ended: int = 0
    """Saves seen end since the source started (a close after writing, a move into place, the close of a sync's
    second descriptor): a count that grew brings the next checkpoint scan forward (agent/collectors.py,
    ``ScanAfterSaves``)."""

    def saving(self, now: float) -> frozenset[str]:
        """The files whose save may still be under way at ``now`` (the helper's clock, time.time()): being written;
        closed after writing and opened again, that second descriptor still open (a sync through it); or closed
        after writing less than REOPEN_SECONDS ago, which such a sync may open next. The agent reads none of them
        in full until the save is over: the events do not say whose a close is, so a read that outlasted the sync
        would be timed as the save's (sources/checkpoints.py, the deep check)."""
        return frozenset(
            s.path
            for s in self.spans
            if s.kind == "file"
            and (
                s.end is None
                or (s.reopened is not None and s.reclosed is None)
                or (s.reopened is None and s.end_how == "closed" and now - s.end <= REOPEN_SECONDS)
            )
        )


FILE_EVENTS: FactsKey[FileEventFacts] = FactsKey("file_events")


class _Helper:
    """The helper process and the thread that reads its lines."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True
        )
        self.lines: collections.deque[str] = collections.deque()
        self.dropped = 0
        self.ready = threading.Event()
        self.unavailable: str | None = None
        threading.Thread(target=self._read, name="file-events-reader", daemon=True).start()
        if not self.ready.wait(START_SECONDS):
            self.unavailable = self.unavailable or f"its helper did not start within {START_SECONDS:g} s"

    def _read(self) -> None:
        name_this_thread()
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("ascii", "replace").rstrip("\n")
            if line == "ready":
                self.ready.set()
            elif line.startswith("unavailable "):
                self.unavailable = "inotify is not available here: " + line.split(" ", 2)[-1]
                self.ready.set()
            elif len(self.lines) < MAX_LINES:
                self.lines.append(line)
            else:
                self.dropped += 1
        self.unavailable = self.unavailable or "its helper exited"
        self.ready.set()

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((line + "\n").encode("ascii"))
            self.proc.stdin.flush()
        except OSError:
            self.unavailable = self.unavailable or "its helper exited"

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(1.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class _Watches(dict[int, tuple[str, int]]):
    """Watch descriptor -> (the directory's path, its depth below a wanted directory), and how many changes it has
    seen (changed only by setting and deleting items, which count them)."""

    changes = 0

    def __setitem__(self, wd: int, where: tuple[str, int]) -> None:
        self.changes += 1
        super().__setitem__(wd, where)

    def __delitem__(self, wd: int) -> None:
        self.changes += 1
        super().__delitem__(wd)


class FileEventSource:
    name = "file_events"

    def __init__(
        self,
        section: FileEventsConfig,
        wanted: Callable[[], Iterable[tuple[str, bool]]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``wanted``: the directories to watch, each with whether it is a run directory (its new subdirectories are
        watched too): the checkpoint scan's runs and roots. It is called every collection; the object it returned
        the last time stands for the same directories (a new scan's are a new object)."""
        self.wanted = wanted
        self.clock = clock
        self._helper: _Helper | None = None
        self._ids = 0
        self._asked: dict[str, str] = {}
        """Path -> the request id of its watch (answered or not)."""
        self._by_id: dict[str, tuple[str, int]] = {}
        """Request id -> (path, depth below a run directory: 0 for a run directory or a root)."""
        self._wd = _Watches()
        """Watch descriptor -> (the directory's path, its depth)."""
        self._refused: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Directories the kernel refused to watch (the newest MAX_OPEN): not asked again."""
        self._missing: dict[str, float] = {}
        """Wanted directories found not there -> when (asked again after MISSING_RETRY_SECONDS)."""
        self.refused = 0
        self.lost = 0
        self.ended = 0
        self._open: collections.OrderedDict[str, tuple[float | None, str]] = collections.OrderedDict()
        """File being written -> (its start, its kind)."""
        self._dirs: collections.OrderedDict[str, float] = collections.OrderedDict()
        """Directories seen made -> when (the newest MAX_OPEN)."""
        self._created: collections.OrderedDict[str, float] = collections.OrderedDict()
        """Checkpoint files seen made and not yet written -> when (the newest MAX_OPEN)."""
        self._moving: dict[int, tuple[str, float, bool, float | None]] = {}
        """A rename's cookie -> (where it was moved from, when, whether a directory, when that file was made)."""
        self._born: collections.OrderedDict[str, float] = collections.OrderedDict()
        """Other files seen made (a temporary of any name, which a rename may yet make a checkpoint) -> when (the
        newest MAX_OPEN)."""
        self._reopen: dict[str, tuple[float, int]] = {}
        """A file opened again just after its close after writing -> (when, the descriptors open on it now)."""
        self._pending_auto: dict[int, int] = {}
        """A watched directory -> the watch the helper just added on a directory made in it (its event follows)."""
        self._spans: collections.deque[FileSpan] = collections.deque()
        self._given: object = None
        """What ``wanted`` returned at the last look."""
        self._wanted: dict[str, bool] = {}
        """The directories wanted at the last look, as ``wanted`` gave them."""
        self._keep: dict[str, bool] = {}
        """The same, each path normalised."""
        self._checked = -1
        """``_wd.changes`` when every watch was last found wanted, or below a wanted directory."""
        self.configure(section)

    def configure(self, section: FileEventsConfig) -> None:
        self.section = section
        self.interval_seconds = section.interval_seconds

    # -- the watches

    def _watch(self, path: str, depth: int, below: int) -> None:
        """Ask for a watch on ``path`` and on the directories ``below`` levels below it."""
        if path in self._asked or path in self._refused or len(self._wd) >= self.section.max_watches:
            return
        missing = self._missing.get(path)
        if missing is not None:
            if 0.0 <= self.clock() - missing < MISSING_RETRY_SECONDS:
                return
            del self._missing[path]
        assert self._helper is not None
        self._ids += 1
        rid = str(self._ids)
        self._asked[path] = rid
        self._by_id[rid] = (path, depth)
        self._helper.send(f"watch {rid} {below} {os.fsencode(path).hex()}")

    def _reconcile(self) -> None:
        """Watch every wanted directory, and stop watching those neither wanted nor below one that is. This comes
        every second, and a node has thousands of watches: the watches are gone through only when they or the wanted
        directories (which change with a checkpoint scan) changed since the last time."""
        given = self.wanted()
        if given is not self._given:  # the same object is the same directories: not gone through again
            self._given = given
            wanted = dict(given)
            if wanted != self._wanted:
                self._wanted = wanted
                self._keep = {os.path.normpath(p): is_run for p, is_run in wanted.items()}
                self._checked = -1
                self._missing.clear()  # a new scan: what was not there may be now
        keep = self._keep
        for path, is_run in keep.items():
            self._watch(path, 0, MAX_SUBDIR_DEPTH if is_run else ROOT_DEPTH)
        if self._wd.changes == self._checked:
            return
        for wd, (path, depth) in list(self._wd.items()):
            if path not in keep and not (depth and _below(path, keep)):
                assert self._helper is not None
                self._helper.send(f"unwatch {wd}")
                del self._wd[wd]
                self._asked.pop(path, None)
        self._checked = self._wd.changes

    # -- the events

    def _span(self, span: FileSpan) -> None:
        self._spans.append(span)
        self.ended += 1
        while len(self._spans) > self.section.max_spans:
            self._spans.popleft()

    def _moved_in(self, old: str | None, new: str, t: float, is_dir: bool, born: float | None) -> None:
        if is_dir:
            if old is not None:
                self._rekey(old, new)
            self._span(FileSpan(new, "dir", self._dirs.pop(new, None), t, "moved", old))
            return
        start: float | None = None
        if old is not None:
            opened = self._open.pop(old, None)
            if opened is not None:
                start = opened[0]
            else:
                done = next((s for s in reversed(self._spans) if s.path == old and s.kind == "file"), None)
                start = done.start if done is not None else born
        if checkpoint_member(os.path.basename(new)) or (old is not None and checkpoint_member(os.path.basename(old))):
            self._span(FileSpan(new, "file", start, t, "moved", old))
        elif born is not None:  # a temporary renamed to another temporary's name: still made then
            self._remember(self._born, new, born)

    def _rekey(self, old: str, new: str) -> None:
        """A directory moved: what is known below it is now below its new name."""
        prefix, to = old.rstrip("/") + "/", new.rstrip("/") + "/"

        def moved(path: str) -> str:
            return to + path[len(prefix) :] if path.startswith(prefix) else path

        self._open = collections.OrderedDict((moved(p), v) for p, v in self._open.items())
        self._spans = collections.deque(dataclasses.replace(s, path=moved(s.path)) for s in self._spans)
        self._dirs = collections.OrderedDict((moved(p), t) for p, t in self._dirs.items())
        self._created = collections.OrderedDict((moved(p), t) for p, t in self._created.items())
        self._born = collections.OrderedDict((moved(p), t) for p, t in self._born.items())
        self._reopen = {moved(p): v for p, v in self._reopen.items()}
        if old in self._dirs:
            self._dirs[new] = self._dirs.pop(old)
        for wd, (path, depth) in list(self._wd.items()):
            if path == old or path.startswith(prefix):
                self._wd[wd] = (to.rstrip("/") if path == old else moved(path), depth)

    def _apply(self, line: str) -> None:
        parts = line.split(" ")
        if parts[0] == "watched" and len(parts) == 3:
            where = self._by_id.pop(parts[1], None)
            if where is not None and parts[2].lstrip("-").isdigit():
                self._wd[int(parts[2])] = where
            return
        if parts[0] == "refused" and len(parts) >= 3:
            where = self._by_id.pop(parts[1], None)
            if where is not None:
                self._asked.pop(where[0], None)
                if parts[2] in (str(errno.ENOENT), str(errno.ENOTDIR)):  # not there: nothing refused
                    self._missing[where[0]] = self.clock()
                    while len(self._missing) > MAX_OPEN:
                        self._missing.pop(next(iter(self._missing)))
                else:
                    self._refused[where[0]] = None
                    while len(self._refused) > MAX_OPEN:
                        self._refused.popitem(last=False)
                    self.refused += 1
                    log.warning("file events: cannot watch %s: %s", where[0], " ".join(parts[3:]) or parts[2])
            return
        if parts[0] == "auto" and len(parts) == 3:
            self._pending_auto[int(parts[2])] = int(parts[1])
            return
        if parts[0] == "below" and len(parts) == 4:
            parent = self._wd.get(int(parts[2]))
            if parent is not None:
                child = f"{parent[0].rstrip('/')}/{os.fsdecode(bytes.fromhex(parts[3]))}"
                self._wd[int(parts[1])] = (child, parent[1] + 1)
                self._asked.setdefault(child, "")
            return
        if parts[0] != "ev" or len(parts) != 6:
            return
        try:
            t, wd, mask, cookie = float(parts[1]), int(parts[2]), int(parts[3]), int(parts[4])
            name = os.fsdecode(bytes.fromhex(parts[5]))
        except ValueError:
            return
        if mask & IN_Q_OVERFLOW:
            self.lost += 1
            return
        auto = self._pending_auto.pop(wd, None) if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO) else None
        where = self._wd.get(wd)
        if where is None:
            return
        directory, depth = where
        if mask & IN_IGNORED:  # the directory is gone (removed, unmounted): so is what is known below it
            del self._wd[wd]
            self._asked.pop(directory, None)
            self._forget(directory)
            return
        if not name:
            return
        path = f"{directory.rstrip('/')}/{name}"
        is_dir = bool(mask & IN_ISDIR)
        if auto is not None:  # the helper watched it at once
            self._wd[auto] = (path, depth + 1)
            self._asked[path] = ""
        if mask & IN_CREATE:
            if is_dir:
                self._remember(self._dirs, path, t)
            elif checkpoint_member(f"{os.path.basename(directory)}/{name}"):
                # Made, not yet written: a file opened to be written writes next; a hard link never does.
                self._remember(self._created, path, t)
            else:
                self._remember(self._born, path, t)
        elif mask & IN_OPEN and not is_dir:
            self._reopened(path, t)
        elif mask & IN_MODIFY and not is_dir:
            if path in self._reopen:  # opened again to be written, not synced: a save of its own (a rewrite)
                self._unreopen(path)
            if path not in self._open and checkpoint_member(f"{os.path.basename(directory)}/{name}"):
                made = self._created.pop(path, None)
                self._open[path] = (made if made is not None else t, "created" if made is not None else "first_write")
                self._bound_open()
        elif mask & IN_CLOSE_NOWRITE and not is_dir:
            self._reclosed(path, t)
        elif mask & IN_CLOSE_WRITE:
            if path in self._reopen and path not in self._open:  # opened for writing to sync it, nothing written
                self._reclosed(path, t)
                return
            opened = self._open.pop(path, None)
            made = self._created.pop(path, None)
            start = opened[0] if opened is not None else made
            if opened is not None or made is not None:
                self._span(FileSpan(path, "file", start, t, "closed"))
        elif mask & IN_MOVED_FROM:
            self._reopen.pop(path, None)
            self._moving[cookie] = (path, t, is_dir, self._born.pop(path, None))
            if len(self._moving) > MAX_OPEN:
                self._moving.pop(next(iter(self._moving)))
        elif mask & IN_MOVED_TO:
            old = self._moving.pop(cookie, None)
            self._moved_in(old[0] if old is not None else None, path, t, is_dir, old[3] if old is not None else None)
        elif mask & IN_DELETE:
            self._open.pop(path, None)
            self._created.pop(path, None)
            self._born.pop(path, None)
            self._reopen.pop(path, None)
            self._dirs.pop(path, None)

    def _last_closed(self, path: str) -> int | None:
        """The index in ``_spans`` of the file's newest span, where it ended at a close after writing."""
        for i in range(len(self._spans) - 1, -1, -1):
            s = self._spans[i]
            if s.path == path and s.kind == "file":
                return i if s.end_how == "closed" else None
        return None

    def _reopened(self, path: str, t: float) -> None:
        """The file opened again (the helper passes on only the opens just after a close after writing, and those
        while it is held so): the first such open marks its save's span."""
        held = self._reopen.get(path)
        if held is not None:
            self._reopen[path] = (held[0], held[1] + 1)
            return
        i = self._last_closed(path)
        if i is None:
            return
        s = self._spans[i]
        if s.end is None or not 0.0 <= t - s.end <= REOPEN_SECONDS or s.reopened is not None:
            return
        self._spans[i] = dataclasses.replace(s, reopened=t)
        self._reopen[path] = (t, 1)
        while len(self._reopen) > MAX_OPEN:
            self._reopen.pop(next(iter(self._reopen)))

    def _unreopen(self, path: str) -> None:
        """The file's reopen is not its save's after all: the save ends at its close after writing."""
        held = self._reopen.pop(path, None)
        i = self._last_closed(path)
        if held is not None and i is not None and self._spans[i].reopened == held[0]:
            self._spans[i] = dataclasses.replace(self._spans[i], reopened=None, reclosed=None)

    def _expire_reopens(self, now: float) -> None:
        """Forget the reopens held longer than MAX_REOPEN_SECONDS (a reader's long hold: those saves ended at their
        close after writing)."""
        for path, (since, _) in list(self._reopen.items()):
            if now - since > MAX_REOPEN_SECONDS:
                self._unreopen(path)

    def _reclosed(self, path: str, t: float) -> None:
        held = self._reopen.pop(path, None)
        if held is None:
            return
        if held[1] > 1:
            self._reopen[path] = (held[0], held[1] - 1)
            return
        i = self._last_closed(path)
        if i is not None and self._spans[i].reopened == held[0]:
            self._spans[i] = dataclasses.replace(self._spans[i], reclosed=t)
            self.ended += 1

    def _forget(self, directory: str) -> None:
        """Drop what is known of the files below a directory that is gone."""
        prefix = directory.rstrip("/") + "/"
        if any(s.path.startswith(prefix) for s in self._spans):
            self._spans = collections.deque(s for s in self._spans if not s.path.startswith(prefix))
        for table in (self._open, self._created, self._dirs, self._born, self._reopen):
            for path in [p for p in table if p.startswith(prefix)]:
                del table[path]

    def _bound_open(self) -> None:
        while len(self._open) > MAX_OPEN:
            self._open.popitem(last=False)

    @staticmethod
    def _remember(into: collections.OrderedDict[str, float], path: str, t: float) -> None:
        into.pop(path, None)
        into[path] = t
        while len(into) > MAX_OPEN:
            into.popitem(last=False)

    def collect(self) -> FileEventFacts:
        if self._helper is None:
            wanted = list(self.wanted())
            if not wanted:  # nowhere to watch yet: no helper either
                return FileEventFacts()
            self._helper = _Helper()
            self._helper.send(f"limit {self.section.max_watches}")
        helper = self._helper
        if helper.unavailable is not None:
            raise OSError(
                f"no file events ({helper.unavailable}): write spans fall back to the writers' open files and the "
                "files' birth times"
            )
        self._reconcile()
        while helper.lines:
            self._apply(helper.lines.popleft())
        now = self.clock()
        self._expire_reopens(now)
        while self._spans and (self._spans[0].end or now) < now - SPAN_KEEP_SECONDS:
            self._spans.popleft()
        writing = tuple(FileSpan(p, "file", start, None) for p, (start, _) in self._open.items())
        return FileEventFacts(
            tuple(self._spans) + writing, len(self._wd), self.refused, self.lost + helper.dropped, self.ended
        )

    def close(self) -> None:
        if self._helper is not None:
            self._helper.close()


def _below(path: str, directories: Container[str]) -> bool:
    """Whether ``path`` is below one of ``directories``: one of its parents is one of them (each parent looked up,
    not each directory compared: a node's thousands of watches against its hundreds of runs took 5 % of a core)."""
    parent = os.path.dirname(path)
    while parent not in directories:
        up = os.path.dirname(parent)
        if up == parent:
            return False
        parent = up
    return True


class _Wanted:
    """The checkpoint scan's runs and roots as the directories to watch: one tuple for each facts the scan gave, the
    same object until the next scan's (so the source knows them unchanged without going through them)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._facts: object = None
        self._wanted: tuple[tuple[str, bool], ...] = ()

    def __call__(self) -> tuple[tuple[str, bool], ...]:
        facts = self.ctx.latest(CHECKPOINTS)
        if facts is not self._facts:
            self._facts = facts
            self._wanted = (
                () if facts is None else (*((r.path, True) for r in facts.runs), *((r, False) for r in facts.roots))
            )
        return self._wanted


def make(ctx: Context, section: FileEventsConfig) -> FileEventSource:
    return FileEventSource(section, _Wanted(ctx), ctx.clock)
