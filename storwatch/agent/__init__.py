"""The agent, a composition root: it makes the parts and wires them; each part is a unit of its own.

- ``collectors.py``: every source on its own worker, on its own cadence, with its health recorded;
- ``tick.py``: on the agent's cadence, one Snapshot becomes one View, published to every consumer;
- ``reload.py``: reading a new configuration (applying it is here: it touches every part), on a thread of its own;
- ``signals.py``: the signals, noted by their handlers and acted on by the main thread, which waits on no other:
  SIGTERM stops the agent within STOP_SECONDS whatever another thread is doing.

What each source is and how it is made is in the registry (registry.py), not here.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from storwatch.actions.alertbook import AlertBook
from storwatch.actions.registry import registry
from storwatch.actions.sync_engine import SyncEngine
from storwatch.agent.collectors import Collectors, ScanAfterSaves, given
from storwatch.agent.policy import PolicyWorker
from storwatch.agent.reload import Reloader, ReloadError, read_new
from storwatch.agent.signals import SignalInbox
from storwatch.agent.tick import ClockWatch, Publisher, TickerLiveness, ViewMaker
from storwatch.analysis.latency import LatencyWindows
from storwatch.analysis.stall_feed import StallFeed, settle_seconds_for
from storwatch.analysis.stalls import StallParams
from storwatch.analysis.view import View
from storwatch.classify import Classifier, resolve_platform
from storwatch.config import Config, ConfigError, GPUConfig
from storwatch.exporter import AlertmanagerCounts, ConfigReloads, Exporter
from storwatch.history import History
from storwatch.kube.client import KubeClient
from storwatch.kube.events import KubeEvents
from storwatch.pace import CpuBudget, Pace
from storwatch.printable import Lines
from storwatch.registry import BY_NAME, SOURCES, SourceContext, SourceSpec, exporter_areas, shared_helper
from storwatch.snapshot import Snapshot
from storwatch.sources import FactsKey, Source
from storwatch.sources.gpu import GPUS, GPUFacts
from storwatch.sources.kubevolumes import KubeVolumeEvidence
from storwatch.threadname import name_this_thread
from storwatch.vocabulary import CollectorStatus, Platform
from storwatch.web import NotCached, StatusHTTPServer
from storwatch.web.alertmanager import PATH as ALERTMANAGER_PATH
from storwatch.web.alertmanager import AlertmanagerReceiver, ReceiverSettings, settings_from

__all__ = ["GPU_OFF_REASON", "KNOWN_COLLECTORS", "Agent", "ClockWatch", "SignalInbox"]

log = logging.getLogger(__name__)

ConfigTransform = Callable[[Config], Config]
STARTUP_GRACE_SECONDS = 5.0
"""How long the first View waits for every source's first report before going out without the slow ones."""
KNOWN_COLLECTORS = tuple(spec.name for spec in SOURCES)
"""Every collector the agent knows (the registry's sources): each is reported (``storwatch_collector_enabled``),
running or off."""
GPU_OFF_REASON = BY_NAME["gpu"].off_reason(GPUConfig(enabled=False))
"""Why the GPU and process collectors are off when ``gpu.enabled`` is false."""
PACED_SOURCES = tuple(spec.name for spec in SOURCES if spec.paced)
"""The sources whose workers wait by the agent's pace (woken when a quiet node gets work)."""
STOP_SECONDS = 3.0
"""The longest stop() takes: the parts close on threads of their own and the agent's threads are joined, all against
this one deadline, and what has not ended by then is left behind (every thread is a daemon). So SIGTERM ends the
agent within 5 s whatever a thread is doing: a source's close waiting out a stuck NVML call, a reload that blocks."""
SIGNAL_WAIT_SECONDS = 5.0
"""The main thread's longest wait between two looks at the flags the signal handlers set: a signal ends the wait at
once (the wakeup fd); this bounds the case SignalInbox.wait describes, a handler run only after the wait's return."""


