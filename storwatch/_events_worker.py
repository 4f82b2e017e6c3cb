"""The helper process behind the file events source (``sources/fileevents.py``): it holds an inotify descriptor, adds
and removes watches as the agent asks, and streams the kernel's events back, each stamped with the time it read them.
Watches are added in order on a thread of their own (the lookup of a directory on a hung mount blocks in the kernel: it
strands that thread here, never one of the agent's, and the next watches go to a new thread). Standard library only.

Requests, one a line on standard input: ``limit N`` (watches held at most), ``watch ID DEPTH HEXPATH`` (answered
``watched ID WD`` or ``refused ID ERRNO TEXT``; then each directory below it, DEPTH levels down, is watched too, each
said as ``below WD PARENT_WD HEXNAME``), ``unwatch WD``. A directory made (or moved in) below a watch of DEPTH above 0
is watched at once, with DEPTH one less, before its files are written: ``auto WD PARENT_WD`` precedes that directory's
event. Lines out: ``ready`` once it reads requests, then, as they come, ``ev TIME WD MASK COOKIE HEXNAME`` (TIME the
wall clock when the event was read, the name hex-encoded bytes) and the answers. Of the opens and the closes without
writing, only those of a file opened again within REOPEN_SECONDS of its close after writing go out (a writer that
syncs through a second descriptor, as ``torch.save`` then open and fsync does), with the closes that end them: every
other open is a reader's, and a node reads far more files than it writes. It exits when its standard input closes.
"""

from __future__ import annotations

import collections
import ctypes
import os
import queue
import sys
import threading
import time
from typing import TypeVar

from storwatch.procfs.inotify import (
    IN_CLOSE_NOWRITE,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_IGNORED,
    IN_ISDIR,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_OPEN,
    WATCH_MASK,
    parse_events,
)

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
READ_BYTES = 1 << 16
REOPEN_SECONDS = 1.0
"""A file opened again this soon after its close after writing is its writer's (an fsync through a second descriptor
follows the close at once); an open later than that is a reader's."""
STRANDED_SECONDS = 1.0
"""A watch still being added after this long (its directory's lookup hangs in the kernel) is left to its thread; the
next ones are added on a new thread."""
MAX_REOPEN_TRACKED = 4096
"""Files remembered as just closed after writing, and as opened again, each at most (the newest)."""

_V = TypeVar("_V")


def _bounded(table: collections.OrderedDict[tuple[int, bytes], _V], key: tuple[int, bytes], value: _V) -> None:
    """``key`` set to ``value`` as the newest entry, the oldest dropped past MAX_REOPEN_TRACKED."""
    table.pop(key, None)
    table[key] = value
    while len(table) > MAX_REOPEN_TRACKED:
        table.popitem(last=False)


class ReopenFilter:
    """Which opens and closes without writing go out: the opens of a file within REOPEN_SECONDS of its close after
    writing, or while it is held open again so, and the closes that end those; none of a directory. Every other
    event goes out as it is."""

    def __init__(self) -> None:
        self.closed: collections.OrderedDict[tuple[int, bytes], float] = collections.OrderedDict()
        """(watch, name) -> its last close after writing (the newest MAX_REOPEN_TRACKED)."""
        self.held: collections.OrderedDict[tuple[int, bytes], int] = collections.OrderedDict()
        """(watch, name) -> opens passed on and not yet closed."""

    def keep(self, wd: int, mask: int, name: bytes, now: float) -> bool:
        if not mask & (IN_OPEN | IN_CLOSE_NOWRITE | IN_CLOSE_WRITE | IN_DELETE | IN_MOVED_FROM):
            return True
        if mask & IN_ISDIR or not name:
            return not mask & (IN_OPEN | IN_CLOSE_NOWRITE)
        key = (wd, name)
        if mask & IN_OPEN:
            closed = self.closed.get(key)
            if key not in self.held and (closed is None or not 0.0 <= now - closed <= REOPEN_SECONDS):
                return False
            _bounded(self.held, key, self.held.get(key, 0) + 1)
            return True
        if mask & (IN_CLOSE_NOWRITE | IN_CLOSE_WRITE):
            count = self.held.pop(key, None)
            if count is not None and count > 1:
                self.held[key] = count - 1
            if mask & IN_CLOSE_WRITE:
                _bounded(self.closed, key, now)
                return True
            return count is not None
        self.closed.pop(key, None)  # removed, or renamed away: what was known of that name is not of the next one
        self.held.pop(key, None)
        return True


