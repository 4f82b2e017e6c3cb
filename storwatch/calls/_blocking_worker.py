"""The helper process behind ``storwatch.calls.blocking``: runs system calls that can hang in the kernel.

It is started with ``python -I -S`` (no environment, no site packages), the tree it comes from first on ``sys.path``; of
the agent it imports only :mod:`storwatch.nofollow` (standard library only), whose words it uses for what a file is. A
request is one line ``ID OP PATH ARG...`` (the path hex-encoded bytes, the rest plain words); each runs on a thread of
its own while it runs and answers ``ID ok VALUES...``, ``ID json TEXT`` (an operation that answers with one JSON text)
or ``ID err ERRNO MESSAGE``. A call stuck in the kernel strands only its thread, in this process, never in the agent:
the agent can always exit, and a hung mount costs it nothing but one thread here. Threads are kept for the next requests
once their call returns (a thread started per call cost about 0.3 ms of CPU, 27 ms for each round of statvfs on a node
with 90 mounts); the agent bounds the calls in flight, and so the threads. It exits as soon as its standard input
closes, stuck threads or not. Other helpers (``_checkpoint_worker.py``) add their operations and call :func:`serve`,
which first writes ``0 ready``: the agent counts its calls' deadlines from then, so a helper slow to start on a busy
node does not make every mount of its first round look stuck.
"""

import contextlib
import os
import queue
import stat
import sys
import threading
import time
import zlib
from collections.abc import Callable, Mapping

from storwatch.nofollow import file_kind

_out_lock = threading.Lock()
READY = "0 ready"
"""The line a helper writes once it reads requests (request IDs start at 1)."""


def _statvfs(path: bytes) -> list[str]:
    st = os.statvfs(path)
    return [str(v) for v in (st.f_frsize, st.f_blocks, st.f_bfree, st.f_bavail, st.f_files, st.f_ffree, st.f_flag)]


def probe_file_name(mountpoint: bytes) -> str:
    """The probe's file name on a mount: one per node and mount, so agents of several nodes probing one shared
    filesystem, or two mounts of one export, never meet on a name; the same one each round, so a file left by a
    probe that was killed is found and removed by the next."""
    node = "".join(c if c.isalnum() or c in "-_." else "_" for c in os.uname().nodename)[:64]
    return f"probe-{node}-{zlib.crc32(mountpoint):08x}"


def _what(st: os.stat_result) -> str:
    if not stat.S_ISREG(st.st_mode):
        return file_kind(st.st_mode)
    if st.st_nlink != 1:
        return f"a file with {st.st_nlink} links"
    return f"a file owned by uid {st.st_uid}"


def _scratch_dir(mfd: int, scratch: str, uid: int) -> int:
    """Open (creating where missing, mode 0700) each directory of ``scratch`` below the mount, without following
    symlinks; each must be a real directory owned by ``uid`` and writable by nobody else. A descriptor of the last."""
    mount_dev = os.fstat(mfd).st_dev
    dfd = mfd
    try:
        for part in scratch.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                raise OSError(0, "scratch directory must not contain '..'")
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=dfd)
            # O_DIRECTORY fails at once (ENOTDIR) on a FIFO or device, O_NOFOLLOW on a symlink (ELOOP): never blocks.
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except OSError as err:
                why = f"scratch directory {part!r} is not a real directory: {err.strerror}"
                raise OSError(err.errno, why) from None
            if dfd != mfd:
                os.close(dfd)
            dfd = nfd
            st = os.fstat(dfd)
            if st.st_uid != uid or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise OSError(
                    0,
                    f"scratch directory {part!r} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}: "
                    f"refused (it must belong to uid {uid} and be writable by nobody else)",
                )
            if st.st_dev != mount_dev:
                raise OSError(0, "scratch directory is on another filesystem than the mount")
        return dfd
    except BaseException:
        if dfd != mfd:
            os.close(dfd)
        raise


def _probe(mountpoint: bytes, scratch: str, size: str) -> list[str]:
    """Write, fsync and read back a small file in ``mountpoint/scratch``; return the three durations in seconds.

    The scratch directory is opened relative to the mountpoint without following symlinks, must be on the mount's own
    filesystem and belong to this process's user, so a path from configuration or from the mount's contents never
    leads elsewhere. The file is created new (``O_EXCL``, never truncating anything) and must be a regular file with
    one link: whatever someone else put at its name (a FIFO, a symlink, a hard link to another file, a device) makes
    the probe fail with the reason, and is left alone.
    """
    payload = os.urandom(int(size))
    uid = os.geteuid()
    name = probe_file_name(mountpoint)
    mfd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        dfd = _scratch_dir(mfd, scratch, uid)
        try:
            try:
                old = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                pass
            else:
                if not stat.S_ISREG(old.st_mode) or old.st_nlink != 1 or old.st_uid != uid:
                    raise OSError(0, f"probe file {name} is {_what(old)}, not one the probe made: refused")
                os.unlink(name, dir_fd=dfd)  # our own, left by a probe that was killed
            t0 = time.monotonic()
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(name, flags, 0o600, dir_fd=dfd)
            except FileExistsError:
                raise OSError(0, f"probe file {name} appeared while the probe was creating it: refused") from None
            try:
                st = os.fstat(fd)
            except BaseException:
                os.close(fd)
                raise
            try:
                if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                    raise OSError(0, f"probe file {name} is {_what(st)} after creating it: refused")
                os.write(fd, payload)
                t1 = time.monotonic()
                os.fsync(fd)
                t2 = time.monotonic()
                # Drop the file's cached pages so the read goes to the storage, not to memory.
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                back = os.pread(fd, len(payload), 0)
                t3 = time.monotonic()
            finally:
                os.close(fd)
                # Remove the name only while it is still the file made above.
                with contextlib.suppress(OSError):
                    now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                        os.unlink(name, dir_fd=dfd)
        finally:
            if dfd != mfd:
                os.close(dfd)
    finally:
        os.close(mfd)
    if back != payload:
        raise OSError(0, "read back differs from what was written")
    return [repr(t1 - t0), repr(t2 - t1), repr(t3 - t2)]


def _lineage(path: bytes) -> list[str]:
    """``path`` resolved (symbolic links followed, ``..`` taken, as far as it exists) and the identity (``DEV:INO``)
    of it and of every directory above it, itself first: the words are the resolved path (hex), ``1`` when the path
    exists (else ``0``, and the identities start at its nearest directory that does), then the identities. Two paths
    are one file, or one lies below the other, when an identity of one is among the other's, whatever symbolic
    links or bind mounts their text goes through."""
    real = os.path.realpath(path)
    exists = True
    identities: list[str] = []
    current = real
    while True:
        try:
            st = os.stat(current)
        except (FileNotFoundError, NotADirectoryError):
            exists = exists and current != real
        else:
            identities.append(f"{st.st_dev}:{st.st_ino}")
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return [real.hex(), "1" if exists else "0", *identities]


OPS: dict[str, Callable[..., list[str] | str]] = {"statvfs": _statvfs, "probe": _probe, "lineage": _lineage}


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


def serve(ops: Mapping[str, Callable[..., list[str] | str]] | None = None) -> None:
    """Answer requests from standard input until it closes, then exit at once, stuck threads included."""
    if ops is not None:
        OPS.update(ops)
    threads = _Threads()
    _reply(READY)
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