class Agent:
    def __init__(
        self,
        config: Config,
        config_path: str | None = None,
        flags: ConfigTransform = lambda c: c,
        clock: Callable[[], float] = time.time,
        sources: list[Source[Any]] | None = None,
        process_metrics: bool = True,
        server: StatusHTTPServer | None = None,
    ) -> None:
        """``server``: one already bound (``storwatch agent`` binds its port before anything else starts, so a busy
        port is one clear error); without it ``start`` binds ``config.listen``."""
        self.config_path = config_path
        self.flags = flags
        self.clock = clock
        self.config = config
        self.platform = resolve_platform(config.platform, config.host_paths())
        # The Kubernetes volume behind a mount is the strongest evidence after an override.
        self._kube_evidence = KubeVolumeEvidence()
        self.classifier = self._classifier(self.platform.name, config)
        self.reloads = ConfigReloads()
        am = config.alertmanager
        self.alerts = AlertBook(am.max_alerts, am.resolved_keep_seconds, am.firing_ttl_seconds, clock=clock)
        """The alerts Alertmanager posted for this node (POST /api/v1/alertmanager): what ``on: alert`` rules read."""
        counts = AlertmanagerCounts()
        try:
            receiver = settings_from(config)  # reads the token file: one that cannot be read stops the start
        except ConfigError as err:
            raise ConfigError(f"{config_path}: {err}" if config_path else str(err)) from None
        self.alertmanager = AlertmanagerReceiver(self.alerts, counts, receiver, clock=clock)
        self.exporter = Exporter(
            exporter_areas(),
            process_metrics=process_metrics,
            nfs_operations=config.nfs.operations,
            max_mount_series=config.mounts.max_series,
            reloads=self.reloads,
            alertmanager=counts,
        )
        self._settling = self._stall_params(config)
        self.stalls = StallFeed(self._settling)
        self._views = ViewMaker(config, self.stalls, self._kube_evidence)
        self._published = Publisher(self.exporter)
        self._stop = threading.Event()
        self._dirty = threading.Event()
        """Set to tick now rather than at the next tick_seconds: start-up, reload, stop."""
        self._view_now = threading.Event()
        """Set to make a View at the next tick whenever it falls (a reload's new configuration shows at once)."""
        self._last_view: float | None = None
        """time.monotonic() of the last View made."""
        self._liveness = TickerLiveness(time.monotonic())
        """Whether the ticker still comes round (/healthz)."""
        self._reloader = Reloader(self.reload)
        """Runs the reloads SIGHUP asks for, off the main thread."""
        self.pace = Pace(
            config.quiet_seconds,
            config.quiet_after_seconds,
            tick_seconds=config.tick_seconds,
            budget=CpuBudget(config.tick_cpu_share, config.tick_max_seconds),
        )
        """Full pace while GPUs work, the quiet pace on a node without a GPU process (storwatch/pace.py)."""
        self.view_budget = CpuBudget(config.view_cpu_share, config.view_max_seconds)
        """The interval between Views, stretched where one costs much (storwatch/pace.py)."""
        self._view_kube: tuple[object, object] | None = None
        """The Kubernetes objects (pods and the rest, this Node) the last View was made with."""
        self._was_quiet = False
        context = SourceContext(
            config.host_paths(),
            clock,
            self.latest,
            self.subscribe,
            self.pace,
            classifier=lambda: self.classifier,
            helper=shared_helper(),
        )
        states = Collectors.made(lambda spec: spec.section_of(config), context) if sources is None else []
        self._collectors = Collectors(
            states if sources is None else [given(s) for s in sources], context, clock, self._stop, self._reported
        )
        self._saves_scan = ScanAfterSaves(self._collectors)
        self._threads: list[threading.Thread] = []
        # A verified copy makes its run safe: the durable copies are looked at again at once (sources/copies.py).
        self.sync = SyncEngine(
            config.sync, config.host_paths(), clock, copied=lambda job: self._collectors.collect_soon("copies")
        )
        """The sync action's copies: the allowlisted roots and the copy worker (started by the first copy)."""
        self.policy = self._policy_worker(config)
        self.exporter.state.policy = self.policy.metrics
        self.exporter.state.sync = self.policy.sync_metrics
        self.exporter.state.tick_interval = self._tick_interval
        self.exporter.state.view_interval = self._view_interval
        self.subscribe(self.policy.offer)
        self.server = server
        log.info("platform %s (%s)", self.platform.name, self.platform.detected_by)

    def _policy_worker(self, config: Config) -> PolicyWorker:
        """The policy engine and its actions, the Events posted through the Kubernetes source's connection."""
        kube = self._collectors.source("kube")
        client: KubeClient | None = getattr(kube, "client", None)
        events = KubeEvents(client, clock=self.clock) if client is not None and client.enabled else None
        node = (client.node_name if client is not None else "") or os.environ.get("NODE_NAME") or socket.gethostname()
        actions = registry(
            events=events,
            node_name=node,
            paths=config.host_paths(),
            sync=(self.sync.resolver, self.sync.jobs),
            # The sync action waiting for a checkpoint it asked for looks again now, not at the scan's interval.
            rescan=lambda: self._collectors.collect_soon("checkpoints"),
            clock=self.clock,
        )
        worker = PolicyWorker(config.policy, actions, self.alerts, self.clock, self._stop)
        worker.load(config.policy)
        return worker

    def _classifier(self, platform: str, config: Config) -> Classifier:
        classifier = Classifier(platform, config.overrides())
        classifier.add_provider(self._kube_evidence)
        return classifier

    @staticmethod
    def _stall_params(config: Config, scan_interval: float | None = None) -> StallParams:
        interval = config.checkpoints.interval_seconds if scan_interval is None else scan_interval
        return StallParams(settle_seconds=settle_seconds_for(interval, config.tick_seconds))

    def _settle_after_scans(self, config: Config) -> None:
        """GPU time is attributed once the checkpoint scan that times the writes in it has come: the settling waits
        for the scans' interval as paced now (``checkpoints.scan_cpu_share`` stretches it where scans cost more), not
        as configured. Else a save that ended between two scans further apart than that is settled before its write
        is known, and its GPU time is never charged to it."""
        interval = getattr(self._collectors.source("checkpoints"), "interval_seconds", None)
        if not isinstance(interval, (int, float)) or not math.isfinite(interval) or interval <= 0:
            interval = None
        params = self._stall_params(config, interval)
        if params != self._settling:
            self._settling = params
            self.stalls.configure(params)

    def _reported(self) -> None:
        self._saves_scan.reported()
        if self._published.view is None:
            self._dirty.set()  # until the first tick, every first report may complete it
        elif self.pace.quiet and _gpu_busy(self._collectors.latest(GPUS)):
            self._pace_work()  # a GPU process on a quiet node: full pace now, not at the next quiet tick

    def _pace_work(self) -> None:
        """A sign of work: full pace from now; when the node was quiet, the ticker and the paced sources wake."""
        if self.pace.work():
            self._dirty.set()
            for name in PACED_SOURCES:
                self._collectors.collect_soon(name)

    # -- the parts, for tools and tests

    @property
    def history(self) -> History:
        return self._views.history

    @property
    def windows(self) -> LatencyWindows:
        return self._views.windows

    def latest(self, key: FactsKey[Any] | str) -> Any:
        """A running source's newest facts, by its FactsKey or collector name (None before it reports)."""
        return self._collectors.latest(key)

    # -- what consumers read

    def subscribe(self, consumer: Callable[[View], None]) -> None:
        """Call ``consumer`` with every View the tick publishes, on the ticker thread (it must be quick)."""
        self._published.subscribe(consumer)

    def current_view(self) -> View | None:
        """The View the last tick published (None before the first tick); never makes one."""
        return self._published.view

    def metrics(self) -> bytes:
        """The exposition text of the current View, rendered at most once per View, by the first scrape that asks."""
        return self._published.metrics()

    def cached_view(self) -> View | NotCached | None:
        """The current View (None before the first tick): Views are made by the tick, so this never waits."""
        return self._published.view

    def cached_metrics(self) -> bytes | None:
        """The current exposition if it is already rendered, else None; never renders it."""
        return self._published.cached_metrics()

    # -- collectors

    def collector_statuses(self) -> tuple[CollectorStatus, ...]:
        """Every known collector's status: each running source's last report, and an off status for each known
        collector the agent does not run."""
        return self._with_absent(self._collectors.statuses())

    def _with_absent(self, running: tuple[CollectorStatus, ...]) -> tuple[CollectorStatus, ...]:
        names = {st.source.name for st in self._collectors.states}
        absent = tuple(
            CollectorStatus(spec.name, False, 0.0, None, off_reason=self._absent_reason(spec))
            for spec in SOURCES
            if spec.name not in names
        )
        return running + absent

    def _absent_reason(self, spec: SourceSpec[Any, Any]) -> str:
        off = spec.off_reason(spec.section_of(self.config))
        if off is not None:
            return off
        if spec.switch is None:
            return "not started by this agent"
        # Sources are made at start: a reload that turns one on finds none to resume.
        return f"{spec.section}.{spec.switch} was false when the agent started; turning it on takes a restart"

    def snapshot(self) -> Snapshot:
        return self._snapshot()[0]

    def _snapshot(self) -> tuple[Snapshot, bool]:
        """Every running source's newest facts and every collector's status, taken together; and whether every
        running source has reported."""
        statuses, facts, ready = self._collectors.facts()
        return Snapshot(self.clock(), collectors=self._with_absent(statuses), facts=facts), ready

    def collect_now(self) -> None:
        """Run every running source once, on this thread (tools and tests that drive the agent tick by tick)."""
        self._collectors.collect_now()

    # -- the tick

    def advance(self) -> View:
        """One tick that makes its View: one Snapshot, observed, a View made of it (tick.py), published."""
        view = self._tick(make_view=True)
        assert view is not None
        return view

    def _tick(self, make_view: bool) -> View | None:
        started = time.thread_time()
        snap, ready = self._snapshot()
        self._views.observe(snap, time.monotonic())
        self.pace.spent("tick", time.thread_time() - started, self.config.tick_seconds)  # the second's work
        if _gpu_busy(snap.gpus):
            self._pace_work()
        self._log_pace()
        # The Kubernetes source keeps its objects while no watch event changed them: new ones (a pod deleted, the
        # node drained) make a View now, so the policy does not wait for a stretched interval.
        kube = None if snap.kube is None else (snap.kube.cluster, snap.kube.node)
        last = self._view_kube
        if kube is not None and last is not None and (kube[0] is not last[0] or kube[1] is not last[1]):
            make_view = True
        if not make_view:
            return None
        with self._collectors.lock:
            classifier, platform, config = self.classifier, self.platform, self.config
        started = time.thread_time()
        self._settle_after_scans(config)
        view = self._views.make(snap, ready, classifier, platform, config)
        # The View's cost: making it here, and the policy's judging of the last one (on its thread). Counted before
        # it is published, so its scrape shows the interval it leads to.
        self.view_budget.spent(time.thread_time() - started + self.policy.last_cpu_seconds)
        self._published.publish(view)
        self._last_view = time.monotonic()
        self._view_kube = kube
        return view

    def _tick_interval(self) -> float:
        """Seconds between ticks now: tick_seconds, stretched by the second's work's cost, or the quiet pace's."""
        return self.pace.stretch(self.config.tick_seconds)

    def liveness(self) -> str | None:
        """Why the agent is not alive (/healthz answers 503 with it): the tick has not run for LIVENESS_INTERVALS of
        its intervals; None while it comes round. Never waits: /healthz is answered on the server's loop thread."""
        return self._liveness.problem(time.monotonic(), self._tick_interval())

    def _view_interval(self) -> float:
        """Seconds between Views now: view_seconds, stretched by the View's cost, or the quiet pace's."""
        return self.pace.stretch(self.view_budget.interval(self.config.view_seconds))

    def _log_pace(self) -> None:
        quiet = self.pace.quiet
        if quiet != self._was_quiet:
            self._was_quiet = quiet
            if quiet:
                log.info(
                    "quiet: no GPU process for %.0f s; ticking, and reading %s, every %.0f s",
                    self.pace.quiet_after_seconds,
                    ", ".join(PACED_SOURCES),
                    self.pace.stretch(self.config.tick_seconds),
                )
            else:
                log.info("full pace again (a GPU process or a reload): ticking every %.1f s", self.config.tick_seconds)

    def _run_ticker(self) -> None:
        name_this_thread()
        started = time.monotonic()
        frozen = False
        while not self._stop.is_set():
            wait = self._tick_interval()
            self._liveness.round_ended(time.monotonic(), wait)
            self._dirty.wait(wait)
            self._dirty.clear()
            if self._stop.is_set():
                break
            if not self._collectors.all_reported() and time.monotonic() - started < STARTUP_GRACE_SECONDS:
                continue  # a first View with every source in it, unless one of them is slow to start
            # A View every view_seconds, or as the View's budget stretches it (the first at once, and after a reload
            # or a stop request).
            due = self._last_view is None or time.monotonic() - self._last_view >= self._view_interval() - 0.01
            try:
                self._tick(make_view=due or self._view_now.is_set())
                self._view_now.clear()
            except Exception:
                log.exception("tick failed; serving the previous view")
            if not frozen:
                # What start-up made (modules, parsers' tables, the first facts) lives as long as the agent: keep
                # it out of every later garbage collection pass.
                gc.freeze()
                frozen = True

    # -- lifecycle

    def start(self, serve: bool = True) -> None:
        """Serve (binding the port first, when no bound server was given), then start the sources and the ticker."""
        if serve:
            if self.server is None:
                self.server = StatusHTTPServer(self.config.listen, tls=self.config.tls)
            server = self.server
            server.view, server.metrics = self.current_view, self.metrics
            server.cached_view, server.cached_metrics = self.cached_view, self.cached_metrics
            server.post_handlers[ALERTMANAGER_PATH] = self.alertmanager
            server.status_extras = lambda: {**self.alertmanager.status_extras(), "policy": self.policy.status()}
            server.liveness = self.liveness
            server.start()
            log.info("serving on %s (port %d)", self.config.listen, server.port)
            if self.alertmanager.settings.enabled:
                log.info("%s", self.alertmanager.describe())
        self._threads.extend(self._collectors.start())
        self._threads.append(self.policy.start())
        self._liveness.round_ended(time.monotonic(), self._tick_interval())
        t = threading.Thread(target=self._run_ticker, name="ticker", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        """Stop serving, close the sources (NVML shut down) and the policy, and end the threads, within STOP_SECONDS:
        each part closes on a thread of its own, so one that blocks (a source's close waiting out a stuck call) holds
        neither the others nor the caller past the deadline; what is still running then is named and left."""
        deadline = time.monotonic() + STOP_SECONDS
        self._stop.set()
        self._reloader.close()
        self._collectors.wake()
        self._dirty.set()
        parts = (("http", self._close_server), ("sources", self._collectors.close), ("policy", self.policy.close))
        closing = [threading.Thread(target=close, name=f"stopping-{name}", daemon=True) for name, close in parts]
        for t in closing:
            t.start()
        for t in (*closing, *self._threads):
            t.join(max(0.0, deadline - time.monotonic()))
        left = [t.name for t in (*closing, *self._threads) if t.is_alive()]
        if self._reloader.running_for() is not None:
            left.append("reload")
        if left:
            log.warning("stopping without waiting any longer for: %s", ", ".join(left))

    def _close_server(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    # -- reload

    def apply_config(self, new: Config) -> None:
        """Put ``new`` in force as a reload would (validated already; ``listen``, ``tls`` and ``paths`` stay)."""
        platform = resolve_platform(new.platform, new.host_paths())
        self._apply(new, platform, self._classifier(platform.name, new), settings_from(new))

    def reload(self) -> bool:
        """Re-read the configuration file and apply it. On any problem, reading, checking or applying it, the last
        good configuration stays in force, the error is logged as ``FILE:LINE: FIELD: message`` (``FILE: message``
        where no line applies) and counted (storwatch_config_reload_errors_total)."""
        path = self.config_path
        if path is None:
            log.info("SIGHUP: no configuration file to reload")
            return False
        try:
            new, platform = read_new(path, self.flags, self.config)
            classifier = self._classifier(platform.name, new)
            receiver = settings_from(new)  # reads the token file: one that is gone fails the reload
        except ReloadError as err:
            return self._reload_failed(str(err))
        except ConfigError as err:
            return self._reload_failed(f"{path}: {err}")
        old = (self.config, self.platform, self.classifier, self.alertmanager.settings)
        try:
            self._apply(new, platform, classifier, receiver)
        except Exception as err:
            log.debug("reload: applying %s", path, exc_info=True)
            try:
                self._apply(*old)
            except Exception:
                log.exception("reload: putting the last good configuration back failed")
            return self._reload_failed(f"{path}: cannot apply: {type(err).__name__}: {err}")
        self.reloads.succeeded()
        self.policy.load(new.policy)  # a bad policy keeps the last good one (storwatch_policy_last_reload_success)
        self._view_now.set()
        self._dirty.set()
        log.info("configuration reloaded from %s", path)
        return True

    def _apply(self, new: Config, platform: Platform, classifier: Classifier, receiver: ReceiverSettings) -> None:
        with self._collectors.lock:
            self.config = new
            self.platform, self.classifier = platform, classifier
            am = new.alertmanager
            self.alerts.configure(am.max_alerts, am.resolved_keep_seconds, am.firing_ttl_seconds)
            self.alertmanager.configure(receiver)
            self._views.history.resize(new.history_size)
            self._settle_after_scans(new)
            self._collectors.reconfigure(lambda spec: spec.section_of(new))
            self.sync.configure(new.sync)
            was_quiet = self.pace.quiet
            # a reload is work: full pace first
            self.pace.configure(new.quiet_seconds, new.quiet_after_seconds, new.tick_seconds)
            self.pace.budget.configure(new.tick_cpu_share, new.tick_max_seconds)
            self.view_budget.configure(new.view_cpu_share, new.view_max_seconds)
        # Once the lock is released: collect_soon takes it, and it is not reentrant (on a quiet node the reload waited
        # on itself for ever, and the ticker on the reload).
        for name in PACED_SOURCES if was_quiet else ():
            self._collectors.collect_soon(name)
        with self._published.render_lock:  # not while a render is using the old set
            self.exporter.configure(new.nfs.operations, new.mounts.max_series)

    def _reload_failed(self, message: str) -> bool:
        self.reloads.failed()
        log.error("reload failed, keeping the last good configuration:\n%s", Lines(message))  # one error a line
        self._view_now.set()
        self._dirty.set()  # a tick, so the next scrape shows the count
        return False

    # -- signals

    def run_until_signalled(self, exiting: bool = False) -> None:
        """Serve until SIGTERM or SIGINT; SIGHUP reloads, on a thread of its own (a reload that blocks never holds
        SIGTERM back). Must be called from the main thread.

        ``exiting``: the process exits once this returns (``storwatch agent``). The three signals are then ignored
        from the moment the agent stops rather than given back to what was there before: a second SIGTERM
        (``timeout`` sends one to the process and one to its group) would otherwise meet the default action, which
        Python also restores as it shuts down, and kill a process that was exiting cleanly."""
        inbox = SignalInbox()
        try:
            self.start()
            while not inbox.stop_signal:
                # A signal wakes this wait (the wakeup fd), so its timeout is only a backstop: a longer one is
                # fewer idle wake-ups, not a slower stop or reload.
                inbox.wait(SIGNAL_WAIT_SECONDS)
                if inbox.hup and not inbox.stop_signal:
                    inbox.hup = False  # a SIGHUP from here on asks for one more reload, after this one
                    running = self._reloader.running_for()
                    if running is None:
                        log.info("received SIGHUP, reloading the configuration")
                    else:
                        log.warning(
                            "received SIGHUP while a reload has run for %.0f s; reloading again once it ends", running
                        )
                    self._reloader.ask()  # on the reload thread: this one stays free for SIGTERM
            log.info("received %s, stopping", signal.Signals(inbox.stop_signal).name)
        finally:
            if exiting:
                inbox.ignore_all()
            self.stop()
            inbox.close()


def _gpu_busy(facts: GPUFacts | None) -> bool:
    """Whether NVML names a process on any GPU (what keeps the agent at full pace)."""
    return facts is not None and any(g.processes for g in facts.gpus)
