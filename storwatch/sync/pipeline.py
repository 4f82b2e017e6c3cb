"""The copy of one file's bytes, and their read-back: the reader (the copy's own thread) reads, hashes and writes each
chunk through the page cache, as ``cp`` does, and asks the kernel to start writing it out; a verifier thread at most
LAG chunks behind waits until each is on the device, drops it from the page cache and reads it back (so from the
device) and hashes it; a syncer thread fsyncs each file while the next is written."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import xxhash

from storwatch.sync.result import HASH_NAME, Abort
from storwatch.sync.tree import Entry

CHUNK = 16 << 20
"""Bytes read and written at a time: each chunk is written out, waited for and read back as one range."""
READ_BACK = 8 << 20
"""Bytes read back at a time, each piece dropped from the page cache once hashed (the kernel's readahead keeps the
device busy between the reads)."""
LAG = 2
"""Chunks written and waiting for their read-back, at most: the reader's lead. The copy's memory is its two buffers
(CHUNK + READ_BACK, 24 MiB), and at most ``LAG + 2`` chunks of the copy (64 MiB) are in the page cache at once,
written or being read back: about 90 MiB in the DaemonSet's memory cgroup beside the agent. Of the settings tried
here, 16 MiB chunks two ahead and 32 MiB chunks one ahead copied fastest, a 2 GiB file and 64 shards alike, and
the first holds less (BENCHMARKS.md)."""


@dataclass
class FileJob:
    entry: Entry
    fd: int
    """The copy, open for writing."""
    verify_fd: int
    """The copy, open for reading, opened before any mode is applied."""
    size: int
    expected: str | None = None
    verified: int = 0
    """Bytes read back and hashed, in order."""
    hasher: Any = field(default_factory=xxhash.xxh3_128)
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


_SYNC_FILE_RANGE_ALL = 1 | 2 | 4
"""SYNC_FILE_RANGE_WAIT_BEFORE | WRITE | WAIT_AFTER: the range is written out, and on the device, when the call
returns."""
_SYNC_FILE_RANGE_WRITE = 2
"""Start writing the range out, without waiting."""


def libc_function(name: str) -> Any:
    """The C library's function ``name`` (errno kept for ``ctypes.get_errno``), or None where it has none."""
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name, None)
    except OSError:
        return None


_sync_file_range = libc_function("sync_file_range")
if _sync_file_range is not None:
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]


def write_out(fd: int, offset: int, n: int, wait: bool) -> None:
    """Have the kernel write ``n`` bytes of ``fd`` at ``offset`` out of the page cache: start it (``wait`` False), or
    return once they are on the device. Where ``sync_file_range`` is missing or refused, nothing is started and a wait
    is an fdatasync of the whole file."""
    if _sync_file_range is not None:
        if _sync_file_range(fd, offset, n, _SYNC_FILE_RANGE_ALL if wait else _SYNC_FILE_RANGE_WRITE) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ESPIPE):
            raise OSError(code, os.strerror(code))
    if wait:
        os.fdatasync(fd)


