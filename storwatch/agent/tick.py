"""The tick: on the agent's own cadence, one Snapshot of every source's newest facts becomes one View, published.

Each tick keeps the Snapshot in History and feeds the latency windows and the stall tracker. Every ``view_seconds``
the tick also makes the View (a pure function of what it saw: analysis/build.py), settles the GPU time a checkpoint
scan can have explained, and publishes the View: to the scrape and page cache (``Publisher``), and to every
subscriber (the probe source's targets, next the policy engine). Views are made here only, whoever reads them and
however often: a node nobody scrapes pays for one View every ``view_seconds``, a node scraped every second the
same.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from storwatch.analysis.build import VerdictCache, build_view
from storwatch.analysis.io import WindowFeeder
from storwatch.analysis.latency import LatencyWindows
from storwatch.analysis.stall_feed import StallFeed
from storwatch.analysis.stall_share import StallShares
from storwatch.analysis.view import View
from storwatch.classify import Classifier
from storwatch.config import Config
from storwatch.exporter import Exporter
from storwatch.history import History
from storwatch.registry import SOURCES
from storwatch.snapshot import CORE_KEYS, Snapshot
from storwatch.sources.kubevolumes import KubeVolumeEvidence
from storwatch.vocabulary import Platform

log = logging.getLogger(__name__)

LIVENESS_INTERVALS = 3
"""/healthz fails once the ticker has not come round for this many of its intervals."""
CLOCK_STEP_SECONDS = 5.0
"""A wall clock that moved this much more (or less) than the monotonic clock between two ticks was stepped."""


class ClockWatch:
    """Notices the wall clock stepping (NTP, a person, a VM resumed) between ticks and logs each step once: ages and
    recovery points follow the wall clock, so a step moves them; intervals and deadlines use the monotonic clock."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def check(self, wall: float, monotonic: float) -> float | None:
        """The step since the last check, in seconds (positive: forward), when there was one; logged."""
        last, self._last = self._last, (wall, monotonic)
        if last is None:
            return None
        step = (wall - last[0]) - (monotonic - last[1])
        if abs(step) < CLOCK_STEP_SECONDS:
            return None
        log.warning(
            "the wall clock stepped %s by %.1f s; ages and recovery points now follow the new time",
            "forward" if step > 0 else "back",
            abs(step),
        )
        return step


class TickerLiveness:
    """Whether the ticker still comes round, for /healthz: when its last round ended and how long it then waited.

    Written by the ticker, read by the server's loop thread: one tuple, swapped whole, no lock. The ticker is stuck
    once its last round ended more than LIVENESS_INTERVALS intervals ago, the interval being the longer of the wait it
    began then and the one in force now: a quiet node ticks every ``quiet_seconds``, not every ``tick_seconds``, and
    the first tick of a node that leaves the quiet pace comes within the quiet wait it interrupts."""

    def __init__(self, now: float) -> None:
        self._last = (now, 0.0)

    def round_ended(self, now: float, wait: float) -> None:
        """The ticker ended a round (a tick, or a start-up round that waited for the sources) and now waits ``wait``
        seconds, or less when woken."""
        self._last = (now, wait)

    def problem(self, now: float, interval: float) -> str | None:
        """None while the ticker comes round; else why not, in words. ``interval``: the tick's interval now."""
        ended, wait = self._last
        longest = max(wait, interval)
        late = now - ended
        if late <= LIVENESS_INTERVALS * longest:
            return None
        return (
            f"the tick has not run for {late:.1f} s, more than {LIVENESS_INTERVALS} of its intervals "
            f"({longest:.1f} s each)"
        )


@dataclass(frozen=True)
class _Served:
    """The View of one tick and its exposition text, swapped whole, so a request never sees half an update."""

    view: View | None
    metrics: bytes | None
    """None until the first scrape after the View was published renders it."""


class Publisher:
    """The published View, its exposition rendered at most once, by the first scrape that asks, and the
    subscribers told of each View."""

    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter
        self.render_lock = threading.Lock()
        """Held while an exposition is rendered, so two scrapes asking at once render it once (and a reload does not
        reconfigure the exporter under a render)."""
        self._subscribers: list[Callable[[View], None]] = []
        self._served = _Served(None, exporter.render(None))

    def subscribe(self, consumer: Callable[[View], None]) -> None:
        """Call ``consumer`` with every View published, on the ticker thread (it must be quick; one that raises is
        logged and the others are still told)."""
        self._subscribers.append(consumer)

    def publish(self, view: View) -> None:
        self._served = _Served(view, None)
        for consumer in list(self._subscribers):
            try:
                consumer(view)
            except Exception:
                log.exception("a consumer of the View failed; the others are still told")

    @property
    def view(self) -> View | None:
        return self._served.view

    def metrics(self) -> bytes:
        served = self._served
        if served.metrics is None:
            with self.render_lock:
                served = self._served
                if served.metrics is None:
                    served = self._served = dataclasses.replace(served, metrics=self.exporter.render(served.view))
        assert served.metrics is not None
        return served.metrics

    def cached_metrics(self) -> bytes | None:
        return self._served.metrics


class ViewMaker:
    """What a tick keeps from one tick to the next (History, the latency windows, the stall tracker, the Kubernetes
    evidence, the verdicts of unchanged mounts), and the making of each tick's View."""

    def __init__(self, config: Config, stalls: StallFeed, kube_evidence: KubeVolumeEvidence) -> None:
        self.history = History(config.history_size)
        self.windows = LatencyWindows()
        self.feeder = WindowFeeder(self.windows)
        self.stalls = stalls
        self.shares = StallShares()
        self.kube_evidence = kube_evidence
        self.verdicts = VerdictCache()
        self.clock_watch = ClockWatch()
        self.history_keys = (*CORE_KEYS, *(spec.facts for spec in SOURCES if spec.facts not in CORE_KEYS))

    def observe(self, snap: Snapshot, monotonic: float) -> None:
        """Every tick: keep the Snapshot and feed what follows the node second by second."""
        self.clock_watch.check(snap.timestamp, monotonic)
        self.history.append(snap.for_history(self.history_keys))
        self.stalls.observe(snap.gpus, self.feeder.feed(snap, self.stalls.watched))
        self.feeder.forget(snap)  # the windows of unmounted pod volumes, which would otherwise stay for ever
        if snap.mounts:  # a table not read says nothing about what is gone
            self.stalls.forget(snap.timestamp, (m.mountpoint for m in snap.mounts))
        if snap.kube is not None:
            self.kube_evidence.update(snap.kube)

    def make(self, snap: Snapshot, ready: bool, classifier: Classifier, platform: Platform, config: Config) -> View:
        """The View of an observed Snapshot, with the GPU time settled up to it."""
        view = build_view(
            snap,
            classifier,
            platform,
            ready=ready,
            windows=self.windows,
            paths=config.host_paths(),
            verdicts=self.verdicts,
            mtbf_seconds=config.checkpoints.mtbf_seconds,
            findings=config.findings,
        )
        stalls, timeline = self.stalls.update(
            snap.timestamp, view.checkpoints, view.mounts, snap.gpus, view.pods, view.access
        )
        gpus = (str(g.index) for g in snap.gpus.gpus) if snap.gpus is not None else ()
        shares = self.shares.observe(snap.timestamp, stalls.totals, gpus)
        return dataclasses.replace(view, stalls=dataclasses.replace(stalls, share_10m=shares), timeline=timeline)
