"""Atomic checkpoint saves that the agent can time exactly, and the run's event log where every save says when it
began and ended (this process's own saves, and the frameworks' saves the callbacks report).

torch is imported only inside :func:`atomic_save`; everything else is the standard library.

Saving::

    from storwatch_training import atomic_save, checkpoint_requested

    for step, batch in enumerate(loader):
        ...
        if step % 1000 == 0 or (step % 20 == 0 and checkpoint_requested(run_dir)):
            atomic_save(model.state_dict(), f"{run_dir}/step-{step}.pt", step=step)

Any bytes (another framework's serialisation)::

    atomic_write_bytes(payload, "/ckpt/run1/state.msgpack")

Guarantees: the final name holds either nothing, the previous file, or the complete new one, never a partial file,
whatever kills the process (SIGKILL, OOM, node power loss once the directory fsync has returned). A process killed
mid-save leaves its temporary file ``.<name>.tmp-<pid>-<random>`` behind in the same directory (:func:`is_temp_name`
recognises such names). The writer holds an ``flock`` on its temporary from creating it until it is renamed, so
anyone can tell whether the writer is gone with a non-blocking lock attempt, whatever PID namespace it ran in (the
agent sees host PIDs, a pod writes its own): :func:`orphaned_temp` says so. The agent reports such orphaned
temporaries (``storwatch_checkpoint_orphaned_temp_bytes{run}``, ``/status``, ``storwatch verify``) and never touches
them; the next :func:`atomic_save` or :func:`atomic_write_bytes` into the same directory removes them
(:func:`remove_orphaned_temps`). Temporaries written without the lock (by earlier versions, whose random part has 8
hex digits instead of 16, or on a filesystem without ``flock``) count as orphaned once unchanged for
``UNLOCKED_TEMP_SECONDS`` (an hour), and none is called orphaned while it changed within ``TEMP_GRACE_SECONDS`` (a
minute).

Event log: every save appends one JSON line ``{"path", "start", "end", "bytes", "step", "pid"}`` (times in seconds
since the epoch) to ``<dir>/.storwatch-events.jsonl``, where ``<dir>`` holds the checkpoint (a file, or a checkpoint
directory such as the Trainer's ``checkpoint-N/``, whose ``bytes`` are those of every regular file below it), opened
with O_APPEND (not fsynced: see append_event), so the agent reads exact write durations instead of guessing them
from mtimes (storwatch/checkpoints/events.py checks each line against the kernel's times of the file it names).
:func:`record_save` writes the line for a save made by other code (the framework callbacks).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import IO, Any

EVENT_LOG_NAME = ".storwatch-events.jsonl"
TEMP_MARKER = ".tmp-"

_last_run_dir: str | None = None
"""The directory of this process's last :func:`atomic_save` (where :func:`checkpoint_requested` looks by default)."""


@dataclass(frozen=True)
class SaveEvent:
    path: str
    """Absolute final path of the checkpoint."""
    start: float
    """When the save began (seconds since the epoch)."""
    end: float
    """When the file was renamed into place and the directory fsynced."""
    bytes: int
    """Size of the file written."""
    step: int | None
    """The training step, when the caller gave one."""
    pid: int
    """The writing process."""


_LOCKED_TOKEN_DIGITS = 16
"""Hex digits of the random part of a temporary written under its writer's flock (this version)."""
_UNLOCKED_TOKEN_DIGITS = 8
"""... and of one written without it (earlier versions)."""
TEMP_GRACE_SECONDS = 60.0
"""A temporary changed less than this ago is never called orphaned, lock or not: its writer may be between creating
and locking it, or on another node of a filesystem whose flock is local to each node (NFS with local_lock=flock,
Lustre with localflock, FUSE filesystems); a writer that is writing keeps changing its mtime."""
UNLOCKED_TEMP_SECONDS = 3600.0
"""A temporary whose writer's lock cannot be tested counts as orphaned once unchanged for this long."""
# flock refused by the filesystem (some FUSE and NFS set-ups), not held by anyone.
_NO_FLOCK = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS})


