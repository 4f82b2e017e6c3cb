"""The checkpoint source: finds checkpoints under the watched roots, checks each, and follows every run over time.

Each scan is bounded (entries, depth, seconds; see checkpoints/scan.py). A candidate is checked cheaply when it is
new or changed; one complete checkpoint per scan gets the deep check (every CRC, and torch.load where torch is
installed), newest first, so a node's checkpoints are all read in full eventually at a low, steady rate.
Write timings come from the training side's event log (storwatch.training.atomic_save) where there is one, else
from when this source first saw the checkpoint incomplete and then complete.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from storwatch.checkpoints.formats import CheckResult, check
from storwatch.checkpoints.scan import CheckpointCandidate, CheckpointScanner
from storwatch.paths import HostPaths
from storwatch.training import EVENT_LOG_NAME as EVENT_LOG

log = logging.getLogger(__name__)


_EVENT_LOG_TAIL = 64 * 1024
KUBELET_PODS = "/var/lib/kubelet/pods"


@dataclass(frozen=True)
class CheckpointState:
    path: str
    format: str | None
    verdict: str
    """complete, incomplete or corrupt."""
    reason: str
    size_bytes: int
    mtime: float
    """Newest modification time of anything in it: when it was last written."""
    deep_checked: bool
    first_seen: float
    """When this source first saw it (the injected clock)."""
    write_seconds: float | None
    """How long the write took: from the event log, or from first seen incomplete to first seen complete."""
    write_bytes_per_second: float | None


@dataclass(frozen=True)
class RunState:
    path: str
    """The directory the job writes its series into."""
    root: str
    checkpoints: tuple[CheckpointState, ...]
    """Oldest first."""

    @property
    def complete(self) -> tuple[CheckpointState, ...]:
        return tuple(c for c in self.checkpoints if c.verdict == "complete")

    @property
    def newest_complete(self) -> CheckpointState | None:
        done = self.complete
        return done[-1] if done else None

    @property
    def incomplete(self) -> int:
        return sum(1 for c in self.checkpoints if c.verdict == "incomplete")

    @property
    def corrupt(self) -> int:
        return sum(1 for c in self.checkpoints if c.verdict == "corrupt")

    @property
    def write_in_progress(self) -> bool:
        """The newest checkpoint is still incomplete (being written, or abandoned mid-write)."""
        return bool(self.checkpoints) and self.checkpoints[-1].verdict == "incomplete"

    @property
    def interval_seconds(self) -> float | None:
        """Time between the two newest complete checkpoints."""
        done = self.complete
        return done[-1].mtime - done[-2].mtime if len(done) >= 2 else None


@dataclass(frozen=True)
class CheckpointFacts:
    timestamp: float
    runs: tuple[RunState, ...]
    truncated: bool
    truncated_reason: str | None
    scan_seconds: float
    roots: tuple[str, ...]


@dataclass
class _Seen:
    footprint: tuple[int, float]
    result: CheckResult
    first_seen: float
    first_incomplete: float | None
    completed_seen: float | None = None
    deep: bool = False


def default_roots(paths: HostPaths, configured: Sequence[str], kubelet: bool) -> list[str]:
    """Configured roots (host paths), plus the kubelet's pod volumes when this is a Kubernetes node."""
    roots = [paths.root(r) for r in configured]
    pods = paths.root(KUBELET_PODS)
    if kubelet and os.path.isdir(pods) and pods not in roots:
        roots.append(pods)
    return roots


