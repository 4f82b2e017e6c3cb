"""The helper that makes copies (:class:`SyncWorker`): ``submit(src, dest)`` returns a job id at once, checking DEST
against the allowlist by its text alone (no file is touched in the caller), and queues the job. Jobs run one at a
time by default, each in a child process of its own (``python -I``, running :func:`copy_verified`), which reports
its progress and its result as JSON lines on a pipe. ``status()`` is a snapshot of every job (queued, running, done,
failed, abandoned) with its bytes done and total; ``poll()`` hands each finished job's :class:`SyncResult` once;
``wait()`` waits for one. A job still running past its deadline is abandoned: its child is killed (SIGKILL) and never
waited for, so a child stuck in the kernel on a hung NFS or FUSE mount costs a process, never the caller's thread.
``cancel()`` asks a child to stop (it closes the child's standard input: the copy stops at its next chunk and removes
its temporaries) and kills it after a grace period. ``close()`` cancels everything and returns within ``grace +
0.5`` seconds whatever state the children are in. A child also stops when the caller dies (its standard input
closes)."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from storwatch.sync.copy import copy_verified
from storwatch.sync.destinations import Destinations
from storwatch.sync.result import JobState, SyncRefused, SyncResult, failed


@dataclass(frozen=True)
class SyncJob:
    """A job as :meth:`SyncWorker.status` sees it."""

    job_id: int
    source: str
    dest: str
    state: JobState
    """``done`` is a verified copy (made or already there), ``failed`` any other end the copy
    reported, ``abandoned`` a job whose helper was killed (past its deadline, cancelled, the worker closed)."""
    bytes_done: int = 0
    bytes_total: int = 0
    submitted: float = 0.0
    """Wall-clock times (seconds since the epoch); 0 until they happen."""
    started: float = 0.0
    finished: float = 0.0
    deadline_seconds: float = 0.0
    result: SyncResult | None = None


@dataclass
class _Job:
    job_id: int
    source: str
    dest: str
    root: str | None
    source_root: str | None
    run: str | None
    access_root: str | None
    deadline_seconds: float
    keep: int
    bandwidth: float | None
    submitted: float
    state: JobState = "queued"
    bytes_done: int = 0
    bytes_total: int = 0
    started: float = 0.0
    started_mono: float = 0.0
    finished: float = 0.0
    result: SyncResult | None = None
    proc: subprocess.Popen[bytes] | None = None
    cancel_at: float | None = None
    """When a job asked to stop is killed, if its helper has not ended by then (monotonic)."""
    cancel_why: str = ""


def helper_command() -> list[str]:
    """How a copy's helper process is started: isolated (``-I``), this tree first on ``sys.path``."""
    tree = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = f"import sys; sys.path.insert(0, {tree!r}); from storwatch.sync.worker import helper_main; helper_main()"
    return [sys.executable, "-I", "-c", code]


