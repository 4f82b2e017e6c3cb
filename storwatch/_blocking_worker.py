"""The helper process behind ``storwatch.blocking``: runs system calls that can hang in the kernel.

It is started as ``python -I -S _blocking_worker.py`` (stdlib only, nothing of the agent imported). A request is one
line ``ID OP PATH ARG...`` (the path hex-encoded bytes, the rest plain words); each runs on a thread of its own while
it runs and answers ``ID ok VALUES...``, ``ID json TEXT`` (an operation that answers with one JSON text) or
``ID err ERRNO MESSAGE``. A call stuck in the kernel strands only its thread, in this process, never in the agent: the
agent can always exit, and a hung mount costs it nothing but one thread here. Threads are kept for the next requests
once their call returns (a thread started per call cost about 0.3 ms of CPU, 27 ms for each round of statvfs on a
node with 90 mounts); the agent bounds the calls in flight, and so the threads. It exits as soon as its standard input
closes, stuck threads or not. Other helpers (``_checkpoint_worker.py``) add their operations and call :func:`serve`.
"""

import contextlib
import os
import queue
import sys
import threading
import time
from collections.abc import Callable

_out_lock = threading.Lock()


def _statvfs(path: bytes) -> list[str]:
    st = os.statvfs(path)
    return [str(v) for v in (st.f_frsize, st.f_blocks, st.f_bfree, st.f_bavail, st.f_files, st.f_ffree, st.f_flag)]


def _probe(mountpoint: bytes, scratch: str, size: str) -> list[str]:
    """Write, fsync and read back a small file in ``mountpoint/scratch``; return the three durations in seconds.

    The scratch directory is opened relative to the mountpoint without following symlinks and must be on the
    mount's own filesystem, so a path from configuration or from the mount's contents never leads elsewhere.
    """
    payload = os.urandom(int(size))
    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC
    mfd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        dfd = mfd
        for part in scratch.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                raise OSError(0, "scratch directory must not contain '..'")
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=dfd)
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=dfd)
            if dfd != mfd:
                os.close(dfd)
            dfd = nfd
        if os.fstat(dfd).st_dev != os.fstat(mfd).st_dev:
            raise OSError(0, "scratch directory is on another filesystem than the mount")
        name = f"probe-{os.getpid()}"
        t0 = time.monotonic()
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | nofollow, 0o600, dir_fd=dfd)
        try:
            os.write(fd, payload)
            t1 = time.monotonic()
            os.fsync(fd)
            t2 = time.monotonic()
        finally:
            os.close(fd)
        fd = os.open(name, os.O_RDONLY | nofollow, dir_fd=dfd)
        try:
            # Drop the file's cached pages so the read goes to the storage, not to memory.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            back = os.read(fd, len(payload))
            t3 = time.monotonic()
        finally:
            os.close(fd)
            os.unlink(name, dir_fd=dfd)
        if dfd != mfd:
            os.close(dfd)
    finally:
        os.close(mfd)
    if back != payload:
        raise OSError(0, "read back differs from what was written")
    return [repr(t1 - t0), repr(t2 - t1), repr(t3 - t2)]


OPS: dict[str, Callable[..., list[str] | str]] = {"statvfs": _statvfs, "probe": _probe}


def _reply(line: str) -> None:
    data = (line + "\n").encode()
    with _out_lock:
        os.write(1, data)


def _run(req_id: str, op: str, args: list[str]) -> str:
    """The reply line for one request: ``ok`` with words, or ``json`` with one JSON text (an op returning a str)."""
    try:
        decoded: list[object] = [bytes.fromhex(a) if i == 0 else a for i, a in enumerate(args)]
        values = OPS[op](*decoded)
        if isinstance(values, str):
            return f"{req_id} json {values}"
        return " ".join([req_id, "ok", *values])
    except OSError as err:
        msg = (err.strerror or str(err)).replace("\n", " ")
        return f"{req_id} err {err.errno or 0} {msg}"
    except Exception as err:  # a bad request must not end the worker
        return f"{req_id} err 0 {type(err).__name__}: {err}".replace("\n", " ")


class _Threads:
    """Runs each request on an idle thread, or on a new one when every thread is busy (or stuck in the kernel)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = 0
        self._requests: queue.SimpleQueue[tuple[str, str, list[str]]] = queue.SimpleQueue()

    def submit(self, request: tuple[str, str, list[str]]) -> None:
        with self._lock:
            idle = self._idle > 0
            if idle:
                self._idle -= 1
        if idle:
            self._requests.put(request)  # taken by one of the threads waiting below
        else:
            threading.Thread(target=self._serve, args=(request,), daemon=True).start()

    def _serve(self, request: tuple[str, str, list[str]]) -> None:
        while True:
            reply = _run(*request)
            with self._lock:
                self._idle += 1  # before the reply: the agent's next request (sent on it) finds this thread idle
            _reply(reply)
            request = self._requests.get()


def serve(ops: dict[str, Callable[..., list[str] | str]] | None = None) -> None:
    """Answer requests from standard input until it closes, then exit at once, stuck threads included."""
    if ops is not None:
        OPS.update(ops)
    threads = _Threads()
    for raw in sys.stdin.buffer:
        parts = raw.decode("ascii", "replace").split()
        if len(parts) < 2:
            continue
        req_id, op, args = parts[0], parts[1], parts[2:]
        if op not in OPS:
            _reply(f"{req_id} err 0 unknown operation {op}")
            continue
        threads.submit((req_id, op, args))
    # Standard input closed: the agent is gone or shutting down. Leave at once, stuck threads included.
    os._exit(0)


def main() -> None:
    serve()


if __name__ == "__main__":
    main()
