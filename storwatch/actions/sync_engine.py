"""The sync action's side of the copy engine (``storwatch.sync``): the ``sync`` section's allowlisted roots as the
action's Resolver, the copy worker that the action's jobs run on, and the worker's ``status()`` read into the jobs'
states. A reload applies the section (:meth:`SyncEngine.configure`): roots, template, deadline, keep and bandwidth
hold for the copies asked for from then on.

``sync.destinations`` are host paths, like ``checkpoints.roots``: the agent reaches each below ``paths.rootfs`` (the
DaemonSet's ``/host/root``), where the durable root must be mounted read-write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from storwatch.actions.sync_jobs import JobState, Observed, SyncJobs
from storwatch.config import SyncConfig
from storwatch.paths import HostPaths
from storwatch.sync import Destinations, SyncJob, SyncRefused, SyncResult, SyncWorker

_STATES: Mapping[str, JobState] = {
    "queued": "queued",
    "running": "copying",
    "done": "done",
    "failed": "failed",
    "abandoned": "failed",
}


@dataclass(frozen=True)
class _Settings:
    section: SyncConfig
    destinations: Destinations
    """The roots as this process reaches them."""
    reached: Mapping[str, str]
    """Each configured root (as written, and as Destinations normalises it) to the root this process reaches."""


def _settings(section: SyncConfig, paths: HostPaths) -> _Settings:
    reached: dict[str, str] = {}
    for root in section.destinations:
        normal = Destinations([root]).roots[0]
        reached[root] = reached[normal] = Destinations([paths.root(normal)]).roots[0]
    return _Settings(section, Destinations(dict.fromkeys(reached.values())), reached)


class EngineResolver:
    """``sync.destinations`` for the action: ``resolve`` fills the template below a root with ``Destinations``,
    whose refusal (a field holding ``/``, ``..``, a control character) becomes the ValueError the action reports."""

    def __init__(self, section: SyncConfig, paths: HostPaths) -> None:
        self.paths = paths
        self.settings = _settings(section, paths)

    def configure(self, section: SyncConfig) -> None:
        self.settings = _settings(section, self.paths)  # one reference swapped: a reader sees old or new, whole

    @property
    def roots(self) -> tuple[str, ...]:
        return self.settings.section.destinations

    @property
    def template(self) -> str:
        return self.settings.section.template

    @property
    def deadline_seconds(self) -> float:
        return self.settings.section.deadline_seconds

    def resolve(self, root: str | None, template: str, fields: Mapping[str, str]) -> str:
        settings = self.settings
        if root is not None and root not in settings.reached:
            raise ValueError(f"{root!r} is not one of sync.destinations")
        try:
            return settings.destinations.resolve(
                template, fields, root=settings.reached[root] if root is not None else None
            )
        except SyncRefused as err:
            raise ValueError(str(err)) from None


class EngineWorker:
    """A ``SyncWorker`` given the section in force at each submit (its allowlist, keep-N and bandwidth)."""

    def __init__(self, resolver: EngineResolver, command: Sequence[str] | None = None) -> None:
        self.resolver = resolver
        section = resolver.settings.section
        self.worker = SyncWorker(
            resolver.settings.destinations,
            deadline_seconds=section.deadline_seconds,
            bandwidth=float(section.bandwidth_bytes_per_second) or None,
            keep=section.keep,
            command=command,
        )
        self._lock = threading.Lock()

    def submit(
        self,
        src: str,
        dest: str,
        *,
        source_root: str | None,
        deadline_seconds: float,
        run_dir: str | None = None,
        access_root: str | None = None,
    ) -> int:
        settings = self.resolver.settings
        with self._lock:
            # The allowlist a DEST is checked against in submit: a reload's new roots hold from the next copy on.
            self.worker.destinations = settings.destinations
            return self.worker.submit(
                src,
                dest,
                deadline_seconds=deadline_seconds,
                keep=settings.section.keep,
                bandwidth=float(settings.section.bandwidth_bytes_per_second) or None,
                source_root=source_root,
                run=run_dir,
                access_root=access_root,
            )

    def status(self) -> list[SyncJob]:
        return self.worker.status()

    def cancel(self, job_id: int, why: str) -> None:
        self.worker.cancel(job_id, why)

    def close(self) -> None:
        self.worker.close()


def describe(result: SyncResult) -> str:
    """The worker's word on a finished copy, for /status."""
    if result.outcome == "verified":
        text = (
            f"verified: {result.files} files, {result.bytes} bytes read back identical ({result.hash}); "
            f"manifest {result.manifest}"
        )
    elif result.outcome == "unchanged":
        text = "unchanged: the copy there is already a verified copy of the checkpoint as it is"
    else:
        text = f"{result.outcome}: {result.error or 'no reason given'}"
    return text + "".join(f"; {note}" for note in result.notes)


def observed(status: object) -> dict[int, Observed]:
    """``SyncWorker.status()`` as the jobs' states by id. Bytes: those read so far while copying; once done, those
    this copy wrote (none when the copy there was already verified)."""
    out: dict[int, Observed] = {}
    for job in status if isinstance(status, list) else ():
        if not isinstance(job, SyncJob) or job.state not in _STATES:
            continue
        result = job.result
        done = job.state == "done" and result is not None
        out[job.job_id] = Observed(
            state=_STATES[job.state],
            started_at=job.started or None,
            finished_at=job.finished or None,
            bytes=result.written_bytes if done and result is not None else job.bytes_done,
            detail=describe(result) if result is not None else "",
        )
    return out


class SyncEngine:
    """The resolver and the jobs the ``sync`` action is made with, from the ``sync`` section."""

    def __init__(
        self,
        section: SyncConfig,
        paths: HostPaths,
        clock: Callable[[], float],
        command: Sequence[str] | None = None,
        copied: Callable[[object], object] = lambda job: None,
    ) -> None:
        """``command``: how a copy's helper process starts (tests; default ``storwatch.sync.helper_command()``);
        ``copied``: told of each copy that ended verified."""
        self.resolver = EngineResolver(section, paths)
        self.jobs = SyncJobs(lambda: EngineWorker(self.resolver, command), observed, clock, copied)

    def configure(self, section: SyncConfig) -> None:
        self.resolver.configure(section)

    def close(self) -> None:
        self.jobs.close()