class _Inotify:
    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.inotify_init1.argtypes = [ctypes.c_int]
        self.libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        fd = self.libc.inotify_init1(_IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        self.fd = fd

    def add(self, path: bytes) -> int:
        wd = self.libc.inotify_add_watch(self.fd, path, WATCH_MASK)
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        return int(wd)

    def remove(self, wd: int) -> None:
        self.libc.inotify_rm_watch(self.fd, wd)


_out = threading.Lock()


def _say(line: str) -> None:
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


_paths: dict[int, tuple[bytes, int]] = {}
"""Each watch's directory and the depth below it still watched as directories appear."""
_paths_lock = threading.Lock()
_limit = [4096]
"""Watches held at most (the agent's ``file_events.max_watches``)."""
_adding = [0]
"""Watches being added now (each on a thread of its own): they count against the limit until they are held."""


def _add(notify: _Inotify, path: bytes, depth: int) -> int:
    with _paths_lock:
        if len(_paths) + _adding[0] >= _limit[0]:
            raise OSError(28, "past file_events.max_watches")  # ENOSPC, as the kernel's own limit says
        _adding[0] += 1
    try:
        wd = notify.add(path)
    except OSError:
        with _paths_lock:
            _adding[0] -= 1
        raise
    with _paths_lock:
        _adding[0] -= 1
        _paths[wd] = (path, depth)
    return wd


def _watch(notify: _Inotify, req_id: str, path: bytes, depth: int) -> None:
    try:
        wd = _add(notify, path, depth)
    except OSError as err:
        _say(f"refused {req_id} {err.errno or 0} {(err.strerror or str(err)).replace(chr(10), ' ')}")
        return
    _say(f"watched {req_id} {wd}")
    # The directories already below it: a run's checkpoint directories, a root's users and their runs.
    lines = _watch_tree(notify, wd, path, depth)
    if lines:
        _say("\n".join(lines))


def _watch_tree(notify: _Inotify, wd: int, path: bytes, depth: int) -> list[str]:
    """Watch the directories below ``path`` (watched as ``wd``), ``depth`` levels down; a ``below`` line for each."""
    lines = []
    queue = [(wd, path, depth)]
    while queue:
        parent_wd, parent, left = queue.pop(0)
        if left <= 0:
            continue
        try:
            with os.scandir(parent) as it:
                names = [e.name for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for name in sorted(names):
            child = os.path.join(parent, os.fsencode(name))
            try:
                child_wd = _add(notify, child, left - 1)
            except OSError:
                continue
            lines.append(f"below {child_wd} {parent_wd} {os.fsencode(name).hex()}")
            queue.append((child_wd, child, left - 1))
    return lines


def _watch_below(notify: _Inotify, parent_wd: int, name: bytes) -> tuple[int, list[str]] | None:
    """Watch a directory just made (or moved in) below a watch that watches what appears below it: its watch, and the
    ``below`` lines of the directories already in it (``mkdir -p run/ckpt-1`` makes the second before the first is
    watched; one moved in comes with its tree); None when not watched. Here, at once: by the time the agent read the
    event, the directory's first files would be written. A lookup that hangs (a mount that hangs) holds this loop, in
    this helper only; the agent then sees no events and falls back."""
    with _paths_lock:
        parent = _paths.get(parent_wd)
    if parent is None or parent[1] <= 0:
        return None
    path, depth = parent[0].rstrip(b"/") + b"/" + name, parent[1] - 1
    try:
        wd = _add(notify, path, depth)
    except OSError:
        return None
    return wd, _watch_tree(notify, wd, path, depth)


class _Watcher:
    """A thread that adds the watches asked of it, one after another."""

    def __init__(self, notify: _Inotify) -> None:
        self.notify = notify
        self.todo: queue.SimpleQueue[tuple[str, bytes, int, threading.Event] | None] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="watcher", daemon=True).start()

    def _serve(self) -> None:
        while (item := self.todo.get()) is not None:
            req_id, path, depth, done = item
            _watch(self.notify, req_id, path, depth)
            done.set()


def _watches(notify: _Inotify, todo: queue.SimpleQueue[tuple[str, bytes, int]]) -> None:
    """Add the watches asked for, in order, on one thread: a watch that takes longer than STRANDED_SECONDS (a lookup on
    a hung mount) is left to its thread, and a new thread adds the next ones. (A thread for each request, as before,
    had hundreds at once as the agent started, and held their stacks: 5 MB more at the helper's peak.)"""
    watcher: _Watcher | None = None
    while True:
        req_id, path, depth = todo.get()
        watcher = watcher or _Watcher(notify)
        done = threading.Event()
        watcher.todo.put((req_id, path, depth, done))
        if not done.wait(STRANDED_SECONDS):
            watcher.todo.put(None)  # it ends once its lookup returns, if ever
            watcher = None


def _requests(notify: _Inotify) -> None:
    todo: queue.SimpleQueue[tuple[str, bytes, int]] = queue.SimpleQueue()
    threading.Thread(target=_watches, args=(notify, todo), daemon=True).start()
    for line in sys.stdin:
        parts = line.split()
        if len(parts) == 4 and parts[0] == "watch" and parts[2].isdigit():
            try:
                path = bytes.fromhex(parts[3])
            except ValueError:
                continue
            todo.put((parts[1], path, int(parts[2])))
        elif len(parts) == 2 and parts[0] == "limit" and parts[1].isdigit():
            _limit[0] = int(parts[1])
        elif len(parts) == 2 and parts[0] == "unwatch" and parts[1].isdigit():
            with _paths_lock:
                _paths.pop(int(parts[1]), None)
            notify.remove(int(parts[1]))
    os._exit(0)  # the agent is gone, or asked this helper to stop


def main() -> None:
    try:
        notify = _Inotify()
    except OSError as err:
        _say(f"unavailable {err.errno or 0} {err.strerror or err}")
        return
    _say("ready")
    threading.Thread(target=_requests, args=(notify,), daemon=True).start()
    reopens = ReopenFilter()
    while True:
        data = os.read(notify.fd, READ_BYTES)
        now = time.time()
        events, _ = parse_events(data)
        lines = []
        for e in events:
            if not reopens.keep(e.wd, e.mask, e.name, now):
                continue
            if e.mask & IN_IGNORED:  # the kernel dropped the watch (its directory is gone): no longer held
                with _paths_lock:
                    _paths.pop(e.wd, None)
            below: list[str] = []
            if e.mask & IN_ISDIR and e.mask & (IN_CREATE | IN_MOVED_TO) and e.name:
                child = _watch_below(notify, e.wd, e.name)
                if child is not None:
                    lines.append(f"auto {child[0]} {e.wd}")  # before its event, which it belongs to
                    below = child[1]  # after it: the agent knows the new directory from its event
            lines.append(f"ev {now:.6f} {e.wd} {e.mask} {e.cookie} {e.name.hex()}")
            lines += below
        if lines:
            with _out:
                sys.stdout.write("\n".join(lines) + "\n")
                sys.stdout.flush()


def command() -> list[str]:
    """How the source starts this helper: isolated (``-I``), without ``site`` (``-S``: it needs the standard library
    alone), with the tree this module comes from first on ``sys.path``."""
    tree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"import sys; sys.path.insert(0, {tree!r}); from storwatch._events_worker import main; main()"
    return [sys.executable, "-I", "-S", "-c", code]