class SyncWorker:
    """Runs copies in helper processes, each with a deadline, so a destination that hangs never blocks the caller.

    ``destinations``: the allowlist every DEST is checked against (by its text, in ``submit``); None takes any DEST
    whose directory exists, opened as named (the command line without ``sync.destinations``: a person's own copy,
    as ``cp`` would make it). Thread-safe; nothing here ever touches a file but the pipes."""

    def __init__(
        self,
        destinations: Destinations | None,
        *,
        deadline_seconds: float = 3600.0,
        bandwidth: float | None = None,
        keep: int = 0,
        max_parallel: int = 1,
        max_jobs_kept: int = 64,
        cancel_grace_seconds: float = 2.0,
        command: Sequence[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.destinations = destinations
        self.deadline_seconds = deadline_seconds
        self.bandwidth = bandwidth
        self.keep = keep
        self.max_parallel = max(1, max_parallel)
        self.max_jobs_kept = max_jobs_kept
        self.cancel_grace_seconds = cancel_grace_seconds
        self._command = list(command) if command is not None else helper_command()
        self._clock = clock
        self._wall = wall
        self._lock = threading.Condition()
        self._ids = itertools.count(1)
        self._jobs: dict[int, _Job] = {}
        self._queue: list[int] = []
        self._results: list[SyncResult] = []
        self._closed = False
        self._thread = threading.Thread(target=self._schedule, name="sync-worker", daemon=True)
        self._thread.start()

    # -- the caller's side

    def submit(
        self,
        src: str,
        dest: str,
        *,
        deadline_seconds: float | None = None,
        keep: int | None = None,
        bandwidth: float | None = None,
        source_root: str | None = None,
        run: str | None = None,
        access_root: str | None = None,
    ) -> int:
        """Queue a copy of ``src`` to ``dest`` (its final path); the job's id. Never blocks, never touches a file:
        a DEST outside the allowlist, or a worker closed, makes a job that has already failed (``refused`` or
        ``abandoned``)."""
        root: str | None = None
        refused: str | None = None
        if self.destinations is not None:
            # Judged by its text as given: a '..' or '.' in it is refused, never normalised away.
            dest = dest.rstrip("/") if len(dest) > 1 else dest
            try:
                root = self.destinations.check(dest)
            except SyncRefused as err:
                refused = str(err)
        src, dest = os.path.abspath(src), os.path.abspath(dest)
        with self._lock:
            job = _Job(
                job_id=next(self._ids),
                source=src,
                dest=dest,
                root=root,
                source_root=source_root,
                run=run,
                access_root=access_root,
                deadline_seconds=self.deadline_seconds if deadline_seconds is None else deadline_seconds,
                keep=self.keep if keep is None else keep,
                bandwidth=self.bandwidth if bandwidth is None else bandwidth,
                submitted=self._wall(),
            )
            self._jobs[job.job_id] = job
            if refused is not None:
                self._finish(job, "failed", failed(src, dest, "refused", refused))
            elif self._closed:
                self._finish(job, "abandoned", failed(src, dest, "abandoned", "the sync worker is closed"))
            else:
                self._queue.append(job.job_id)
            self._forget()
            self._lock.notify_all()
            return job.job_id

    def status(self) -> list[SyncJob]:
        """Every job still remembered (queued and running ones, and the newest finished), oldest first."""
        with self._lock:
            return [self._snapshot(j) for j in sorted(self._jobs.values(), key=lambda j: j.job_id)]

    def job(self, job_id: int) -> SyncJob | None:
        with self._lock:
            j = self._jobs.get(job_id)
            return None if j is None else self._snapshot(j)

    def poll(self) -> list[SyncResult]:
        """The results of the jobs finished since the last poll, each once, in the order they finished."""
        with self._lock:
            out, self._results = self._results, []
            return out

    def wait(self, job_id: int, timeout: float | None = None) -> SyncJob | None:
        """The job once finished, or as it is when ``timeout`` seconds passed (None: until it finishes)."""
        end = None if timeout is None else self._clock() + timeout
        with self._lock:
            while True:
                j = self._jobs.get(job_id)
                if j is None:
                    return None
                if j.state not in ("queued", "running"):
                    return self._snapshot(j)
                left = None if end is None else end - self._clock()
                if left is not None and left <= 0:
                    return self._snapshot(j)
                self._lock.wait(0.25 if left is None else min(left, 0.25))

    def cancel(self, job_id: int, why: str = "cancelled") -> None:
        """Drop a queued job; ask a running one to stop (its copy removes its temporaries), and kill its helper if
        it has not ended within ``cancel_grace_seconds``."""
        with self._lock:
            j = self._jobs.get(job_id)
            if j is None:
                return
            if j.state == "queued":
                self._queue.remove(job_id)
                self._finish(j, "abandoned", failed(j.source, j.dest, "stopped", f"{why} before it started"))
            elif j.state == "running" and j.cancel_at is None:
                j.cancel_at = self._clock() + self.cancel_grace_seconds
                j.cancel_why = why
                if j.proc is not None and j.proc.stdin is not None:
                    with contextlib.suppress(OSError):
                        j.proc.stdin.close()
            self._lock.notify_all()

    def close(self, grace: float = 0.0) -> None:
        """Stop: queued jobs abandoned, running ones asked to stop, and killed if still running after ``grace``
        seconds. Returns within ``grace`` + about half a second, whatever the helpers are stuck in: a helper that
        does not die at once (stuck in the kernel) is left to a reaper thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for job_id in list(self._queue):
                j = self._jobs[job_id]
                self._finish(j, "abandoned", failed(j.source, j.dest, "abandoned", "the sync worker closed"))
            self._queue.clear()
            running = [j for j in self._jobs.values() if j.state == "running"]
            for j in running:
                if j.proc is not None and j.proc.stdin is not None:
                    with contextlib.suppress(OSError):
                        j.proc.stdin.close()
            self._lock.notify_all()
        end = self._clock() + grace
        with self._lock:
            while any(j.state == "running" for j in running) and self._clock() < end:
                self._lock.wait(min(0.05, max(0.0, end - self._clock())))
            for j in running:
                if j.state == "running":
                    self._kill(j, "abandoned", "the sync worker closed while the copy ran: its helper was killed")
            self._lock.notify_all()
        self._thread.join(0.2)

    # -- the scheduler

    def _snapshot(self, j: _Job) -> SyncJob:
        return SyncJob(
            job_id=j.job_id,
            source=j.source,
            dest=j.dest,
            state=j.state,
            bytes_done=j.bytes_done,
            bytes_total=j.bytes_total,
            submitted=j.submitted,
            started=j.started,
            finished=j.finished,
            deadline_seconds=j.deadline_seconds,
            result=j.result,
        )

    def _finish(self, j: _Job, state: JobState, result: SyncResult) -> None:
        j.state = state
        j.finished = self._wall()
        j.result = dataclasses.replace(result, job_id=j.job_id)
        self._results.append(j.result)
        if len(self._results) > 4 * self.max_jobs_kept:  # a caller that never polls keeps only the newest
            del self._results[: len(self._results) - 4 * self.max_jobs_kept]
        self._lock.notify_all()

    def _forget(self) -> None:
        done = [j for j in self._jobs.values() if j.state not in ("queued", "running")]
        for j in sorted(done, key=lambda j: j.job_id)[: max(0, len(done) - self.max_jobs_kept)]:
            del self._jobs[j.job_id]

    def _schedule(self) -> None:
        with self._lock:
            while not self._closed:
                now = self._clock()
                running = [j for j in self._jobs.values() if j.state == "running"]
                for j in running:
                    if j.cancel_at is not None and now >= j.cancel_at:
                        self._kill(j, "abandoned", f"{j.cancel_why}: its helper did not stop in time and was killed")
                    elif now - j.started_mono > j.deadline_seconds:
                        self._kill(
                            j,
                            "abandoned",
                            f"past its deadline of {j.deadline_seconds:g} s (the destination may hang): its helper "
                            "was killed",
                        )
                while self._queue and sum(j.state == "running" for j in self._jobs.values()) < self.max_parallel:
                    self._start(self._jobs[self._queue.pop(0)])
                upcoming = [
                    min(j.started_mono + j.deadline_seconds, j.cancel_at or math.inf)
                    for j in self._jobs.values()
                    if j.state == "running"
                ]
                wake = min(upcoming, default=now + 1.0)
                self._lock.wait(max(0.01, min(1.0, wake - now)))

    def _start(self, j: _Job) -> None:
        request = {
            "source": j.source,
            "dest": j.dest,
            "root": j.root,
            "source_root": j.source_root,
            "run": j.run,
            "access_root": j.access_root,
            "bandwidth": j.bandwidth,
            "keep": j.keep,
        }
        j.state = "running"
        j.started = self._wall()
        j.started_mono = self._clock()
        try:
            proc = subprocess.Popen(
                self._command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,  # a terminal's Ctrl-C reaches the caller, which asks the helper to stop
            )
        except OSError as err:
            self._finish(j, "failed", failed(j.source, j.dest, "failed", f"cannot start the sync helper: {err}"))
            return
        j.proc = proc
        assert proc.stdin is not None
        try:
            # One short line: it fits the pipe's buffer, so this never blocks on a helper that does not read.
            proc.stdin.write((json.dumps(request, allow_nan=False) + "\n").encode())
            proc.stdin.flush()
        except OSError:
            pass  # the helper died at once: its reader says so
        threading.Thread(target=self._read, args=(j, proc), name=f"sync-job-{j.job_id}", daemon=True).start()

    def _read(self, j: _Job, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        result: SyncResult | None = None
        problem = ""
        for raw in proc.stdout:
            try:
                message = json.loads(raw)
                if "progress" in message:
                    done, total = message["progress"]
                    if isinstance(done, int) and isinstance(total, int):
                        with self._lock:
                            j.bytes_done, j.bytes_total = done, total
                elif "result" in message:
                    result = SyncResult.from_dict(message["result"])
            except (ValueError, TypeError, KeyError) as err:
                problem = f"the sync helper answered something unreadable: {err}"
        code = proc.wait()
        with self._lock:
            if j.state != "running":
                return
            if result is not None:
                self._finish(j, "done" if result.ok else "failed", result)
            else:
                why = problem or f"the sync helper ended ({_exit_text(code)}) without a result"
                self._finish(j, "failed", failed(j.source, j.dest, "failed", why))
            self._forget()
            self._lock.notify_all()

    def _kill(self, j: _Job, state: JobState, why: str) -> None:
        proc = j.proc
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()
            threading.Thread(target=proc.wait, name=f"sync-reap-{j.job_id}", daemon=True).start()
        seconds = self._clock() - j.started_mono if j.started_mono else 0.0
        self._finish(j, state, failed(j.source, j.dest, "abandoned", why, seconds, j.started))
        self._forget()


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def helper_main() -> None:
    """The helper: one request line in, progress and the result as JSON lines out. Its standard input closing (the
    caller cancelled, closed, or died) stops the copy at its next chunk."""
    line = sys.stdin.buffer.readline()
    stopped = threading.Event()

    def watch() -> None:
        with contextlib.suppress(OSError):
            while sys.stdin.buffer.read(4096):
                pass
        stopped.set()

    threading.Thread(target=watch, name="sync-stdin", daemon=True).start()
    out = sys.stdout.buffer
    last = [0.0]

    def emit(message: Mapping[str, Any]) -> None:
        with contextlib.suppress(OSError):
            out.write((json.dumps(message, allow_nan=False) + "\n").encode())
            out.flush()

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.2 or done >= total:
            last[0] = now
            emit({"progress": [done, total]})

    try:
        request = json.loads(line)
        result = copy_verified(
            request["source"],
            request["dest"],
            root=request.get("root"),
            source_root=request.get("source_root"),
            run=request.get("run"),
            access_root=request.get("access_root"),
            bandwidth=request.get("bandwidth"),
            keep=int(request.get("keep") or 0),
            progress=progress,
            stop=stopped.is_set,
        )
    except Exception as err:  # a bug must still come back as a result, not a silent exit
        result = failed("", "", "failed", f"{type(err).__name__}: {err}")
    emit({"result": result.to_dict()})
    os._exit(0)
