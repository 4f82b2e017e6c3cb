"""What every area of the exporter is: a function from the View (and the exporter's state) to metric families, and
that state: the settings the areas render with and what each keeps from one render to the next."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar, cast

from prometheus_client import ProcessCollector

from storwatch.analysis.view import MountView, View
from storwatch.config import ALL_NFS_OPERATIONS, DEFAULT_MAX_MOUNT_SERIES, DEFAULT_NFS_OPERATIONS
from storwatch.exporter.text import Family

_Kept = TypeVar("_Kept")
log = logging.getLogger("storwatch.exporter")
AREA_ERROR_LOG_SECONDS = 60.0
"""An area that keeps failing is logged at most this often (every failure is counted)."""


@dataclass
class ConfigReloads:
    """How the agent's configuration reloads went (SIGHUP), for storwatch_config_*."""

    errors_total: int = 0
    last_success: bool = True
    """The configuration the agent started with counts as a success: it would not have started otherwise."""

    def succeeded(self) -> None:
        self.last_success = True

    def failed(self) -> None:
        self.errors_total += 1
        self.last_success = False


ALERTMANAGER_REQUEST_RESULTS = ("accepted", "unauthorized", "bad_request", "too_large", "busy", "off")
"""What became of a request to the Alertmanager receiver: taken (2xx); no or a wrong bearer token (401); not a
webhook payload we take, each alert checked (400, 405, 411); a body past alertmanager.max_body_bytes (413); every
slot for a request body in use (503, which Alertmanager retries); the receiver is off (404)."""
ALERTMANAGER_ALERT_RESULTS = ("stored", "updated", "stale", "ignored", "evicted")
"""What became of an alert in an accepted request: a new alert held (or one firing again, with a later startsAt); a
repeat post of one held; a late post of an earlier firing, ended before the held one began (dropped); another
node's, or one without the node label (dropped); held ones dropped to stay within alertmanager.max_alerts."""


class AlertmanagerCounts:
    """What the Alertmanager receiver did, for storwatch_alertmanager_*: counted on the HTTP server's threads, read
    by a render."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests = dict.fromkeys(ALERTMANAGER_REQUEST_RESULTS, 0)
        self._alerts = dict.fromkeys(ALERTMANAGER_ALERT_RESULTS, 0)

    def request(self, result: str) -> None:
        with self._lock:
            self._requests[result] += 1

    def alerts(self, result: str, count: int) -> None:
        with self._lock:
            self._alerts[result] += count

    def requests_total(self) -> dict[str, int]:
        with self._lock:
            return dict(self._requests)

    def alerts_total(self) -> dict[str, int]:
        with self._lock:
            return dict(self._alerts)


class ExportState:
    """The settings the areas render with, and each area's own memory between renders (:meth:`kept`)."""

    def __init__(
        self,
        nfs_operations: Iterable[str] = DEFAULT_NFS_OPERATIONS,
        reloads: ConfigReloads | None = None,
        process: ProcessCollector | None = None,
        alertmanager: AlertmanagerCounts | None = None,
        max_mount_series: int = DEFAULT_MAX_MOUNT_SERIES,
    ) -> None:
        self.reloads = reloads
        """The agent's reload record, exported as storwatch_config_* (left out without it)."""
        self.process = process
        """prometheus_client's collector of this process's CPU, memory and file descriptors (left out without it)."""
        self.alertmanager = alertmanager
        """The Alertmanager receiver's counts, exported as storwatch_alertmanager_* (left out without them)."""
        self.policy: Callable[[], PolicyMetrics] | None = None
        """The policy worker's figures at render time, exported as storwatch_policy_* (left out without it)."""
        self.sync: Callable[[], SyncMetrics] | None = None
        """The sync action's copies at render time, exported as storwatch_sync_* (left out without it)."""
        self.tick_interval: Callable[[], float] | None = None
        """The agent's tick interval now (storwatch/pace.py), exported as storwatch_tick_interval_seconds."""
        self.view_interval: Callable[[], float] | None = None
        """Seconds between Views now (storwatch/pace.py CpuBudget), exported as storwatch_view_interval_seconds."""
        self._kept: dict[type[object], object] = {}
        self._unexported: tuple[View, frozenset[str]] | None = None
        self.area_errors: dict[str, int] = {}
        """Renders of each area (or part of the agent's own) that raised, since the agent started."""
        self._area_logged: dict[str, float] = {}
        self.configure(nfs_operations, max_mount_series)

    def isolated(self, name: str, make: Callable[[], Iterable[Family]]) -> Iterator[Family]:
        """The families ``make`` writes, or none where it raises: one area that fails is counted
        (storwatch_exporter_area_errors_total) and logged, and the scrape still answers with every other area, as
        node_exporter fails only the collector at fault."""
        try:
            made = list(make())
        except Exception as err:  # any bug of one area: the rest of the scrape must not pay for it
            self.area_errors[name] = self.area_errors.get(name, 0) + 1
            now = time.monotonic()
            if now - self._area_logged.get(name, -AREA_ERROR_LOG_SECONDS) >= AREA_ERROR_LOG_SECONDS:
                self._area_logged[name] = now
                log.error("exporter: the %s area failed and was left out of this scrape: %r", name, err, exc_info=True)
            return iter(())
        return iter(made)

    def configure(self, nfs_operations: Iterable[str], max_mount_series: int = DEFAULT_MAX_MOUNT_SERIES) -> None:
        """New settings (a reload): what the areas kept was written under the old ones, and goes."""
        self.max_mount_series = max_mount_series
        self._unexported = None
        names = tuple(dict.fromkeys(nfs_operations))
        self.nfs_operations: tuple[str, ...] | None = None if ALL_NFS_OPERATIONS in names else names
        """The NFS procedures exported per operation, in the order their lines are written; None for all of them."""
        self._kept = {}

    def unexported_mounts(self, view: View) -> frozenset[str]:
        """The mountpoints of ``view`` left without series of their own by ``max_mount_series``
        (:func:`unexported_mounts`); worked out once per View, for every area that writes mount series."""
        done = self._unexported
        if done is None or done[0] is not view:
            done = self._unexported = (view, unexported_mounts(view, self.max_mount_series))
        return done[1]

    def kept(self, kind: type[_Kept]) -> _Kept:
        """The area's memory of type ``kind``: made empty on first use and after every :meth:`configure`."""
        memory = self._kept.get(kind)
        if memory is None:
            memory = self._kept[kind] = kind()
        return cast(_Kept, memory)