class CheckpointSource:
    name = "checkpoints"

    def __init__(
        self,
        roots: Sequence[str],
        interval_seconds: float = 30.0,
        settle_seconds: float = 60.0,
        deep_per_scan: int = 1,
        deep_max_bytes: int = 1 << 30,
        clock: Callable[[], float] = time.time,
        scanner: CheckpointScanner | None = None,
        max_entries: int = 200_000,
        max_depth: int = 12,
        max_seconds: float = 10.0,
        stuck_paths: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        self.roots = tuple(roots)
        self.stuck_paths = stuck_paths
        self.interval_seconds = interval_seconds
        self.settle_seconds = settle_seconds
        self.deep_per_scan = deep_per_scan
        self.deep_max_bytes = deep_max_bytes
        self.clock = clock
        self.scanner = scanner or CheckpointScanner(
            list(roots),
            max_entries=max_entries,
            max_depth=max_depth,
            max_seconds=max_seconds,
            wall_clock=clock,
            settle_seconds=settle_seconds,
        )
        self._seen: dict[str, _Seen] = {}
        self._events: dict[str, tuple[float, dict[str, dict[str, float]]]] = {}

    def configure(self, settings: object) -> None:
        self.interval_seconds = float(getattr(settings, "interval_seconds", self.interval_seconds))

    def _check(self, cand: CheckpointCandidate, now: float) -> _Seen:
        footprint = (cand.size_bytes, cand.newest_mtime)
        seen = self._seen.get(cand.path)
        if seen is not None and seen.footprint == footprint and seen.result.verdict != "incomplete":
            return seen  # unchanged and settled: the earlier verdict stands
        result = check(cand.path, deep=False, now=now, settle_seconds=self.settle_seconds)
        if seen is None:
            incomplete = now if result.verdict == "incomplete" else None
            seen = _Seen(footprint, result, now, incomplete)
        else:
            seen.footprint, seen.result, seen.deep = footprint, result, False
        if result.verdict == "complete" and seen.completed_seen is None:
            seen.completed_seen = now
        self._seen[cand.path] = seen
        return seen

    def _event_log(self, run: str) -> dict[str, dict[str, float]]:
        """The last write record of each checkpoint path in the run's event log (read again when it changes)."""
        path = os.path.join(run, EVENT_LOG)
        try:
            st = os.lstat(path)
        except OSError:
            return {}
        cached = self._events.get(run)
        if cached is not None and cached[0] == st.st_mtime:
            return cached[1]
        records: dict[str, dict[str, float]] = {}
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                size = os.fstat(fd).st_size
                os.lseek(fd, max(0, size - _EVENT_LOG_TAIL), os.SEEK_SET)
                data = os.read(fd, _EVENT_LOG_TAIL)
            finally:
                os.close(fd)
        except OSError:
            return {}
        for line in data.splitlines()[1 if size > _EVENT_LOG_TAIL else 0 :]:
            try:
                rec = json.loads(line)
                target = os.path.join(run, os.path.basename(str(rec["path"])))
                records[target] = {"start": float(rec["start"]), "end": float(rec["end"]), "bytes": float(rec["bytes"])}
            except (ValueError, KeyError, TypeError):
                continue  # a torn or foreign line: the others still count
        self._events[run] = (st.st_mtime, records)
        return records

    def _state(self, cand: CheckpointCandidate, seen: _Seen, events: dict[str, dict[str, float]]) -> CheckpointState:
        r = seen.result
        write_seconds: float | None = None
        rate: float | None = None
        rec = events.get(cand.path)
        if rec is not None and rec["end"] >= rec["start"]:
            write_seconds = rec["end"] - rec["start"]
            rate = rec["bytes"] / write_seconds if write_seconds > 0 else None
        elif seen.first_incomplete is not None and seen.completed_seen is not None:
            write_seconds = seen.completed_seen - seen.first_incomplete
            rate = r.size_bytes / write_seconds if write_seconds > 0 else None
        return CheckpointState(
            cand.path,
            r.format,
            r.verdict,
            r.reason,
            r.size_bytes,
            r.mtime,
            seen.deep,
            seen.first_seen,
            write_seconds,
            rate,
        )

    def _deep_checks(self, now: float) -> None:
        todo = sorted(
            # A deep check reads every byte: larger checkpoints are checked in full only on demand (storwatch verify).
            (
                s
                for s in self._seen.values()
                if s.result.verdict == "complete" and not s.deep and s.result.size_bytes <= self.deep_max_bytes
            ),
            key=lambda s: s.result.mtime,
            reverse=True,
        )
        for seen in todo[: self.deep_per_scan]:
            deep = check(seen.result.path, deep=True, now=now, settle_seconds=self.settle_seconds)
            if deep.verdict != "complete":
                log.warning("checkpoint %s failed its deep check: %s", deep.path, deep.reason)
            seen.result, seen.deep = deep, True

    def collect(self) -> CheckpointFacts:
        if not self.roots:
            return CheckpointFacts(self.clock(), (), False, None, 0.0, ())
        if self.stuck_paths is not None:
            self.scanner.skip = frozenset(self.stuck_paths())
        result = self.scanner.scan()
        now = self.clock()
        for cand in result.candidates:
            self._check(cand, now)
        if self.deep_per_scan > 0:
            self._deep_checks(now)
        present = {c.path for c in result.candidates}
        if not result.truncated:
            self._seen = {p: s for p, s in self._seen.items() if p in present}
        runs = []
        for run in result.runs:
            events = self._event_log(run.path)
            states = tuple(self._state(c, self._seen[c.path], events) for c in run.candidates)
            runs.append(RunState(run.path, run.root, states))
        return CheckpointFacts(
            now, tuple(runs), result.truncated, result.truncated_reason, result.stats.seconds, self.roots
        )

    def close(self) -> None:
        pass
