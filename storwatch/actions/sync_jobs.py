"""The sync copies the ``sync`` action started: what made each (rule, run, why), where it copies from and to, and what
became of it, read from the copy worker (``storwatch.sync.SyncWorker``: the copies run in its child process, each
with a deadline); and the figures of ``storwatch_sync_*``. A copy already queued, running or done for the same
checkpoint (path and modification time) is not started again, and one of a newer checkpoint of the same run stops
those of older ones still queued or running. Each job has a deadline by this module's clock (its
pod's time left, say): the worker holds a copy to it from the copy's start, and a job still queued or running past it
is cancelled here, at the next look (every action run, scrape and /status). Bounded: the last HISTORY jobs are kept,
and the last success of at most MAX_RUNS runs.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from storwatch.analysis.checkpoints import MAX_RUNS
from storwatch.exporter.area import SYNC_COPY_RESULTS, SyncMetrics

JobState = Literal["queued", "copying", "done", "failed"]
HISTORY = 100
"""Jobs kept for /status (the oldest finished ones forgotten first)."""
DURATION_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
"""storwatch_sync_duration_seconds's buckets: a grace period (30 s) to a copy of hundreds of GB to a network volume."""


class Worker(Protocol):
    """What this needs of ``storwatch.sync.SyncWorker``."""

    def submit(
        self,
        src: str,
        dest: str,
        *,
        source_root: str | None,
        deadline_seconds: float,
        run_dir: str | None = None,
        access_root: str | None = None,
    ) -> int: ...

    def status(self) -> object: ...

    def cancel(self, job_id: int, why: str) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class SyncJob:
    """One copy the action asked for, and what became of it."""

    job_id: int
    rule: str
    run: str
    """The run's label (its path below its scan root)."""
    why: str
    """What made it: the rule's message for the run (printable text)."""
    source: str
    destination: str
    checkpoint_mtime: float
    queued_at: float
    deadline_at: float | None = None
    """When the copy must have ended (this module's clock): past it, a job not finished is cancelled."""
    state: JobState = "queued"
    started_at: float | None = None
    finished_at: float | None = None
    bytes: int = 0
    """Bytes copied, verified, once done."""
    detail: str = ""
    """The worker's word on it: the verified copy, or why it failed (the deadline, a refusal, a changed source)."""

    @property
    def seconds(self) -> float | None:
        if self.finished_at is None:
            return None
        return max(0.0, self.finished_at - (self.started_at if self.started_at is not None else self.queued_at))


@dataclass(frozen=True)
class Observed:
    """A job as the worker reports it."""

    state: JobState
    started_at: float | None = None
    finished_at: float | None = None
    bytes: int = 0
    detail: str = ""


Reader = Callable[[object], Mapping[int, Observed]]
"""Reads the worker's ``status()`` into Observed jobs by id."""


