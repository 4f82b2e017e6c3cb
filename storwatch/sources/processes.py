"""GPU process attribution: which container and pod, or which Slurm job, each GPU process belongs to, from
<procfs>/<pid>/cgroup.

Pod names and namespaces come from the Kubernetes enrichment; this step yields only runtime IDs and job IDs, so it
works on any node (Slurm and plain Docker included) and never imports Kubernetes code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from storwatch.paths import HostPaths
from storwatch.procfs.cgroup import ContainerRef, SlurmJob, container_of, parse_cgroup, slurm_job_of
from storwatch.sources import FactsKey, OnceLog

log = logging.getLogger(__name__)

_MAX_CGROUP_BYTES = 64 * 1024
"""A process's cgroup file is a line per hierarchy (about 1 KiB); more is not read."""


class ProcessFacts(dict[int, ContainerRef | None]):
    """Each GPU process's container and pod (None where it runs in none), and, in ``jobs``, the Slurm job of those
    that run in one."""

    jobs: dict[int, SlurmJob]

    def __init__(
        self, containers: dict[int, ContainerRef | None] | None = None, jobs: dict[int, SlurmJob] | None = None
    ):
        super().__init__(containers or {})
        self.jobs = jobs or {}


CONTAINERS: FactsKey[ProcessFacts] = FactsKey("containers")
"""The process source's facts in a Snapshot: each GPU process's container and pod, and its Slurm job."""


class ProcessSource:
    name = "processes"

    def __init__(self, paths: HostPaths, pids: Callable[[], Iterable[int]], interval_seconds: float = 1.0) -> None:
        self.paths = paths
        self.pids = pids
        self.interval_seconds = interval_seconds
        self._known: dict[int, tuple[ContainerRef | None, SlurmJob | None]] = {}
        self._bad_lines = OnceLog(log)
        self.parse_errors = 0
        """Lines of <pid>/cgroup files that could not be parsed (each file is read once per process)."""

    def configure(self, settings: object) -> None:
        self.interval_seconds = float(getattr(settings, "interval_seconds", self.interval_seconds))

    def owner(self, pid: int) -> tuple[ContainerRef | None, SlurmJob | None]:
        """The process's container and Slurm job, from one read of its cgroup file."""
        path = self.paths.proc(str(pid), "cgroup")
        try:
            with open(path, "rb") as f:
                data = f.read(_MAX_CGROUP_BYTES)
        except OSError:
            return None, None  # exited, or not visible from here (no hostPID and no host /proc)
        entries, errors = parse_cgroup(data)
        self.parse_errors += len(errors)
        for err in errors:
            self._bad_lines.warning(err.line, "%s: skipping malformed %s", path, err)
        return container_of(entries), slurm_job_of(entries)

    def container(self, pid: int) -> ContainerRef | None:
        return self.owner(pid)[0]

    def collect(self) -> ProcessFacts:
        """Each current GPU process's container and job. A PID's cgroup does not change, so each is read once."""
        current = set(self.pids())
        known = {pid: owner for pid, owner in self._known.items() if pid in current}
        for pid in current - known.keys():
            known[pid] = self.owner(pid)
        self._known = known
        jobs = {pid: job for pid, (_, job) in known.items() if job is not None}
        return ProcessFacts({pid: ref for pid, (ref, _) in known.items()}, jobs)

    def close(self) -> None:
        pass
