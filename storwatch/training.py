"""Training-side helpers: atomic checkpoint saves that the agent can time exactly, and the agent's checkpoint requests.

torch is imported only inside :func:`atomic_save`; everything else works without it.

Saving::

    from storwatch.training import atomic_save, checkpoint_requested

    for step, batch in enumerate(loader):
        ...
        if step % 1000 == 0 or (step % 20 == 0 and checkpoint_requested(run_dir)):
            atomic_save(model.state_dict(), f"{run_dir}/step-{step}.pt", step=step)

Any bytes (another framework's serialisation)::

    atomic_write_bytes(payload, "/ckpt/run1/state.msgpack")

Guarantees: the final name holds either nothing, the previous file, or the complete new one, never a partial file,
whatever kills the process (SIGKILL, OOM, node power loss once the directory fsync has returned). A process killed
mid-save leaves its temporary file ``.<name>.tmp-<pid>-<random>`` behind in the same directory; :func:`is_temp_name`
recognises such names, and the agent reports them (and may delete them once their writer's pid is gone).

Event log: every save appends one JSON line ``{"path", "start", "end", "bytes", "step", "pid"}`` (times in seconds
since the epoch) to ``<dir>/.storwatch-events.jsonl``, opened with O_APPEND and fsynced, so the agent reads exact
write durations instead of guessing them from mtimes.

Checkpoint requests (the contract with the agent): when a policy rule asks for an emergency checkpoint (a node drain
is coming, the newest checkpoint is only on node-local storage), the agent creates or touches
``<run_dir>/.storwatch-checkpoint-request``. The training loop polls :func:`checkpoint_requested` cheaply (one stat,
every N steps); it is True while the request file is newer than the start of the last :func:`atomic_save` into that
run directory, so the next save answers it. :func:`acknowledge_request` removes the file when the loop answers it
another way. The request file's content is free text for people (why the agent asked); only its mtime counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import IO, Any

EVENT_LOG_NAME = ".storwatch-events.jsonl"
REQUEST_NAME = ".storwatch-checkpoint-request"
TEMP_MARKER = ".tmp-"
RUN_DIR_ENV = "STORWATCH_RUN_DIR"

_last_run_dir: str | None = None


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


def temp_name(final_name: str) -> str:
    """A fresh temporary file name for ``final_name``, in the form :func:`is_temp_name` recognises."""
    return f".{final_name}{TEMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}"


def is_temp_name(name: str) -> bool:
    """Whether a file name is one of our temporary files (a save in progress, or one killed mid-way)."""
    if not name.startswith(".") or TEMP_MARKER not in name:
        return False
    pid, _, token = name.rpartition(TEMP_MARKER)[2].partition("-")
    return pid.isdigit() and len(token) == 8 and all(c in "0123456789abcdef" for c in token)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: str, write: Callable[[IO[bytes]], None]) -> int:
    """Write through ``write`` into a temporary file, fsync it, rename it to ``path``, fsync the directory; bytes."""
    path = os.path.abspath(path)
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, temp_name(name))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
    return size


def atomic_write_bytes(data: bytes, path: str) -> int:
    """Write ``data`` to ``path`` atomically and durably; the number of bytes written."""

    def write(f: IO[bytes]) -> None:
        f.write(data)

    return _atomic_write(path, write)


def append_event(event: SaveEvent, event_log: str) -> None:
    """Append one event line; O_APPEND keeps concurrent writers' lines whole on a local filesystem."""
    line = (json.dumps(asdict(event), separators=(",", ":")) + "\n").encode()
    fd = os.open(event_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
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


def _resolve_run_dir(run_dir: str | None) -> str | None:
    return run_dir or _last_run_dir or os.environ.get(RUN_DIR_ENV) or None


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


def checkpoint_requested(run_dir: str | None = None, *, event_log: str | None = None) -> bool:
    """Whether the agent asked for a checkpoint that no save has answered yet (see the module docstring).

    ``run_dir`` defaults to the directory of this process's last :func:`atomic_save`, then ``$STORWATCH_RUN_DIR``.
    """
    directory = _resolve_run_dir(run_dir)
    if directory is None:
        return False
    try:
        requested = os.stat(os.path.join(directory, REQUEST_NAME)).st_mtime
    except OSError:
        return False
    started = last_save_start(directory, event_log)
    return started is None or requested > started


def acknowledge_request(run_dir: str | None = None) -> None:
    """Remove the request file: the loop has answered the request (or decided not to)."""
    directory = _resolve_run_dir(run_dir)
    if directory is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, REQUEST_NAME))