class SyncJobs:
    """The copies started by the ``sync`` action, over one copy worker (made on first use)."""

    def __init__(
        self,
        make_worker: Callable[[], Worker],
        read: Reader,
        clock: Callable[[], float],
        copied: Callable[[SyncJob], object] = lambda job: None,
    ) -> None:
        """``copied``: told of each copy that ended verified (the agent has the durable copies looked at again, so
        the run it protects is seen safe without waiting for the next walk)."""
        self._make_worker = make_worker
        self._copied = copied
        self._read = read
        self.clock = clock
        self._worker: Worker | None = None
        self._lock = threading.Lock()
        self._jobs: collections.OrderedDict[int, SyncJob] = collections.OrderedDict()
        self._by_checkpoint: dict[tuple[str, float], int] = {}
        self._bytes_total = 0
        self._last_success: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._durations: list[int] = [0] * (len(DURATION_BUCKETS) + 1)
        self._duration_sum = 0.0
        self._stopped: dict[int, str] = {}
        """Why this module stopped a job (its deadline, a newer checkpoint), until the worker says it ended: the
        worker's word on a stopped copy says only that it stopped."""
        self._superseded: set[int] = set()
        """Which of those were stopped for a newer checkpoint of their run (an end that is no failure), until they
        end."""
        self._ended = dict.fromkeys(SYNC_COPY_RESULTS, 0)

    @property
    def worker(self) -> Worker:
        if self._worker is None:
            self._worker = self._make_worker()
        return self._worker

    def existing(self, source: str, mtime: float) -> SyncJob | None:
        """The job for this checkpoint that is queued, copying or done (a failed one is tried again)."""
        self.refresh()
        with self._lock:
            job_id = self._by_checkpoint.get((source, mtime))
            job = self._jobs.get(job_id) if job_id is not None else None
        return job if job is not None and job.state != "failed" else None

    def submit(
        self,
        rule: str,
        run: str,
        why: str,
        source: str,
        destination: str,
        mtime: float,
        deadline_seconds: float,
        source_root: str | None = None,
        run_dir: str | None = None,
        access_root: str | None = None,
    ) -> SyncJob:
        """Queue the copy. ``source_root``: a trusted directory above ``source`` (the run's scan root): the copy
        opens every directory from it down without following a symbolic link. ``run_dir``: the run's directory, which
        the copy's manifest records (a destination holding another run's copy is refused). ``access_root``: where the
        source's path starts for who may read the copy (``storwatch.sync.access``)."""
        now = self.clock()
        # A newer checkpoint of the run supersedes an older one still waiting or copying: the worker copies one at a
        # time, and the pod's time is better spent on the newest (the one a drain asked for).
        with self._lock:
            older = [
                j
                for j in self._jobs.values()
                if j.run == run and j.state in ("queued", "copying") and j.checkpoint_mtime < mtime
            ]
        for job in older:
            self._stop(self.worker, job.job_id, f"superseded by the run's newer checkpoint {source}", superseded=True)
        job_id = self.worker.submit(
            source,
            destination,
            source_root=source_root,
            deadline_seconds=deadline_seconds,
            run_dir=run_dir,
            access_root=access_root,
        )
        job = SyncJob(job_id, rule, run, why, source, destination, mtime, now, now + deadline_seconds)
        with self._lock:
            self._jobs[job_id] = job
            self._by_checkpoint[(source, mtime)] = job_id
            self._trim()
        return job

    def _stop(self, worker: Worker, job_id: int, why: str, superseded: bool = False) -> None:
        with self._lock:
            if job_id not in self._stopped and superseded:
                self._superseded.add(job_id)
            self._stopped.setdefault(job_id, why)
        worker.cancel(job_id, why)

    def limit(self, job_id: int, deadline_at: float) -> None:
        """Bring a job's deadline forward to ``deadline_at`` (never later than it was)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and (job.deadline_at is None or deadline_at < job.deadline_at):
                self._jobs[job_id] = replace(job, deadline_at=deadline_at)

    def refresh(self) -> None:
        """Take the worker's word on every job not yet finished; count the ones that finished since. A job past its
        deadline is cancelled first (the worker stops its copy, which removes its temporaries)."""
        with self._lock:
            if self._worker is None or all(j.state in ("done", "failed") for j in self._jobs.values()):
                return
            worker = self._worker
            at = self.clock()
            late = [
                j
                for j in self._jobs.values()
                if j.state not in ("done", "failed") and j.deadline_at is not None and at >= j.deadline_at
            ]
        for job in late:
            self._stop(worker, job.job_id, "past its deadline (sync.deadline_seconds, or its pod's time left)")
        observed = self._read(worker.status())
        done: list[SyncJob] = []
        with self._lock:
            for job_id, job in list(self._jobs.items()):
                seen = observed.get(job_id)
                if job.state in ("done", "failed") or seen is None:
                    continue
                now = replace(
                    job,
                    state=seen.state,
                    started_at=seen.started_at if seen.started_at is not None else job.started_at,
                    finished_at=seen.finished_at,
                    bytes=seen.bytes,
                    detail=seen.detail,
                )
                if now.state in ("done", "failed"):
                    why = self._stopped.pop(job_id, None)
                    superseded = job_id in self._superseded
                    self._superseded.discard(job_id)
                    if now.state == "failed" and why is not None:
                        now = replace(now, detail=f"{why}: {seen.detail}")
                    if now.finished_at is None:
                        now = replace(now, finished_at=self.clock())
                    if now.state == "failed":
                        self._ended["superseded" if superseded else "failed"] += 1
                self._jobs[job_id] = now
                if now.state == "done":
                    self._succeeded(now)
                    done.append(now)
        for job in done:
            self._copied(job)

    def _succeeded(self, job: SyncJob) -> None:
        self._ended["verified"] += 1
        self._bytes_total += job.bytes
        self._last_success.pop(job.run, None)
        self._last_success[job.run] = job.finished_at or self.clock()
        while len(self._last_success) > MAX_RUNS:
            self._last_success.popitem(last=False)
        seconds = job.seconds or 0.0
        self._duration_sum += seconds
        for i, bound in enumerate(DURATION_BUCKETS):
            if seconds <= bound:
                self._durations[i] += 1
                break
        else:
            self._durations[-1] += 1

    def _trim(self) -> None:
        while len(self._jobs) > HISTORY:
            old = next((i for i, j in self._jobs.items() if j.state in ("done", "failed")), None)
            if old is None:
                break  # every kept job is still going: the worker bounds those
            job = self._jobs.pop(old)
            if self._by_checkpoint.get((job.source, job.checkpoint_mtime)) == old:
                del self._by_checkpoint[(job.source, job.checkpoint_mtime)]

    def jobs(self) -> list[SyncJob]:
        """Every job kept, newest first."""
        self.refresh()
        with self._lock:
            return list(reversed(self._jobs.values()))

    def metrics(self) -> SyncMetrics:
        self.refresh()
        with self._lock:
            cumulative = []
            total = 0
            for bound, count in zip((*DURATION_BUCKETS, float("inf")), self._durations, strict=True):
                total += count
                cumulative.append((bound, total))
            return SyncMetrics(
                bytes_total=self._bytes_total,
                in_progress=sum(1 for j in self._jobs.values() if j.state in ("queued", "copying")),
                last_success=dict(self._last_success),
                duration_buckets=tuple(cumulative),
                duration_sum=self._duration_sum,
                copies=dict(self._ended),
            )

    def close(self) -> None:
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()
