"""The checkpoint source: finds checkpoints under the watched roots, checks each, and follows every run over time.

Nothing here touches a checkpoint root: the walks, stats, checks and event-log reads run in a helper process
(``_checkpoint_worker.py``) through storwatch.calls.blocking, each with a deadline, one per unit. A unit is a scan root,
or a mount below one (read from this process's mount table), each walked on its own, so a pod volume on a FUSE mount
whose readdir or stat hangs makes that one unit stuck (``stuck_roots``, and the collector fails naming it) while the
others are still scanned, and the agent's threads never wait in the kernel. A collection waits for the walks no longer
than they bound themselves (``max_seconds``, plus a margin); a unit still out then keeps its last result, and is stuck
once past ``timeout_seconds``. A stuck unit's last result is kept.

Each walk is bounded (entries, depth, seconds per unit; see checkpoints/scan.py). A candidate is checked cheaply when
it is new or changed; a call whose checks go past ``max_seconds`` (a first walk of thousands of files) answers
``more`` and shows nothing yet, and the next call, brought forward, goes on from the checks made. One complete
checkpoint per scan gets the deep check (every CRC, and torch.load where torch is installed), newest first, so a
node's checkpoints are all read in full eventually at a low, steady rate; not one the file events show may still be
being saved (``saving``), nor one written within DEEP_AFTER_SECONDS. A check that raises makes only its own
checkpoint ``corrupt`` (``unknown`` when it is no known format) and is counted by kind (``check_errors``). A write's
span comes from the training side's event log (storwatch.training.atomic_save) where there
is one; else the kernel's birth time of the checkpoint gives its start only (its newest mtime misses an fsync after
the last write), which the file events or the writers' open files complete (analysis/writes.py), or it is not timed
(a span known only to within a scan interval is no duration). Temporaries of
``atomic_save`` whose writer is gone are reported per run (never removed: the next save does that).

The records it files are those the helper made (checkpoints/record.py), with what only this source knows added:
when it first saw each checkpoint, a write timed by watching, and the writer PID the kernel backs
(sources/writers.py); runs are keyed by RunId.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from storwatch._checkpoint_worker import command as worker_command
from storwatch.calls.blocking import BlockingCalls, Helper
from storwatch.checkpoints.limits import DeepLimits
from storwatch.checkpoints.record import Checkpoint, DeepAnswer, Run, RunId, UnitAnswer, applied, from_wire
from storwatch.checkpoints.scan import DatasetDir
from storwatch.config import CheckpointsConfig
from storwatch.labels import CHECK_ERROR_REASONS, CLAIM_REJECT_REASONS, MAX_DATASET_DIRS
from storwatch.pace import CpuBudget
from storwatch.paths import HostPaths
from storwatch.procfs.mountinfo import parse_mountinfo
from storwatch.sources import FactsKey, checkpoint_key
from storwatch.sources.checkpoint_key import KUBELET_PODS, SearchPlan, SearchRoot, default_roots
from storwatch.sources.kubevolumes import parse_kubelet_volume_path
from storwatch.sources.writers import GONE, WriterCheck
from storwatch.training import EVENT_LOG_NAME as EVENT_LOG
from storwatch.training import temp_writer_pid

log = logging.getLogger(__name__)

__all__ = [
    "CHECK_ERROR_REASONS",
    "EVENT_LOG",
    "KUBELET_PODS",
    "Checkpoint",
    "CheckpointFacts",
    "CheckpointSource",
    "RunState",
    "SearchPlan",
    "SearchRoot",
    "StuckRoot",
    "default_roots",
]

ORPHAN_PATHS_PER_RUN = 20
"""Paths of orphaned temporaries named per run (all of them are counted)."""
WAIT_MARGIN_SECONDS = 2.0
"""A collection waits for the walks at most max_seconds (where they stop themselves) plus this, or timeout_seconds if
that is shorter: a unit still walking then keeps its last result, and is stuck only once past timeout_seconds."""
MAX_JUDGED_CLAIMS = 4096
"""Refused PID claims remembered as counted (past it the memory starts again)."""
_DEEP = "deep\0"
"""Prefix of a deep check's key among the helper's calls (a unit's key is its path)."""
DEEP_AFTER_SECONDS = 2.0
"""A checkpoint last written less than this long ago gets no deep check yet, whatever the file events say: their
facts are up to a second old (the source's interval), and a writer may open the file again to sync it within
REOPEN_SECONDS of its close (``_events_worker.py``)."""
SAVE_SCAN_SECONDS = 2.0
"""A save that ended (the file events source saw it closed or moved into place) brings the next scan this close, or
as close as the scans' CPU share allows (:meth:`CheckpointSource.may_scan_soon`): the finding, the recovery point and
a sync waiting on it see the new checkpoint within seconds, not at the next interval."""


@dataclass(frozen=True)
class RunState:
    path: str
    """The directory the job writes its series into."""
    root: str
    checkpoints: tuple[Checkpoint, ...]
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
    writing_incomplete: bool = False
    """The newest checkpoint is incomplete and changed within the settle window (its mtime at most
    ``settle_seconds`` from the scan's time, by this source's clock): being written, by whatever writes it."""
    abandoned: int = 0
    """Incomplete checkpoints unchanged for longer than the settle window (or dated implausibly far ahead): cut short,
    and nothing writes them any more."""
    uid: int | None = None
    """The run directory's owner as the kernel reports it; None when it could not be had."""

    @functools.cached_property
    def id(self) -> RunId:
        """The run's key on this node: its root and its directory (one RunId per RunState, so what it works out once,
        such as its path below the root, is worked out once)."""
        return RunId(self.root, self.path)

    @functools.cached_property
    def complete(self) -> tuple[Checkpoint, ...]:
        """Oldest first; worked out once per RunState (each View asks it of every run several times)."""
        return tuple(c for c in self.checkpoints if c.verdict == "complete")

    @property
    def newest_complete(self) -> Checkpoint | None:
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
        incomplete and changing (an incomplete one that stopped changing is ``abandoned``, not being written)."""
        return self.writing_since is not None or self.writing_incomplete

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
    plan: SearchPlan | None = None
    """Where this collection searched and why (``roots`` as the host names them, each with why it was chosen), and the
    places passed over; None for a source given its roots alone (a one-off walk of named directories)."""


CHECKPOINTS: FactsKey[CheckpointFacts] = checkpoint_key.CHECKPOINTS
"""The checkpoint source's facts in a Snapshot."""


@dataclass
class _Seen:
    """When this source first saw a checkpoint."""

    footprint: tuple[int, float]
    first_seen: float


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


class CheckpointSource:
    name = "checkpoints"

    def __init__(
        self,
        roots: Sequence[str],
        settings: CheckpointsConfig | None = None,
        clock: Callable[[], float] = time.time,
        stuck_paths: Callable[[], Iterable[str]] | None = None,
        mountpoints: Callable[[], Iterable[str]] | None = None,
        calls: BlockingCalls | None = None,
        plan: Callable[[CheckpointsConfig], SearchPlan] | None = None,
        writers: WriterCheck | None = None,
        max_inflight: int = 8,
        paths: HostPaths | None = None,
        saving: Callable[[], Collection[str]] | None = None,
        helper: Helper | None = None,
    ) -> None:
        """``settings``: the ``checkpoints`` section (the defaults when None), taken whole on every reload;
        ``plan``: where to search under a section, asked again at every collection (the default places follow the
        mount table), its roots reached below ``paths``' root; without it, ``roots`` (as reached) are searched;
        ``saving``: the files whose save may still be under way (the file events' word, ``FileEventFacts.saving``),
        asked before each round of deep checks; ``helper``: the helper process the walks and checks go to, shared
        with other sources' calls, which must run this source's helper program (``_checkpoint_worker.command``: its
        operations include the plain blocking calls'); None: one of this source's own."""
        self.roots = tuple(os.path.normpath(r) for r in roots)
        self.plan = plan
        self.paths = paths if paths is not None else HostPaths()
        self.searching: SearchPlan | None = None
        """The plan of the last collection."""
        self.settings = settings if settings is not None else CheckpointsConfig()
        self.budget = CpuBudget(self.settings.scan_cpu_share, self.settings.scan_max_interval_seconds)
        """What a scan costs (the helper's CPU for it and this source's), and so how often one comes."""
        self.interval_seconds = self.settings.interval_seconds
        self.began: float | None = None
        """When (time.monotonic()) the last scan began; None before the first."""
        self.limits = DeepLimits.from_config(self.settings)
        """The bounds of every check, sent to the helper with each request."""
        self.stuck_paths = stuck_paths
        self.saving = saving
        self.mountpoints = mountpoints if mountpoints is not None else OwnMountpoints()
        self.clock = clock
        self.writers = writers if writers is not None else WriterCheck()
        own = helper if helper is not None else Helper(worker_command())
        self.calls = calls if calls is not None else BlockingCalls(max_inflight, helper=own)
        self._writing_seen: dict[str, float] = {}
        """Temporaries of saves in progress, and when each was first seen."""
        self._round = 0
        self._seen: dict[str, _Seen] = {}
        self._units: dict[str, UnitAnswer] = {}
        """Each unit's last answer, whole (the helper's changes applied): kept while a later walk is stuck or still
        within its deadline; its number goes with the next request, so the helper sends only what changed."""
        self._states: dict[str, tuple[Run, RunState]] = {}
        """Run path -> the helper's record of it and the state made from it, for a run the helper did not change."""
        self._deep_pending: dict[str, tuple[str, str]] = {}
        """Deep checks sent and not answered yet: key -> (checkpoint path, unit)."""
        self._deep_stuck: set[str] = set()
        """Keys of deep checks past their deadline at the last round (they hold no place among deep_per_scan)."""
        self._check_errors = dict.fromkeys(CHECK_ERROR_REASONS, 0)
        self._claims_rejected = dict.fromkeys(CLAIM_REJECT_REASONS, 0)
        self._claims_judged: set[tuple[int, str, str]] = set()
        """(PID, run, reason) of refused PID claims already counted."""
        self._backed_now: dict[tuple[int, str], bool] = {}
        """PID claims judged in this collection."""
        self.waiting: tuple[str, ...] = ()
        """Units planned at the last collection whose walk has not answered yet (and is not stuck)."""
        self.more: tuple[str, ...] = ()
        """Units whose call at the last collection ran past its check budget: the next call goes on with the checks
        (``ScanAfterSaves`` brings it forward)."""
        self.check_seconds: float | None = None
        """How long one call of the helper goes on (its walk, then its checks) before it answers ``more``; None:
        ``max_seconds``, the walk's own bound, well within ``timeout_seconds``, so a first walk of a large tree is
        never taken for one that hangs."""

    def configure(self, settings: CheckpointsConfig) -> None:
        """Take a reloaded ``checkpoints`` section whole, its roots included (units no longer planned are
        forgotten)."""
        self.settings = settings
        self.interval_seconds = settings.interval_seconds
        self.budget.configure(settings.scan_cpu_share, settings.scan_max_interval_seconds)
        self.budget.forget()
        self.limits = DeepLimits.from_config(settings)

    def _replan(self) -> SearchPlan | None:
        """Where to search now (the plan's roots become ``roots``), said in the log when it changed."""
        if self.plan is None:
            return None
        plan = self.plan(self.settings)
        roots = tuple(os.path.normpath(r) for r in plan.local_roots(self.paths))
        if plan != self.searching:
            if plan.roots:
                log.info("searching for checkpoints in %s", "; ".join(f"{r.path} ({r.why})" for r in plan.roots))
            else:
                log.info("%s", plan.nowhere())
        self.searching = plan
        self.roots = roots
        return plan

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
    def interval_seconds(self) -> float:
        """``interval_seconds``, or longer where a scan costs more than ``scan_cpu_share`` of a core over it."""
        return self.budget.interval(self._interval)

    @interval_seconds.setter
    def interval_seconds(self, seconds: float) -> None:
        self._interval = seconds

    @property
    def off_reason(self) -> str | None:
        """Off where there is nowhere to look (no root configured, no default place, no kubelet pod volumes)."""
        if self.roots:
            return None
        return self.searching.nowhere() if self.searching is not None else "no checkpoint roots to search"

    def may_scan_soon(self) -> bool:
        """Whether a scan may come now, ahead of the interval (for a save that ended since the last began): the last
        began at least SAVE_SCAN_SECONDS ago, or longer where a scan costs more than ``scan_cpu_share`` of a core over
        that (a node with hundreds of runs keeps its pace)."""
        began = self.began
        return began is None or time.monotonic() - began >= self.budget.interval(SAVE_SCAN_SECONDS)

    def collect(self) -> CheckpointFacts:
        self.began = time.monotonic()
        searching = self._replan()
        if not self.roots:
            self._units = {}
            return CheckpointFacts(self.clock(), (), False, None, 0.0, (), plan=searching)
        settings = self.settings
        cpu_started = time.thread_time()
        helper_cpu, rescans = 0.0, 0
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
                "settle": settings.settle_seconds,
                "max_entries": settings.max_entries,
                "max_depth": settings.max_depth,
                "max_seconds": settings.max_seconds,
                "skip": skip,
                "round": self._round,
                "limits": self._limits_param(),
                "have": held.seq if (held := self._units.get(unit)) is not None else 0,
                "check_seconds": self.check_seconds if self.check_seconds is not None else settings.max_seconds,
            }
            requests[unit] = (unit, json.dumps(params, allow_nan=False).encode().hex())
        wait = min(settings.timeout_seconds, settings.max_seconds + WAIT_MARGIN_SECONDS)
        outcomes = self.calls.call_many("ckpt_scan", requests, settings.timeout_seconds, wait=wait)
        fresh: set[str] = set()
        changed: list[Run] = []
        more: set[str] = set()
        for unit, outcome in outcomes.items():
            if outcome.text is not None:
                try:
                    before = self._units.get(unit)
                    sent = from_wire(UnitAnswer, json.loads(outcome.text))
                    if before is not None and 0 <= sent.cpu_seconds < 3600:
                        # A rescan: what a scan costs from now on. A unit's first walk checks every file once and
                        # is start-up (or a new volume), not the steady cost.
                        helper_cpu += sent.cpu_seconds
                        rescans += 1
                    if sent.more:
                        more.add(unit)  # its checks go on at the next call; what the unit answered before stands
                        self._count(sent)
                        continue
                    self._units[unit] = answer = applied(before, sent)
                    self._count(answer)
                    changed.extend(sent.runs)
                    fresh.add(unit)
                    if answer.truncated and (before is None or before.truncated_detail != answer.truncated_detail):
                        log.info("checkpoint scan of %s truncated: %s", unit, answer.truncated_detail)
                except (ValueError, RecursionError) as err:
                    problems.append(f"{unit}: unreadable answer from the helper ({type(err).__name__}: {err})")
            elif outcome.stuck:
                stuck.append(StuckRoot(unit, outcome.in_flight_seconds, "its walk has not returned"))
            elif outcome.error is not None:
                problems.append(f"{unit}: {outcome.error}")
        planned = {u for u, _ in plan}
        self._units = {u: r for u, r in self._units.items() if u in planned}
        stuck_now = {s.path for s in stuck}
        self.waiting = tuple(sorted(u for u in planned if u not in self._units and u not in stuck_now))
        self.more = tuple(sorted(more))
        root_of = dict(plan)
        resolved = {root: self._units[root].root for root in self.roots if root in self._units}

        # Every checkpoint of every unit (this round's answer, or the last one), tracked over time: those in runs
        # the helper sent this round (a run it did not send again is as it was).
        for run in changed:
            for c in run.checkpoints:
                self._track(c, now)
        unit_of: dict[str, str] = {}
        for unit, answer in self._units.items():
            for run in answer.runs:
                for c in run.checkpoints:
                    unit_of.setdefault(c.path, unit)
        if not any(r.truncated for r in self._units.values()):
            self._seen = {p: s for p, s in self._seen.items() if p in unit_of}
        runs = self._runs(root_of, resolved, now)
        if settings.deep_per_scan > 0 or self._deep_pending:
            deep_stuck, checked = self._deep_checks(now, runs, unit_of, {s.path for s in stuck})
            stuck.extend(deep_stuck)
            if checked:  # shown now; the helper's cache has them from its next scan on
                runs = tuple(_with_deep(r, checked) for r in runs)
        runs = tuple(_with_writing(r, now, settings.settle_seconds) for r in runs)
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
        if rescans:
            self.budget.spent(helper_cpu + time.thread_time() - cpu_started)
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
            searching,
        )

    def _dataset_dirs(self) -> tuple[DatasetDir, ...]:
        """Every unit's dataset directories of at least dataset_min_bytes, once each, the largest first."""
        found: dict[str, DatasetDir] = {}
        for answer in self._units.values():
            for d in answer.datasets:
                if d.bytes >= self.settings.dataset_min_bytes:
                    found.setdefault(d.path, d)
        return tuple(sorted(found.values(), key=lambda d: (-d.bytes, d.path))[:MAX_DATASET_DIRS])

    def _limits_param(self) -> dict[str, Any]:
        return dataclasses.asdict(self.limits)

    def _track(self, c: Checkpoint, now: float) -> None:
        seen = self._seen.get(c.path)
        if seen is None:
            self._seen[c.path] = _Seen((c.size_bytes, c.mtime), now)
        else:
            seen.footprint = (c.size_bytes, c.mtime)

    def _count(self, answer: UnitAnswer) -> None:
        """The check errors and refused event lines of an answer (each reported once: by the call that met it)."""
        for reason, count in answer.check_errors.items():
            self._check_errors[reason if reason in self._check_errors else "other"] += count
        for reason, count in answer.claims_rejected.items():
            if reason in self._claims_rejected:
                self._claims_rejected[reason] += count

    def _deep_checks(
        self, now: float, runs: tuple[RunState, ...], unit_of: dict[str, str], stuck_units: set[str]
    ) -> tuple[list[StuckRoot], dict[str, Checkpoint]]:
        """Send the newest complete checkpoints not yet deep-checked (within deep_max_bytes) to the helper, at most
        deep_per_scan at a time; the units stuck in one, and the checks answered now. The helper keeps each verdict
        in its unit's cache, so later scans report it."""
        settings = self.settings
        busy = {unit for _, unit in self._deep_pending.values()} | stuck_units
        pending = {path for path, _ in self._deep_pending.values()}
        # Not a checkpoint whose save may still be under way (the file events say so, or it was written within
        # DEEP_AFTER_SECONDS): its writer may sync it through a second descriptor after its close, and the events do
        # not say whose a close is, so a deep check (a child importing torch, holding the file) that outlasted that
        # sync would be timed as the save's. It waits for a later scan (a save that ends brings one forward).
        saving = _with_parents(self.saving()) if self.saving is not None else frozenset()
        todo = sorted(
            # A deep check reads every byte: larger checkpoints are checked in full only on demand (storwatch verify).
            (
                c
                for run in runs
                for c in run.checkpoints
                if c.verdict == "complete"
                and not c.deep_checked
                and c.size_bytes <= settings.deep_max_bytes
                and c.path not in pending
                and unit_of.get(c.path) not in busy
                and c.path.rstrip("/") not in saving
                and not 0.0 <= now - c.mtime < DEEP_AFTER_SECONDS
            ),
            key=lambda c: c.mtime,
            reverse=True,
        )
        active = len(self._deep_pending) - len(self._deep_stuck & self._deep_pending.keys())
        for c in todo[: max(0, settings.deep_per_scan - active)]:
            self._deep_pending[_DEEP + c.path] = (c.path, unit_of[c.path])
        requests = {
            key: (
                path,
                json.dumps(
                    {"now": now, "settle": settings.settle_seconds, "limits": self._limits_param(), "unit": unit},
                    allow_nan=False,
                )
                .encode()
                .hex(),
            )
            for key, (path, unit) in self._deep_pending.items()
        }
        outcomes = self.calls.call_many("ckpt_deep", requests, settings.deep_timeout_seconds)
        stuck: list[StuckRoot] = []
        checked: dict[str, Checkpoint] = {}
        self._deep_stuck = {key for key, outcome in outcomes.items() if outcome.stuck}
        for key, outcome in outcomes.items():
            path, unit = self._deep_pending[key]
            if outcome.stuck:
                stuck.append(StuckRoot(unit, outcome.in_flight_seconds, f"the deep check of {path} has not returned"))
                continue
            if outcome.text is None and outcome.error is None:
                continue  # still within its deadline
            del self._deep_pending[key]
            if outcome.text is None:
                log.info("deep check of %s not made: %s", path, outcome.error)
                continue
            try:
                answer = from_wire(DeepAnswer, json.loads(outcome.text))
            except (ValueError, RecursionError) as err:
                log.warning("unreadable deep-check answer from the helper: %s", err)
                continue
            for reason, count in answer.check_errors.items():
                self._check_errors[reason if reason in self._check_errors else "other"] += count
            checked[path] = answer.checkpoint
            if answer.checkpoint.verdict != "complete":
                log.warning("checkpoint %s failed its deep check: %s", path, answer.checkpoint.reason)
        return stuck, checked

    def _runs(self, root_of: dict[str, str], resolved: dict[str, str], now: float) -> tuple[RunState, ...]:
        """Every unit's runs, as the helper grouped them, with what this source adds: when each checkpoint was first
        seen and how long its write took, and whose writes the kernel backs."""
        runs: dict[str, RunState] = {}
        seen_writing: dict[str, float] = {}
        states_now: dict[str, tuple[Run, RunState]] = {}
        for unit, answer in self._units.items():
            root = root_of.get(unit, unit)
            where = resolved.get(root, root)
            for run in answer.runs:
                kept = self._states.get(run.path)
                if kept is not None and kept[0] is run and kept[1].root == where:
                    made = kept[1]  # the helper's same record: the same state, so the View's per-run caches stay
                else:
                    made = self._run_state(run, where, now, seen_writing)
                if not run.temps and not any(c.claimed_pid is not None for c in run.checkpoints):
                    # Nothing in it changes with time (a save in progress, a writer's claim): kept for next time.
                    states_now[run.path] = (run, made)
                known = runs.get(run.path)
                runs[run.path] = made if known is None else _merged(known, made)
        self._writing_seen = seen_writing
        self._states = states_now
        return tuple(runs[p] for p in sorted(runs))

    def _run_state(self, run: Run, root: str, now: float, seen_writing: dict[str, float]) -> RunState:
        """The helper's run with what this source adds (``seen_writing`` gets its saves in progress)."""
        states = tuple(sorted((self._state(c, run.path) for c in run.checkpoints), key=lambda c: (c.mtime, c.path)))
        orphans = [t for t in run.temps if not t.writing]
        since: float | None = None
        writers: set[int] = set()
        for t in run.temps:
            if not t.writing:
                continue
            # a save in progress: since when this source first saw its temporary
            first = seen_writing[t.path] = self._writing_seen.get(t.path, now)
            since = first if since is None else min(since, first)
            pid = temp_writer_pid(os.path.basename(t.path))
            if pid is not None and self._backed(pid, run.path):
                writers.add(pid)
        return RunState(
            run.path,
            root,
            states,
            len(orphans),
            sum(t.allocated_bytes for t in orphans),
            tuple(t.path for t in orphans[:ORPHAN_PATHS_PER_RUN]),
            since,
            tuple(sorted(writers)),
            uid=run.uid,
        )

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
                "checkpoint run %s names process %d as its writer, %s: not believed",
                run,
                pid,
                "whose open files the kernel does not show this agent (no CAP_SYS_PTRACE)"
                if reason == "not_visible"
                else "which has no file open there",
            )
        self._backed_now[(pid, run)] = reason is None
        return reason is None

    def _state(self, c: Checkpoint, run: str) -> Checkpoint:
        """The helper's record with what this source knows: when it first saw it, and the writer PID where the
        kernel backs the claim."""
        seen = self._seen.get(c.path)
        first_seen = seen.first_seen if seen is not None else self.clock()
        claimed = c.claimed_pid
        pid = claimed if claimed is not None and c.write_seconds is not None and self._backed(claimed, run) else None
        return dataclasses.replace(c, first_seen=first_seen, writer_pid=pid)

    def close(self) -> None:
        self.calls.close()