@dataclass(frozen=True)
class OrphanedTemp:
    name: str
    """The temporary's file name (in the directory it was tested in)."""
    size_bytes: int
    mtime: float
    why: str
    """How its writer was found gone: a free lock, or its age where there is no lock to test."""
    allocated_bytes: int = 0
    """The space it takes (``st_blocks * 512``): what removing it frees, whatever size a sparse file claims."""


def temp_name(final_name: str) -> str:
    """A fresh temporary file name for ``final_name``, in the form :func:`is_temp_name` recognises. Its random part is
    from ``os.urandom``, as ``secrets.token_hex`` takes it: ``secrets`` would bring in ``hashlib`` and with it OpenSSL's
    libcrypto (3.4 MB resident) into every process that reads this module, the agent's checkpoint helper among them."""
    return f".{final_name}{TEMP_MARKER}{os.getpid()}-{os.urandom(_LOCKED_TOKEN_DIGITS // 2).hex()}"


def _token(name: str) -> str | None:
    if not name.startswith(".") or TEMP_MARKER not in name:
        return None
    pid, _, token = name.rpartition(TEMP_MARKER)[2].partition("-")
    if not (pid.isdigit() and pid.isascii()) or len(token) not in (_LOCKED_TOKEN_DIGITS, _UNLOCKED_TOKEN_DIGITS):
        return None
    return token if all(c in "0123456789abcdef" for c in token) else None


def temp_writer_pid(name: str) -> int | None:
    """The PID (in the writer's PID namespace) that a temporary's name carries, or None for a name not ours."""
    if _token(name) is None:
        return None
    pid = int(name.rpartition(TEMP_MARKER)[2].partition("-")[0])
    return pid if 0 < pid < 1 << 22 else None


def is_temp_name(name: str) -> bool:
    """Whether a file name is one of our temporary files (a save in progress, or one killed mid-way)."""
    return _token(name) is not None


def _orphan(dir_fd: int, name: str, now: float, hold: bool) -> tuple[OrphanedTemp | None, int | None]:
    """The test behind :func:`orphaned_temp`; with ``hold``, an orphan comes with its descriptor, still locked."""
    token = _token(name)
    if token is None:
        return None, None
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None, None
    # Only a regular file with one link can be ours: never open a FIFO, device or someone's hard link.
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        return None, None
    age = now - st.st_mtime
    if age < TEMP_GRACE_SECONDS:
        return None, None
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None, None
    found: OrphanedTemp | None = None
    try:
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) == (st.st_dev, st.st_ino) and stat.S_ISREG(fst.st_mode):
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                lockable = True
            except BlockingIOError:
                return None, None  # its writer holds the lock: a save in progress
            except OSError as err:
                if err.errno not in _NO_FLOCK:
                    return None, None
                lockable = False
            if lockable and len(token) == _LOCKED_TOKEN_DIGITS:
                found = OrphanedTemp(
                    name, fst.st_size, fst.st_mtime, "its writer holds no lock on it", fst.st_blocks * 512
                )
            elif age >= UNLOCKED_TEMP_SECONDS:
                found = OrphanedTemp(
                    name,
                    fst.st_size,
                    fst.st_mtime,
                    f"no writer's lock to test; unchanged for {age:.0f} s",
                    fst.st_blocks * 512,
                )
    finally:
        if found is None or not hold:
            os.close(fd)
    return found, (fd if found is not None and hold else None)


def orphaned_temp(dir_fd: int, name: str, now: float | None = None) -> OrphanedTemp | None:
    """``name`` in the directory ``dir_fd`` when it is one of our temporaries and its writer is gone, else None.

    Never blocks (a non-blocking shared lock; a FIFO or device is never opened), never writes, and holds the lock only
    for the test. ``now`` (seconds since the epoch) is for the age rules (``TEMP_GRACE_SECONDS``,
    ``UNLOCKED_TEMP_SECONDS``)."""
    found, _ = _orphan(dir_fd, name, time.time() if now is None else now, hold=False)
    return found