def unexported_mounts(view: View, limit: int) -> frozenset[str]:
    """The mountpoints that get no series of their own when the View holds more than ``limit`` mounts: the mounts an
    operator least needs to see go first. Kept first: stuck mounts, then those holding a run or important data,
    then those with I/O (a device's counters, NFS statistics or a probe), then writable ones, then the rest; in the
    mount table's order within each (so the same mounts keep their series from one View to the next)."""
    if len(view.mounts) <= limit:
        return frozenset()
    holding = {rv.mount.mount.mountpoint for rv in view.checkpoints if rv.mount is not None}
    holding.update(f.mountpoint for f in view.findings)
    holding.update(mp for mp, _kind in view.left_out.important_bytes)

    def rank(item: tuple[int, MountView]) -> tuple[bool, bool, bool, bool, int]:
        i, mv = item
        io = mv.io
        busy = io.counters is not None or io.nfs is not None or io.probe is not None
        return (not mv.stuck, mv.mount.mountpoint not in holding, not busy, mv.mount.readonly, i)

    ranked = sorted(enumerate(view.mounts), key=rank)
    return frozenset(mv.mount.mountpoint for _, mv in ranked[limit:])


Area = Callable[[View | None, ExportState], Iterable[Family]]
"""One area of the exporter: the families it writes for a View (None while the agent is starting: most areas write
nothing then)."""


@dataclass(frozen=True)
class RuleMetrics:
    firing: Mapping[str, int]
    """Entities it fires for now, by the severity each fires with (info, warning or critical): its one severity, 0
    included; every severity for a rule that takes each entity's own."""
    errors_total: int
    """Evaluations that gave no bool, since the agent started."""
    disabled: bool = False
    """The engine stopped evaluating it (over its time budget)."""


@dataclass(frozen=True)
class PolicyMetrics:
    rules: Mapping[str, RuleMetrics] = field(default_factory=dict)
    """By rule name: every rule of the policy in force."""
    last_reload_success: bool = True
    """The policy the agent started with counts as a success: it would not have started otherwise."""
    actions: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    """Actions run, by (rule, action, result): the action runner's counts."""


SYNC_COPY_RESULTS = ("verified", "failed", "superseded")
"""How a checkpoint copy ends: copied, read back and checked; failed (refused, an error, a source that changed, or
past its deadline: sync.deadline_seconds or its pod's time left); stopped for a newer checkpoint of the same run."""


@dataclass(frozen=True)
class SyncMetrics:
    """What the sync action's copies did (storwatch.actions.sync_jobs), for storwatch_sync_*."""

    bytes_total: int = 0
    """Bytes of the copies that completed, verified, since the agent started."""
    in_progress: int = 0
    """Copies queued or running now."""
    last_success: Mapping[str, float] = field(default_factory=dict)
    """By run label: when its last copy completed, verified (UNIX seconds)."""
    duration_buckets: tuple[tuple[float, int], ...] = ()
    """The completed copies' durations: (upper bound, cumulative count), ``inf`` last."""
    duration_sum: float = 0.0
    copies: Mapping[str, int] = field(default_factory=dict)
    """By result (:data:`SYNC_COPY_RESULTS`): the copies that ended since the agent started."""