class Pipeline:
    """Two threads behind the reader (the copy's own thread, which reads, hashes and writes each chunk through the
    page cache, as ``cp`` does, and asks the kernel to start writing it out): a verifier and a syncer.

    The verifier takes each range written, waits until it is on the device, drops it from the page cache
    (``POSIX_FADV_DONTNEED``: clean pages go), reads it back (so from the device) and hashes it; at a file's end it
    compares the hashes and hands the file to the syncer, which fsyncs it while the next is written. The reader is
    at most ``LAG`` ranges ahead of the read-back. The first failure in any thread is kept (``check()`` raises it)
    and they then only drain their queues, so nobody waits on them; ``shutdown()`` returns once none touches a
    descriptor."""

    def __init__(self) -> None:
        self.buf = mmap.mmap(-1, CHUNK, flags=mmap.MAP_PRIVATE)
        """The reader's buffer."""
        self._verify_q: queue.Queue[tuple[str, FileJob, int, int] | None] = queue.Queue(maxsize=LAG)
        self._sync_q: queue.Queue[FileJob | None] = queue.Queue()
        self.failure: BaseException | None = None
        self._aborted = False
        self._ended = False
        self._threads = [
            threading.Thread(target=self._verifier, name="sync-verifier", daemon=True),
            threading.Thread(target=self._syncer, name="sync-fsync", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _fail(self, err: BaseException) -> None:
        if self.failure is None:
            self.failure = err

    def _skipping(self) -> bool:
        return self.failure is not None or self._aborted

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _hand(self, item: tuple[str, FileJob, int, int], stop: Callable[[], bool]) -> None:
        while True:
            self.check()
            if stop():
                raise Abort("stopped", "stopped before the copy was complete")
            try:
                self._verify_q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def written(self, job: FileJob, offset: int, n: int, stop: Callable[[], bool]) -> None:
        """``n`` bytes at ``offset`` were written: start writing them out, and queue their read-back (waiting while
        ``LAG`` ranges wait for theirs)."""
        write_out(job.fd, offset, n, wait=False)
        self._hand(("range", job, offset, n), stop)

    def close_file(self, job: FileJob, stop: Callable[[], bool]) -> None:
        self._hand(("close", job, 0, 0), stop)

    def finish(self, stop: Callable[[], bool]) -> None:
        """Wait until every file handed over is read back, verified and fsynced."""
        self._end()
        for t in self._threads:
            while t.is_alive():
                t.join(0.1)
                if stop() and not self._aborted:
                    self._aborted = True
                    self._fail(Abort("stopped", "stopped before the copy was complete"))
        self.check()

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            while True:  # the verifier drains its queue whatever happens, so there is room soon
                try:
                    self._verify_q.put(None, timeout=0.1)
                    return
                except queue.Full:
                    continue

    def shutdown(self) -> None:
        """Stop the threads, skipping what is left, and wait until they have (a thread stuck in the kernel on a
        hung destination holds this, in the helper process that the worker kills)."""
        self._aborted = True
        self._end()
        for t in self._threads:
            t.join()

    def _verifier(self) -> None:
        # Its buffer is never closed: a failure kept with its traceback may hold a slice of it; it goes with them.
        view = memoryview(mmap.mmap(-1, READ_BACK, flags=mmap.MAP_PRIVATE))
        while True:
            item = self._verify_q.get()
            if item is None:
                self._sync_q.put(None)
                return
            what, job, offset, n = item
            try:
                if self._skipping():
                    if what == "close":
                        job.done.set()
                elif what == "range":
                    self._read_back(job, view, offset, n)
                else:
                    self._compare(job)
                    self._sync_q.put(job)
            except BaseException as err:
                self._fail(err)
                if what == "close":
                    job.done.set()

    @staticmethod
    def _read_back(job: FileJob, view: memoryview, offset: int, n: int) -> None:
        write_out(job.fd, offset, n, wait=True)
        os.posix_fadvise(job.fd, offset, n, os.POSIX_FADV_DONTNEED)  # written out, so clean: dropped
        got = 0
        while got < n:
            want = min(n - got, len(view))
            more = os.preadv(job.verify_fd, [view[:want]], offset + got)
            if more == 0:
                raise Abort(
                    "failed", f"{job.entry.path}: reading the copy back gave {offset + got} of {job.size} bytes"
                )
            job.hasher.update(view[:more])
            os.posix_fadvise(job.fd, offset + got, more, os.POSIX_FADV_DONTNEED)  # what the read brought in goes too
            got += more
        job.verified += n

    @staticmethod
    def _compare(job: FileJob) -> None:
        got = job.hasher.hexdigest()
        length = os.fstat(job.fd).st_size
        if job.verified != job.size or length != job.size:
            job.error = f"{job.entry.path}: the copy holds {length} bytes, not the {job.size} written"
        elif got != job.expected:
            job.error = (
                f"{job.entry.path}: read back past the page cache, the copy's {HASH_NAME} {got} differs from the "
                f"source's {job.expected}"
            )
        else:
            job.entry.digest = got
        if job.error is not None:
            raise Abort("failed", job.error)

    def _syncer(self) -> None:
        while True:
            job = self._sync_q.get()
            if job is None:
                return
            try:
                if not self._skipping():
                    os.fsync(job.fd)
            except BaseException as err:
                self._fail(err)
            finally:
                job.done.set()


def read_full(fd: int, view: memoryview) -> int:
    """Fill ``view`` from ``fd``, less only at the end of the file (a read may return less than asked): whole chunks
    are written out and read back as one range each."""
    n = 0
    while n < len(view):
        got = os.readv(fd, [view[n:]])
        if got == 0:
            break
        n += got
    return n