def remove_orphaned_temps(directory: str, now: float | None = None) -> list[OrphanedTemp]:
    """Remove the temporaries in ``directory`` whose writer is gone (see :func:`orphaned_temp`); what was removed.

    Each is unlinked while this process holds its lock, after checking the name still leads to the file tested."""
    when = time.time() if now is None else now
    removed: list[OrphanedTemp] = []
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return removed
    try:
        with os.scandir(dir_fd) as entries:
            names = [e.name for e in entries if is_temp_name(e.name)]
        for name in names:
            found, fd = _orphan(dir_fd, name, when, hold=True)
            if found is None or fd is None:
                continue
            try:
                held = os.fstat(fd)
                now_st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if (now_st.st_dev, now_st.st_ino) == (held.st_dev, held.st_ino):
                    os.unlink(name, dir_fd=dir_fd)
                    removed.append(found)
            except OSError:
                pass
            finally:
                os.close(fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
    return removed


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: str, write: Callable[[IO[bytes]], None]) -> int:
    """Write through ``write`` into a temporary file, fsync it, rename it to ``path``, fsync the directory; bytes.

    The temporary is locked (flock) from its creation until after the rename, so a lock anyone can take on a
    temporary means its writer is gone; then the directory's orphaned temporaries are removed."""
    path = os.path.abspath(path)
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, temp_name(name))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            except OSError as err:
                if err.errno not in _NO_FLOCK:
                    raise
            write(f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
            os.replace(tmp, path)  # still open, so still locked: never seen unlocked under its temporary name
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
    remove_orphaned_temps(directory)
    return size


def atomic_write_bytes(data: bytes, path: str) -> int:
    """Write ``data`` to ``path`` atomically and durably; the number of bytes written."""

    def write(f: IO[bytes]) -> None:
        f.write(data)

    return _atomic_write(path, write)


def append_event(event: SaveEvent, event_log: str) -> None:
    """Append one event line; O_APPEND keeps concurrent writers' lines whole on a local filesystem.

    Not fsynced: the checkpoint is already durable, and the line only times it. A flush here was a second trip to the
    disk in every save, time the training loop spent blocked outside the span the line records (on the end-to-end
    test's slow mount, 27 ms a save, 2 % of it). A crash loses at most the timing of the last saves."""
    line = (json.dumps(asdict(event), separators=(",", ":"), allow_nan=False) + "\n").encode()
    fd = os.open(event_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def atomic_save(obj: Any, path: str, *, step: int | None = None, event_log: str | None = None) -> SaveEvent:
    """``torch.save(obj)`` to ``path`` atomically and durably, and record the save in the run's event log."""
    import torch

    global _last_run_dir
    path = os.path.abspath(path)
    start = time.time()
    size = _atomic_write(path, lambda f: torch.save(obj, f))
    event = SaveEvent(path, start, time.time(), size, step, os.getpid())
    run_dir = os.path.dirname(path)
    append_event(event, event_log or os.path.join(run_dir, EVENT_LOG_NAME))
    _last_run_dir = run_dir
    return event


def last_save_start(run_dir: str, event_log: str | None = None) -> float | None:
    """Start time of the newest save recorded in the run's event log (its last line), or None."""
    log = event_log or os.path.join(run_dir, EVENT_LOG_NAME)
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - 4096, 0))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return float(json.loads(line)["start"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def checkpoint_bytes(path: str) -> int:
    """A checkpoint's size as the agent's scan counts it: a file's size, or the sum of the sizes of the regular files
    below a checkpoint directory (symbolic links never followed)."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    total = 0
    for directory, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):  # removed while counted
                member = os.lstat(os.path.join(directory, name))
                if stat.S_ISREG(member.st_mode):
                    total += member.st_size
    return total


def record_save(path: str, start: float, end: float, step: int | None = None) -> SaveEvent:
    """Record a save that other code made (a framework's) in the event log of the directory holding it: ``path`` is
    the checkpoint (a file or a checkpoint directory), ``start`` and ``end`` (seconds since the epoch) when the save
    began and when it had returned with its files closed. The agent takes the line only where the kernel's times of
    the checkpoint agree with it (storwatch/checkpoints/events.py)."""
    path = os.path.abspath(path)
    event = SaveEvent(path, start, end, checkpoint_bytes(path), step, os.getpid())
    append_event(event, os.path.join(os.path.dirname(path), EVENT_LOG_NAME))
    return event
