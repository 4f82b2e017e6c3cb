"""The checkpoint source: finds checkpoints under the watched roots, checks each, and follows every run over time.

Nothing here touches a checkpoint root: the walks, stats, checks and event-log reads run in a helper process
(``_checkpoint_worker.py``) through ``storwatch.blocking``, each with a deadline, one per unit. A unit is a scan root,
or a mount below one (read from this process's mount table), each walked on its own, so a pod volume on a FUSE mount
whose readdir or stat hangs makes that one unit stuck (``stuck_roots``, and the collector fails naming it) while the
others are still scanned, and the agent's threads never wait in the kernel. A collection waits for the walks no longer
than they bound themselves (``max_seconds``, plus a margin); a unit still out then keeps its last result, and is stuck
once past ``timeout_seconds``. A stuck unit's last result is kept.

Each walk is bounded (entries, depth, seconds per unit; see checkpoints/scan.py). A candidate is checked cheaply when
it is new or changed; one complete checkpoint per scan gets the deep check (every CRC, and torch.load where torch is
installed), newest first, so a node's checkpoints are all read in full eventually at a low, steady rate. A check that
raises makes only its own checkpoint ``corrupt`` (``unknown`` when it is no known format) and is counted by kind
(``check_errors``). Write timings come from the training side's event log (storwatch.training.atomic_save) where there
is one, else from when this source first saw the checkpoint incomplete and then complete. Temporaries of
``atomic_save`` whose writer is gone are reported per run (never removed: the next save does that).

Why one file (about 540 lines): the source's state per unit and per run, and the helper-process calls that fill
it, follow one checkpoint from found to checked to tracked; the stage records are in checkpoints/ and analysis/.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from storwatch._checkpoint_worker import CHECK_ERROR_REASONS
from storwatch._checkpoint_worker import command as worker_command
from storwatch.blocking import BlockingCalls, CallOutcome
from storwatch.checkpoints.events import REJECT_REASONS as EVENT_REJECT_REASONS
from storwatch.checkpoints.formats import CheckResult
from storwatch.checkpoints.limits import DeepLimits
from storwatch.checkpoints.scan import MAX_DATASET_DIRS, DatasetDir
from storwatch.config import CheckpointsConfig
from storwatch.paths import HostPaths
from storwatch.procfs.mountinfo import parse_mountinfo
from storwatch.sources import FactsKey, checkpoint_key
from storwatch.sources.kubevolumes import parse_kubelet_volume_path
from storwatch.sources.writers import GONE, WriterCheck
from storwatch.sources.writers import REJECT_REASONS as WRITER_REJECT_REASONS
from storwatch.training import EVENT_LOG_NAME as EVENT_LOG
from storwatch.training import temp_writer_pid

log = logging.getLogger(__name__)

__all__ = [
    "CHECK_ERROR_REASONS",
    "EVENT_LOG",
    "KUBELET_PODS",
    "CheckpointFacts",
    "CheckpointSource",
    "CheckpointState",
    "RunState",
    "StuckRoot",
    "default_roots",
]

KUBELET_PODS = "/var/lib/kubelet/pods"
ORPHAN_PATHS_PER_RUN = 20
"""Paths of orphaned temporaries named per run (all of them are counted)."""
WAIT_MARGIN_SECONDS = 2.0
"""A collection waits for the walks at most max_seconds (where they stop themselves) plus this, or timeout_seconds if
that is shorter: a unit still walking then keeps its last result, and is stuck only once past timeout_seconds."""
CLAIM_REJECT_REASONS = EVENT_REJECT_REASONS + WRITER_REJECT_REASONS
"""Why a tenant's claim was refused (storwatch_checkpoint_claims_rejected_total{reason}): an event line's numbers
(checkpoints/events.py), or a writer PID the kernel does not back (sources/writers.py)."""
MAX_JUDGED_CLAIMS = 4096
"""Refused PID claims remembered as counted (past it the memory starts again)."""
_DEEP = "deep\0"
"""Prefix of a deep check's key among the helper's calls (a unit's key is its path)."""


@dataclass(frozen=True)
class CheckpointState:
    path: str
    format: str | None
    verdict: str
    """complete, incomplete, corrupt, unsafe (a pickle in it names a global that runs code when loaded) or
    unknown."""
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
    write_start: float | None = None
    """When the write began, where the run's event log says (storwatch.training.atomic_save): with ``write_seconds``
    the exact span the writer was busy saving."""
    allocated_bytes: int = 0
    """The space it takes on disk (``st_blocks * 512``): what its next one will need, whatever size a sparse file
    claims."""
    writer_pid: int | None = None
    """The process that wrote it, as the event log names it, once the kernel backs the claim (it was seen with a file
    open for writing under the run: sources/writers.py); None otherwise. Only off Kubernetes, where PIDs are the
    host's."""


@dataclass(frozen=True)
class RunState:
    path: str
    """The directory the job writes its series into."""
    root: str
    checkpoints: tuple[CheckpointState, ...]
    """Oldest first."""
    orphaned_temps: int = 0
    """atomic_save temporaries in the run whose writer is gone (storwatch.training.orphaned_temp)."""
    orphaned_temp_bytes: int = 0
    orphaned_temp_paths: tuple[str, ...] = ()
    """The first ORPHAN_PATHS_PER_RUN of them."""
    writing_since: float | None = None
    """When this source first saw an atomic_save temporary of the run whose writer is still at it (a save in
    progress); None when there is none."""
    writing_pids: tuple[int, ...] = ()
    """The writers of those temporaries, as their names carry them, where the kernel backs the claim (the process
    has a file open for writing under the run)."""

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
    def unsafe(self) -> int:
        return sum(1 for c in self.checkpoints if c.verdict == "unsafe")

    @property
    def write_in_progress(self) -> bool:
        """A save is in progress: an atomic_save temporary whose writer is at it, or a newest checkpoint still
        incomplete (being written, or abandoned mid-write)."""
        return self.writing_since is not None or (
            bool(self.checkpoints) and self.checkpoints[-1].verdict == "incomplete"
        )

    @property
    def interval_seconds(self) -> float | None:
        """Time between the two newest complete checkpoints."""
        done = self.complete
        return done[-1].mtime - done[-2].mtime if len(done) >= 2 else None


@dataclass(frozen=True)
class StuckRoot:
    path: str
    """The scan root, or the mount below one, whose walk or check has not returned."""
    seconds: float
    """How long the call has been in flight (0 when its mount's statvfs is stuck and it was not tried)."""
    reason: str


@dataclass(frozen=True)
class Unreadable:
    """A unit whose walk was refused entries (EACCES, EPERM): a gap in what the agent sees."""

    path: str
    """The scan root, or the mount below one."""
    entries: int
    examples: tuple[str, ...]
    """The first few entries refused."""


@dataclass(frozen=True)
class CheckpointFacts:
    timestamp: float
    runs: tuple[RunState, ...]
    truncated: bool
    truncated_reason: str | None
    scan_seconds: float
    roots: tuple[str, ...]
    stuck_roots: tuple[StuckRoot, ...] = ()
    check_errors: dict[str, int] = field(default_factory=dict)
    """Checks that raised since the agent started, by kind (each of CHECK_ERROR_REASONS, zeros included)."""
    failure: str | None = None
    """Why this collection is a failure of the source: a stuck unit, or one whose scan could not run."""
    datasets: tuple[DatasetDir, ...] = ()
    """Directories of dataset shards of at least ``dataset_min_bytes`` under the roots, the largest first."""
    claims_rejected: dict[str, int] = field(default_factory=dict)
    """Tenants' claims refused since the agent started, by reason (each of CLAIM_REJECT_REASONS, zeros included)."""
    unreadable: tuple[Unreadable, ...] = ()
    """Units whose last walk could not read some entries; the collection is then a failure naming them."""


CHECKPOINTS: FactsKey[CheckpointFacts] = checkpoint_key.CHECKPOINTS
"""The checkpoint source's facts in a Snapshot."""


@dataclass
class _Seen:
    footprint: tuple[int, float]
    result: CheckResult
    first_seen: float
    first_incomplete: float | None
    completed_seen: float | None = None
    deep: bool = False


@dataclass(frozen=True)
class _UnitResult:
    """One unit's last answer from the helper."""

    resolved: str
    candidates: tuple[dict[str, Any], ...]
    truncated: bool
    truncated_reason: str | None
    truncated_detail: str | None
    seconds: float
    orphans: tuple[dict[str, Any], ...]
    datasets: tuple[DatasetDir, ...] = ()
    unreadable: int = 0
    """Entries the walk was refused (permission): what lies below them was not seen."""
    unreadable_paths: tuple[str, ...] = ()


def _datasets(rows: Iterable[Any]) -> Iterator[DatasetDir]:
    """The helper's dataset rows, each checked (it is our own helper, but its answer crossed a pipe)."""
    for row in rows:
        try:
            yield DatasetDir(str(row["path"]), int(row["files"]), int(row["bytes"]), float(row["newest_mtime"]))
        except (KeyError, TypeError, ValueError):
            continue


def default_roots(paths: HostPaths, configured: Sequence[str], kubelet: bool) -> list[str]:
    """Configured roots (host paths), plus the kubelet's pod volumes when this is a Kubernetes node."""
    roots = [paths.root(r) for r in configured]
    pods = paths.root(KUBELET_PODS)
    if kubelet and os.path.isdir(pods) and pods not in roots:
        roots.append(pods)
    return roots


class OwnMountpoints:
    """The mountpoints of this process's own mount table (where the paths it walks lead), parsed again only when the
    table changed. The kubelet's pod volumes are mounts below its root: each becomes a unit of its own."""

    def __init__(self, paths: HostPaths | None = None) -> None:
        self.path = (paths or HostPaths()).proc("self", "mountinfo")
        self._last: tuple[bytes, list[str]] = (b"", [])

    def __call__(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError:
            return []
        if data != self._last[0]:
            infos, _ = parse_mountinfo(data)
            self._last = (data, sorted({info.mountpoint for info in infos}))
        return self._last[1]


def _result(d: dict[str, Any]) -> CheckResult:
    return CheckResult(
        path=str(d["path"]),
        format=d.get("format"),
        verdict=str(d["verdict"]),
        reason=str(d["reason"]),
        size_bytes=int(d.get("size_bytes") or 0),
        mtime=float(d.get("mtime") or 0.0),
        deep=bool(d.get("deep")),
    )


class CheckpointSource:
    name = "checkpoints"

    def __init__(
        self,
        roots: Sequence[str],
        interval_seconds: float = 30.0,
        settle_seconds: float = 60.0,
        deep_per_scan: int = 1,
        dataset_min_bytes: int = 1 << 30,
        deep_max_bytes: int = 1 << 30,
        clock: Callable[[], float] = time.time,
        max_entries: int = 200_000,
        max_depth: int = 12,
        max_seconds: float = 10.0,
        stuck_paths: Callable[[], Iterable[str]] | None = None,
        timeout_seconds: float = 30.0,
        deep_timeout_seconds: float = 300.0,
        mountpoints: Callable[[], Iterable[str]] | None = None,
        calls: BlockingCalls | None = None,
        max_inflight: int = 8,
        limits: DeepLimits | None = None,
        resolve_roots: Callable[[CheckpointsConfig], Sequence[str]] | None = None,
        writers: WriterCheck | None = None,
    ) -> None:
        self.roots = tuple(os.path.normpath(r) for r in roots)
        self.resolve_roots = resolve_roots
        """The scan roots a (reloaded) section names, as this agent sees them."""
        self.writers = writers if writers is not None else WriterCheck()
        self._claims_rejected = dict.fromkeys(CLAIM_REJECT_REASONS, 0)
        self._claims_judged: set[tuple[int, str, str]] = set()
        """(PID, run, reason) of refused PID claims already counted."""
        self._backed_now: dict[tuple[int, str], bool] = {}
        """PID claims judged in this collection."""
        self.stuck_paths = stuck_paths
        self.mountpoints = mountpoints if mountpoints is not None else OwnMountpoints()
        self.interval_seconds = interval_seconds
        self.settle_seconds = settle_seconds
        self._writing_seen: dict[str, float] = {}
        """Temporaries of saves in progress, and when each was first seen."""
        self.deep_per_scan = deep_per_scan
        self.dataset_min_bytes = dataset_min_bytes
        self.deep_max_bytes = deep_max_bytes
        self.clock = clock
        self.max_entries = max_entries
        self.max_depth = max_depth
        self.max_seconds = max_seconds
        self.timeout_seconds = timeout_seconds
        self.deep_timeout_seconds = deep_timeout_seconds
        self.limits = limits
        """The bounds of every check (None: formats' defaults), sent to the helper with each request."""
        self.calls = calls if calls is not None else BlockingCalls(max_inflight, command=worker_command())
        self._round = 0
        self._seen: dict[str, _Seen] = {}
        self._units: dict[str, _UnitResult] = {}
        """Each unit's last answer: kept while a later walk is stuck or still within its deadline."""
        self._deep_pending: dict[str, tuple[str, str]] = {}
        """Deep checks sent and not answered yet: key -> (checkpoint path, unit)."""
        self._deep_stuck: set[str] = set()
        """Keys of deep checks past their deadline at the last round (they hold no place among deep_per_scan)."""
        self._check_errors = dict.fromkeys(CHECK_ERROR_REASONS, 0)

    def configure(self, settings: object) -> None:
        """Take a reloaded ``checkpoints`` section, its roots included (units no longer planned are forgotten)."""
        for name in (
            "interval_seconds",
            "settle_seconds",
            "deep_per_scan",
            "deep_max_bytes",
            "max_entries",
            "max_depth",
            "max_seconds",
            "timeout_seconds",
            "deep_timeout_seconds",
            "dataset_min_bytes",
        ):
            if hasattr(settings, name):
                setattr(self, name, getattr(settings, name))
        if isinstance(settings, CheckpointsConfig):
            self.limits = DeepLimits.from_config(settings)
            if self.resolve_roots is not None:
                roots = tuple(os.path.normpath(r) for r in self.resolve_roots(settings))
                if roots != self.roots:
                    log.info("checkpoint roots now %s", ", ".join(roots) or "none")
                    self.roots = roots

    # -- units

    def _plan(self) -> list[tuple[str, str]]:
        """(unit, the configured root it lies in): every root, then every mountpoint strictly below a root."""
        mountpoints = sorted(set(self.mountpoints()))
        units: dict[str, str] = {}
        for root in self.roots:
            base = os.path.normpath(root)
            units.setdefault(base, base)
            prefix = base.rstrip("/") + "/"
            for mp in mountpoints:
                if mp.startswith(prefix):
                    units.setdefault(mp, base)
        return list(units.items())

    # -- collection

    @property
    def off_reason(self) -> str | None:
        """Off where there is nowhere to look: no checkpoints.roots configured and no kubelet pod volumes."""
        return None if self.roots else "no checkpoints.roots configured and no kubelet pod volumes on this node"

    def collect(self) -> CheckpointFacts:
        if not self.roots:
            return CheckpointFacts(self.clock(), (), False, None, 0.0, ())
        self._round += 1
        now = self.clock()
        self._backed_now = {}
        self.writers.forget_reused()
        plan = self._plan()
        unit_paths = sorted(u for u, _ in plan)
        stuck_mounts = {os.path.normpath(p) for p in self.stuck_paths()} if self.stuck_paths is not None else set()
        stuck: list[StuckRoot] = []
        problems: list[str] = []
        requests: dict[str, tuple[str, str]] = {}
        for unit, _ in plan:
            if unit in stuck_mounts:
                stuck.append(StuckRoot(unit, 0.0, "its mount's statvfs is stuck; not walked"))
                continue
            prefix = unit.rstrip("/") + "/"
            skip = [u for u in unit_paths if u.startswith(prefix)] + [m for m in stuck_mounts if m.startswith(prefix)]
            params = {
                "now": now,
                "settle": self.settle_seconds,
                "max_entries": self.max_entries,
                "max_depth": self.max_depth,
                "max_seconds": self.max_seconds,
                "skip": skip,
                "round": self._round,
                "limits": self._limits_param(),
            }
            requests[unit] = (unit, json.dumps(params).encode().hex())
        wait = min(self.timeout_seconds, self.max_seconds + WAIT_MARGIN_SECONDS)
        outcomes = self.calls.call_many("ckpt_scan", requests, self.timeout_seconds, wait=wait)
        fresh: set[str] = set()
        for unit, outcome in outcomes.items():
            if outcome.text is not None:
                try:
                    before = self._units.get(unit)
                    self._units[unit] = result = self._take(json.loads(outcome.text))
                    fresh.add(unit)
                    if result.truncated and (before is None or before.truncated_detail != result.truncated_detail):
                        log.info("checkpoint scan of %s truncated: %s", unit, result.truncated_detail)
                except (ValueError, KeyError, TypeError) as err:
                    problems.append(f"{unit}: unreadable answer from the helper ({type(err).__name__}: {err})")
            elif outcome.stuck:
                stuck.append(StuckRoot(unit, outcome.in_flight_seconds, "its walk has not returned"))
            elif outcome.error is not None:
                problems.append(f"{unit}: {outcome.error}")
        planned = {u for u, _ in plan}
        self._units = {u: r for u, r in self._units.items() if u in planned}
        root_of = dict(plan)
        resolved_roots = {root: self._units[root].resolved for root in self.roots if root in self._units}

        # Every candidate of every unit (this round's answer, or the last one), tracked over time.
        candidates: dict[str, tuple[dict[str, Any], str]] = {}
        for unit, result in self._units.items():
            for cand in result.candidates:
                candidates.setdefault(cand["path"], (cand, unit))
                if unit in fresh:
                    self._track(cand, now)
        if not any(r.truncated for r in self._units.values()):
            self._seen = {p: s for p, s in self._seen.items() if p in candidates}
        if self.deep_per_scan > 0 or self._deep_pending:
            stuck.extend(self._deep_checks(now, candidates, {s.path for s in stuck}))

        runs = self._runs(candidates, root_of, resolved_roots)
        unreadable = tuple(
            Unreadable(u, r.unreadable, r.unreadable_paths) for u, r in sorted(self._units.items()) if r.unreadable
        )
        failure = None
        if stuck or problems or unreadable:
            parts = [f"checkpoint root {s.path} is stuck: {s.reason} ({s.seconds:.0f} s)" for s in stuck] + problems
            parts += [
                f"cannot read {u.entries} entr{'y' if u.entries == 1 else 'ies'} under {u.path} (permission denied: "
                f"{', '.join(u.examples[:3])}); checkpoints there are not seen"
                for u in unreadable
            ]
            failure = "; ".join(parts[:5]) + (f"; and {len(parts) - 5} more" if len(parts) > 5 else "")
        truncated = [r for r in self._units.values() if r.truncated]
        return CheckpointFacts(
            now,
            runs,
            bool(truncated),
            truncated[0].truncated_reason if truncated else None,
            sum(self._units[u].seconds for u in fresh),
            self.roots,
            tuple(stuck),
            dict(self._check_errors),
            failure,
            self._dataset_dirs(),
            dict(self._claims_rejected),
            unreadable,
        )

    def _dataset_dirs(self) -> tuple[DatasetDir, ...]:
        """Every unit's dataset directories of at least dataset_min_bytes, once each, the largest first."""
        found: dict[str, DatasetDir] = {}
        for result in self._units.values():
            for d in result.datasets:
                if d.bytes >= self.dataset_min_bytes:
                    found.setdefault(d.path, d)
        return tuple(sorted(found.values(), key=lambda d: (-d.bytes, d.path))[:MAX_DATASET_DIRS])

    def _limits_param(self) -> dict[str, Any] | None:
        return None if self.limits is None else dataclasses.asdict(self.limits)

    def _take(self, answer: dict[str, Any]) -> _UnitResult:
        for reason, count in answer.get("check_errors", {}).items():
            key = reason if reason in self._check_errors else "other"
            self._check_errors[key] += int(count)
        for reason, count in answer.get("claims_rejected", {}).items():
            if reason in self._claims_rejected:
                self._claims_rejected[reason] += int(count)
        return _UnitResult(
            resolved=str(answer["root"]),
            candidates=tuple(answer["candidates"]),
            truncated=bool(answer["truncated"]),
            truncated_reason=answer.get("truncated_reason"),
            truncated_detail=answer.get("truncated_detail"),
            seconds=float(answer.get("seconds") or 0.0),
            orphans=tuple(answer.get("orphans") or ()),
            datasets=tuple(_datasets(answer.get("datasets") or ())),
            unreadable=int(answer.get("unreadable") or 0),
            unreadable_paths=tuple(str(p) for p in answer.get("unreadable_paths") or ()),
        )

    def _track(self, cand: dict[str, Any], now: float) -> None:
        path = cand["path"]
        footprint = (int(cand["size_bytes"]), float(cand["newest_mtime"]))
        result = _result(cand["check"])
        seen = self._seen.get(path)
        if seen is None:
            seen = self._seen[path] = _Seen(footprint, result, now, now if result.verdict == "incomplete" else None)
        elif seen.deep and seen.footprint == footprint:
            pass  # unchanged since its deep check: that verdict stands
        else:
            seen.footprint, seen.result, seen.deep = footprint, result, False
        if seen.result.verdict == "complete" and seen.completed_seen is None:
            seen.completed_seen = now

    def _deep_checks(
        self, now: float, candidates: dict[str, tuple[dict[str, Any], str]], stuck_units: set[str]
    ) -> list[StuckRoot]:
        busy = {unit for _, unit in self._deep_pending.values()}
        todo = sorted(
            # A deep check reads every byte: larger checkpoints are checked in full only on demand (storwatch verify).
            (
                (path, s)
                for path, s in self._seen.items()
                if s.result.verdict == "complete"
                and not s.deep
                and s.result.size_bytes <= self.deep_max_bytes
                and path in candidates
                and candidates[path][1] not in stuck_units | busy
            ),
            key=lambda item: item[1].result.mtime,
            reverse=True,
        )
        active = len(self._deep_pending) - len(self._deep_stuck & self._deep_pending.keys())
        for path, _ in todo[: max(0, self.deep_per_scan - active)]:
            self._deep_pending[_DEEP + path] = (path, candidates[path][1])
        params = json.dumps({"now": now, "settle": self.settle_seconds, "limits": self._limits_param()}).encode().hex()
        requests = {key: (path, params) for key, (path, _) in self._deep_pending.items()}
        outcomes = self.calls.call_many("ckpt_deep", requests, self.deep_timeout_seconds)
        stuck: list[StuckRoot] = []
        self._deep_stuck = {key for key, outcome in outcomes.items() if outcome.stuck}
        for key, outcome in outcomes.items():
            path, unit = self._deep_pending[key]
            if outcome.stuck:
                stuck.append(StuckRoot(unit, outcome.in_flight_seconds, f"the deep check of {path} has not returned"))
                continue
            if outcome.text is None and outcome.error is None:
                continue  # still within its deadline
            del self._deep_pending[key]
            seen = self._seen.get(path)
            if outcome.text is None or seen is None:
                if outcome.error is not None:
                    log.info("deep check of %s not made: %s", path, outcome.error)
                continue
            deep = self._deep_answer(outcome)
            if deep is None:
                continue
            if deep.verdict != "complete":
                log.warning("checkpoint %s failed its deep check: %s", deep.path, deep.reason)
            seen.result, seen.deep = deep, True
        return stuck

    def _deep_answer(self, outcome: CallOutcome) -> CheckResult | None:
        try:
            answer = json.loads(outcome.text or "")
            for reason, count in answer.get("check_errors", {}).items():
                key = reason if reason in self._check_errors else "other"
                self._check_errors[key] += int(count)
            return _result(answer["check"])
        except (ValueError, KeyError, TypeError) as err:
            log.warning("unreadable deep-check answer from the helper: %s", err)
            return None

    def _runs(
        self,
        candidates: dict[str, tuple[dict[str, Any], str]],
        root_of: dict[str, str],
        resolved_roots: dict[str, str],
    ) -> tuple[RunState, ...]:
        members: dict[str, list[tuple[float, str, CheckpointState]]] = {}
        run_root: dict[str, str] = {}
        for path, (cand, unit) in candidates.items():
            seen = self._seen.get(path)
            if seen is None:
                continue  # seen only in a kept answer of a unit this source has not tracked yet
            run = str(cand["run"])
            root = root_of.get(unit, unit)
            run_root.setdefault(run, resolved_roots.get(root, root))
            members.setdefault(run, []).append((float(cand["newest_mtime"]), path, self._state(cand, seen)))
        orphans: dict[str, list[dict[str, Any]]] = {}
        writing: dict[str, float] = {}
        writers: dict[str, set[int]] = {}
        now = self.clock()
        seen_writing: dict[str, float] = {}
        for unit, result in self._units.items():
            root = root_of.get(unit, unit)
            for orphan in result.orphans:
                run = str(orphan["run"])
                if orphan.get("writing"):
                    # a save in progress: since when this source first saw its temporary
                    path = str(orphan["path"])
                    since = seen_writing[path] = self._writing_seen.get(path, now)
                    writing[run] = min(writing.get(run, since), since)
                    pid = temp_writer_pid(os.path.basename(path))
                    if pid is not None and self._backed(pid, run):
                        writers.setdefault(run, set()).add(pid)
                    run_root.setdefault(run, resolved_roots.get(root, root))
                    continue
                orphans.setdefault(run, []).append(orphan)
                run_root.setdefault(run, resolved_roots.get(root, root))
        self._writing_seen = seen_writing
        runs = []
        for run in sorted(set(members) | set(orphans) | set(writing)):
            states = tuple(state for _, _, state in sorted(members.get(run, []), key=lambda m: (m[0], m[1])))
            left = sorted(orphans.get(run, []), key=lambda o: str(o["path"]))
            runs.append(
                RunState(
                    run,
                    run_root[run],
                    states,
                    len(left),
                    sum(int(o["bytes"]) for o in left),
                    tuple(str(o["path"]) for o in left[:ORPHAN_PATHS_PER_RUN]),
                    writing.get(run),
                    tuple(sorted(writers.get(run, ()))),
                )
            )
        return tuple(runs)

    def _backed(self, pid: int, run: str) -> bool:
        """Whether the kernel backs a tenant's claim that ``pid`` writes ``run`` (sources/writers.py); a refusal is
        counted once per process and run."""
        known = self._backed_now.get((pid, run))
        if known is not None:
            return known
        if parse_kubelet_volume_path(run) is not None:
            # A pod's volume: the PID is the container's, not the host's; the pod whose volume it is writes it.
            self._backed_now[(pid, run)] = False
            return False
        reason = self.writers.look(pid, run)
        if reason is not None and reason != GONE and (pid, run, reason) not in self._claims_judged:
            if len(self._claims_judged) >= MAX_JUDGED_CLAIMS:
                self._claims_judged.clear()
            self._claims_judged.add((pid, run, reason))
            self._claims_rejected[reason] += 1
            log.info(
                "checkpoint run %s names process %d as its writer, which has no file open there: not believed", run, pid
            )
        self._backed_now[(pid, run)] = reason is None
        return reason is None

    def _state(self, cand: dict[str, Any], seen: _Seen) -> CheckpointState:
        r = seen.result
        write_seconds: float | None = None
        rate: float | None = None
        start: float | None = None
        pid: int | None = None
        rec = cand.get("event")
        if rec is not None and rec["end"] >= rec["start"]:
            write_seconds = rec["end"] - rec["start"]
            rate = rec["bytes"] / write_seconds if write_seconds > 0 else None
            start = rec["start"]
            claimed = rec.get("pid")
            pid = int(claimed) if claimed is not None and self._backed(int(claimed), str(cand["run"])) else None
        elif seen.first_incomplete is not None and seen.completed_seen is not None:
            write_seconds = seen.completed_seen - seen.first_incomplete
            rate = r.size_bytes / write_seconds if write_seconds > 0 else None
        return CheckpointState(
            cand["path"],
            r.format,
            r.verdict,
            r.reason,
            r.size_bytes,
            r.mtime,
            seen.deep,
            seen.first_seen,
            write_seconds,
            rate,
            start,
            allocated_bytes=int(cand.get("allocated_bytes") or 0),
            writer_pid=pid,
        )

    def close(self) -> None:
        self.calls.close()
