"""The alerts Alertmanager posted to this node, kept for the policy engine's ``on: alert`` rules: one per fingerprint,
a repeat post of the same alert (same fingerprint and ``startsAt``) updating it, a resolved one kept a short while so
rules see the resolution, and at most ``max_alerts`` of them.

An alert that fires again after it resolved keeps its fingerprint and gets a later ``startsAt``: it replaces the one
held. An earlier ``startsAt`` is either Alertmanager merging a re-sent alert into the active one (it keeps the
earliest start: a client that re-sends with its start rounded moves it back) or a late post of an earlier firing
that ended before the held one began; only the latter is dropped.

The receiver (``storwatch.web.alertmanager``) adds on the HTTP server's workers; the policy engine reads
:meth:`AlertBook.current` on its own worker. Both go through one lock, held only for dictionary work.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from storwatch.actions.base import Alert

DEFAULT_MAX_ALERTS = 512
DEFAULT_RESOLVED_KEEP_SECONDS = 300.0


@dataclass(frozen=True)
class AddResult:
    """What one :meth:`AlertBook.add` did with the alerts it was given."""

    stored: int = 0
    """Alerts the book did not hold (a new fingerprint, or a fingerprint that fired again with a later startsAt)."""
    updated: int = 0
    """Repeat posts of an alert it holds (same fingerprint and startsAt, or an earlier startsAt while they overlap):
    its status, endsAt, annotations and startsAt taken."""
    stale: int = 0
    """Posts of an earlier firing of an alert the book holds, which ended before the held one started: dropped."""
    evicted: int = 0
    """Alerts dropped to stay within max_alerts (resolved ones first, then the one posted least recently)."""


class AlertBook:
    """Thread-safe. ``clock``: seconds since the epoch (alerts' times are wall-clock times, as Alertmanager's are)."""

    def __init__(
        self,
        max_alerts: int = DEFAULT_MAX_ALERTS,
        resolved_keep_seconds: float = DEFAULT_RESOLVED_KEEP_SECONDS,
        firing_ttl_seconds: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._lock = threading.Lock()
        self._alerts: OrderedDict[str, Alert] = OrderedDict()
        """By fingerprint, the one posted least recently first."""
        self._clock = clock
        self.evicted_total = 0
        self.expired_total = 0
        self.configure(max_alerts, resolved_keep_seconds, firing_ttl_seconds)

    def configure(self, max_alerts: int, resolved_keep_seconds: float, firing_ttl_seconds: float = 0.0) -> None:
        """New bounds (a reload): a book over the new ``max_alerts`` is trimmed at once.

        ``resolved_keep_seconds``: how long a resolved alert stays after it was posted resolved (or after its endsAt
        passed), so a rule sees it resolve before it goes. ``firing_ttl_seconds``: a firing alert not posted again
        for this long goes, as if its resolution was lost (0: firing alerts stay until resolved or evicted; set it
        above the route's ``repeat_interval``, at which Alertmanager posts firing alerts again)."""
        if max_alerts < 1:
            raise ValueError(f"max_alerts must be at least 1, got {max_alerts}")
        with self._lock:
            self.max_alerts = max_alerts
            self.resolved_keep_seconds = resolved_keep_seconds
            self.firing_ttl_seconds = firing_ttl_seconds
            self._evict(len(self._alerts) - max_alerts)

    def add(self, alerts: Iterable[Alert]) -> AddResult:
        """Take a post's alerts (already validated and filtered to this node), in the order Alertmanager sent them."""
        stored = updated = stale = evicted = 0
        with self._lock:
            now = self._clock()
            self._expire(now)
            for alert in alerts:
                held = self._alerts.get(alert.fingerprint)
                if held is None or alert.starts_at > held.starts_at:
                    if held is None:
                        evicted += self._evict(len(self._alerts) + 1 - self.max_alerts)
                    stored += 1
                elif alert.starts_at < held.starts_at and alert.ends_at is not None and alert.ends_at <= held.starts_at:
                    stale += 1  # a late post of an earlier firing of this alert: the book holds a newer one
                    continue
                else:
                    # The same alert again: what can change is its status, its end, its annotations (a template over
                    # a value) and its start (moved back only); the labels are what the fingerprint is made of.
                    alert = dataclasses.replace(
                        held,
                        status=alert.status,
                        starts_at=alert.starts_at,
                        ends_at=alert.ends_at,
                        annotations=alert.annotations,
                        received_at=alert.received_at,
                    )
                    updated += 1
                self._alerts[alert.fingerprint] = alert
                self._alerts.move_to_end(alert.fingerprint)
        return AddResult(stored, updated, stale, evicted)

    def current(self) -> tuple[Alert, ...]:
        """The alerts held now, by startsAt then fingerprint: firing ones, and resolved ones for
        ``resolved_keep_seconds`` after they resolved. A firing alert whose endsAt has passed reads as resolved (an
        alert posted straight to the receiver can carry one; Alertmanager sends firing alerts without)."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            alerts = [_as_of(alert, now) for alert in self._alerts.values()]
        return tuple(sorted(alerts, key=lambda a: (a.starts_at, a.fingerprint)))

    def __len__(self) -> int:
        with self._lock:
            return len(self._alerts)

    # -- under the lock

    def _expire(self, now: float) -> None:
        gone = [fp for fp, alert in self._alerts.items() if self._expired(alert, now)]
        for fp in gone:
            del self._alerts[fp]
        self.expired_total += len(gone)

    def _expired(self, alert: Alert, now: float) -> bool:
        resolved_at = _resolved_at(alert, now)
        if resolved_at is not None:
            return now >= resolved_at + self.resolved_keep_seconds
        return self.firing_ttl_seconds > 0 and now >= alert.received_at + self.firing_ttl_seconds

    def _evict(self, count: int) -> int:
        """Drop ``count`` alerts (when positive): resolved ones first, then the ones posted least recently."""
        if count <= 0:
            return 0
        now = self._clock()
        order = [fp for fp, a in self._alerts.items() if _resolved_at(a, now) is not None]
        order += [fp for fp, a in self._alerts.items() if _resolved_at(a, now) is None]
        for fp in order[:count]:
            del self._alerts[fp]
        dropped = min(count, len(order))
        self.evicted_total += dropped
        return dropped


def _resolved_at(alert: Alert, now: float) -> float | None:
    """When the alert resolved as far as the book is concerned (None while it fires): when it was posted resolved,
    or its endsAt once that has passed."""
    if alert.status == "resolved":
        return alert.received_at
    if alert.ends_at is not None and alert.ends_at <= now:
        return alert.ends_at
    return None


def _as_of(alert: Alert, now: float) -> Alert:
    if alert.status == "firing" and alert.ends_at is not None and alert.ends_at <= now:
        return dataclasses.replace(alert, status="resolved")
    return alert


__all__ = ["DEFAULT_MAX_ALERTS", "DEFAULT_RESOLVED_KEEP_SECONDS", "AddResult", "AlertBook"]