def _with_deep(run: RunState, checked: dict[str, Checkpoint]) -> RunState:
    """The run with the deep checks answered in this collection in place of its checkpoints' cheap verdicts."""
    if not any(c.path in checked for c in run.checkpoints):
        return run
    states = tuple(
        c
        if c.path not in checked
        else dataclasses.replace(
            c,
            verdict=checked[c.path].verdict,
            reason=checked[c.path].reason,
            deep_checked=True,
            notes=checked[c.path].notes,
        )
        for c in run.checkpoints
    )
    return dataclasses.replace(run, checkpoints=states)


def _with_parents(paths: Iterable[str]) -> frozenset[str]:
    """The paths and every directory above them: a checkpoint (a file, or a directory of shards) is, or holds, one of
    ``paths`` when its path is in it. Made once a round, so that each checkpoint is one lookup however many files a
    tenant keeps open."""
    out: set[str] = set()
    for path in paths:
        path = path.rstrip("/")
        while path and path not in out:
            out.add(path)
            path = os.path.dirname(path).rstrip("/")
    return frozenset(out)


def _with_writing(run: RunState, now: float, settle: float) -> RunState:
    """The run with its incomplete checkpoints told apart by their mtime (after the deep checks, which may have
    found a checkpoint incomplete): the newest still changing within ``settle`` seconds is being written, one
    unchanged for longer was cut short and is abandoned. A file's mtime is what a tenant's writer set, so one far
    in the future does not count as changing: it would hold "writing" for ever."""

    def changing(c: Checkpoint) -> bool:
        return now - settle <= c.mtime <= now + settle

    incomplete = [c for c in run.checkpoints if c.verdict == "incomplete"]
    if not incomplete:
        return run
    newest = run.checkpoints[-1]
    writing = newest.verdict == "incomplete" and changing(newest)
    abandoned = sum(1 for c in incomplete if not changing(c))
    return dataclasses.replace(run, writing_incomplete=writing, abandoned=abandoned)


def _merged(a: RunState, b: RunState) -> RunState:
    """One run seen from two units (a run directory holding a mount below it)."""
    return RunState(
        a.path,
        a.root,
        tuple(sorted(a.checkpoints + b.checkpoints, key=lambda c: (c.mtime, c.path))),
        a.orphaned_temps + b.orphaned_temps,
        a.orphaned_temp_bytes + b.orphaned_temp_bytes,
        (a.orphaned_temp_paths + b.orphaned_temp_paths)[:ORPHAN_PATHS_PER_RUN],
        min((t for t in (a.writing_since, b.writing_since) if t is not None), default=None),
        tuple(sorted(set(a.writing_pids) | set(b.writing_pids))),
        uid=a.uid if a.uid is not None else b.uid,
    )
