"""GPU process attribution: which container and pod each GPU process belongs to, from <procfs>/<pid>/cgroup.

Pod names and namespaces come from the Kubernetes enrichment; this step yields only runtime IDs, so it works on any
node (Slurm and plain Docker included) and never imports Kubernetes code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from storwatch.paths import HostPaths
from storwatch.procfs.cgroup import ContainerRef, container_of, parse_cgroup
from storwatch.sources import FactsKey, OnceLog

log = logging.getLogger(__name__)

CONTAINERS: FactsKey[dict[int, ContainerRef | None]] = FactsKey("containers")
"""The process source's facts in a Snapshot: each GPU process's container and pod, where it runs in one."""


class ProcessSource:
    name = "processes"

    def __init__(self, paths: HostPaths, pids: Callable[[], Iterable[int]], interval_seconds: float = 1.0) -> None:
        self.paths = paths
        self.pids = pids
        self.interval_seconds = interval_seconds
        self._known: dict[int, ContainerRef | None] = {}
        self._bad_lines = OnceLog(log)
        self.parse_errors = 0
        """Lines of <pid>/cgroup files that could not be parsed (each file is read once per process)."""

    def configure(self, settings: object) -> None:
        self.interval_seconds = float(getattr(settings, "interval_seconds", self.interval_seconds))

    def container(self, pid: int) -> ContainerRef | None:
        path = self.paths.proc(str(pid), "cgroup")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None  # exited, or not visible from here (no hostPID and no host /proc)
        entries, errors = parse_cgroup(data)
        self.parse_errors += len(errors)
        for err in errors:
            self._bad_lines.warning(err.line, "%s: skipping malformed %s", path, err)
        return container_of(entries)

    def collect(self) -> dict[int, ContainerRef | None]:
        """Each current GPU process's container. A PID's cgroup does not change, so each is read once."""
        current = set(self.pids())
        known = {pid: ref for pid, ref in self._known.items() if pid in current}
        for pid in current - known.keys():
            known[pid] = self.container(pid)
        self._known = known
        return dict(known)

    def close(self) -> None:
        pass
