"""The agent: sources on their own cadences in their own workers, a tick that makes and publishes the View, and the
server.

Signals: SIGTERM/SIGINT stop it (within a couple of seconds whatever the mounts do: nothing here waits on one);
SIGHUP reloads the configuration file and keeps the last good one when the new one is invalid or cannot be applied.
The handlers only note a signal; the main thread acts on it (see SignalInbox).

What each source is and how it is made is in the registry (registry.py), not here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from storwatch.analysis.build import VerdictCache, build_view
from storwatch.analysis.io import WindowFeeder
from storwatch.analysis.latency import LatencyWindows
from storwatch.analysis.stall_feed import StallFeed, settle_seconds_for
from storwatch.analysis.stalls import StallParams
from storwatch.analysis.view import View
from storwatch.classify import Classifier, resolve_platform
from storwatch.config import Config, ConfigError, GPUConfig
from storwatch.exporter import ConfigReloads, Exporter
from storwatch.history import History
from storwatch.printable import Lines
from storwatch.registry import BY_NAME, SOURCES, SourceContext, SourceSpec, exporter_areas, load_config
from storwatch.snapshot import CORE_KEYS, Snapshot
from storwatch.sources import FactsKey, Source
from storwatch.sources.access import ACCESS
from storwatch.sources.kubevolumes import KubeVolumeEvidence
from storwatch.vocabulary import CollectorStatus, Platform
from storwatch.web import NotCached, StatusHTTPServer

log = logging.getLogger(__name__)

ConfigTransform = Callable[[Config], Config]
# How long the first View waits for every source's first report before going out without the slow ones.
STARTUP_GRACE_SECONDS = 5.0
KNOWN_COLLECTORS = tuple(spec.name for spec in SOURCES)
"""Every collector the agent knows (the registry's sources): each is reported (``storwatch_collector_enabled``),
running or off."""
FALLBACK_INTERVAL_SECONDS = 10.0
"""How often a worker runs its source when the source's interval_seconds cannot be waited (NaN, infinite, not above
0; the config refuses these, a source may still hold one), and after an error of the worker loop itself."""
STALLED_MIN_SECONDS = 300.0
STALLED_INTERVALS = 10
"""A collect() in flight longer than the larger of STALLED_MIN_SECONDS and STALLED_INTERVALS intervals is reported
as a failure: sources keep their own deadlines, so only a bug or a hang they did not foresee gets there."""
GPU_OFF_REASON = BY_NAME["gpu"].off_reason(GPUConfig(enabled=False))
"""Why the GPU and process collectors are off when ``gpu.enabled`` is false."""
# How long stop() waits for the agent's threads, all together (each sleeps on the stop event, so they end at once
# unless one is inside a collect(), which no hung mount can hold: those calls run in the helper process).
STOP_JOIN_SECONDS = 2.0


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


@dataclass(frozen=True)
class _Served:
    """The View of one tick and its exposition text, swapped whole, so a request never sees half an update."""

    view: View | None
    metrics: bytes | None
    """None until the first scrape after the View was published renders it."""


@dataclass
class _SourceState:
    source: Source[Any]
    key: FactsKey[Any]
    """Where its facts go in the Snapshot."""
    spec: SourceSpec[Any, Any] | None = None
    """Its declaration in the registry (None for a source given to the Agent directly, as tests do)."""
    facts: Any = None
    status: CollectorStatus | None = None
    last_error: str | None = None
    last_success: float | None = None
    off_reason: str | None = None
    collecting_since: float | None = None
    """time.monotonic() when the collect() in flight started; None between collections."""
    paused: bool = False
    """Switched off by a reload (gpu.enabled: false releases the NVIDIA driver); its worker idles."""


def _given(source: Source[Any]) -> _SourceState:
    """A source handed to the Agent directly (tests, tools): it files its facts where the registry's source of its
    name would, and is configured on reload like it."""
    spec = BY_NAME.get(source.name)
    return _SourceState(source, spec.facts if spec is not None else FactsKey(source.name), spec)


def _describe(err: BaseException) -> str:
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _usable_interval(value: object) -> tuple[float, str | None]:
    """The seconds a worker can wait between two collections, and why not the source's own value when it cannot."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        seconds = math.nan
    if math.isfinite(seconds) and seconds > 0:
        return min(seconds, threading.TIMEOUT_MAX), None
    return FALLBACK_INTERVAL_SECONDS, (
        f"interval_seconds {value!r} is not a finite number of seconds above 0; "
        f"collecting every {FALLBACK_INTERVAL_SECONDS:g} s instead"
    )


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
        self._clock_watch = ClockWatch()
        self.config = config
        self.platform = resolve_platform(config.platform, config.host_paths())
        # The Kubernetes volume behind a mount is the strongest evidence after an override.
        self._kube_evidence = KubeVolumeEvidence()
        self.classifier = self._classifier(self.platform.name, config)
        self.history = History(config.history_size)
        self.reloads = ConfigReloads()
        self.exporter = Exporter(
            exporter_areas(),
            process_metrics=process_metrics,
            nfs_operations=config.nfs.operations,
            reloads=self.reloads,
        )
        self.windows = LatencyWindows()
        self._feeder = WindowFeeder(self.windows)
        self.stalls = StallFeed(self._stall_params(config))
        self._verdicts = VerdictCache()
        self._history_keys = (*CORE_KEYS, *(spec.facts for spec in SOURCES if spec.facts not in CORE_KEYS))
        self._subscribers: list[Callable[[View], None]] = []
        """Told of each View as the tick publishes it (besides the scrape and page cache)."""
        self._context = SourceContext(config.host_paths(), clock, self.latest, self.subscribe)
        """What the registry's factories are given (another source's facts, read when a source asks; Views, pushed to
        whoever subscribes)."""
        self._sources = self._made_sources(config) if sources is None else [_given(s) for s in sources]
        self._lock = threading.Lock()
        self._render_lock = threading.Lock()
        """Held while the exposition of a View is rendered, so two scrapes asking at once render it once."""
        self._stop = threading.Event()
        self._dirty = threading.Event()
        """Set to tick now rather than at the next tick_seconds: start-up, reload, stop."""
        self._served = _Served(None, self.exporter.render(None))
        self._threads: list[threading.Thread] = []
        self.server = server
        log.info("platform %s (%s)", self.platform.name, self.platform.detected_by)

    def _classifier(self, platform: str, config: Config) -> Classifier:
        classifier = Classifier(platform, config.overrides())
        classifier.add_provider(self._kube_evidence)
        return classifier

    @staticmethod
    def _stall_params(config: Config) -> StallParams:
        return StallParams(settle_seconds=settle_seconds_for(config.checkpoints.interval_seconds, config.tick_seconds))

    def _made_sources(self, config: Config) -> list[_SourceState]:
        """Every source the registry declares that its section leaves on; the others are reported off."""
        made = []
        for spec in SOURCES:
            section = spec.section_of(config)
            if spec.off_reason(section) is None:
                made.append(_SourceState(spec.make(self._context, section), spec.facts, spec))
        return made

    def latest(self, key: FactsKey[Any] | str) -> Any:
        """A running source's newest facts, by its FactsKey or collector name (None before it reports)."""
        with self._lock:
            for st in self._sources:
                if st.key is key or st.source.name == key:
                    return st.facts
        return None

    # -- what consumers read

    def subscribe(self, consumer: Callable[[View], None]) -> None:
        """Call ``consumer`` with every View the tick publishes, on the ticker thread (it must be quick; one that
        raises is logged and the others are still told)."""
        self._subscribers.append(consumer)

    def current_view(self) -> View | None:
        """The View the last tick published (None before the first tick); never makes one."""
        return self._served.view

    def metrics(self) -> bytes:
        """The exposition text of the current View, rendered at most once per View, by the first scrape that asks."""
        served = self._served
        if served.metrics is None:
            with self._render_lock:
                served = self._served
                if served.metrics is None:
                    served = self._served = dataclasses.replace(served, metrics=self.exporter.render(served.view))
        assert served.metrics is not None
        return served.metrics

    def cached_view(self) -> View | NotCached | None:
        """The current View (None before the first tick): Views are made by the tick, so this never waits."""
        return self._served.view

    def cached_metrics(self) -> bytes | None:
        """The current exposition if it is already rendered, else None; never renders it."""
        return self._served.metrics

    # -- workers

    def _run_source(self, st: _SourceState) -> None:
        """One source's worker: collect, record how it went, wait the source's interval, until the agent stops.
        Whatever the source or this loop raises (BaseException included: a SystemExit would end a thread silently)
        becomes that collector's failure and the loop goes on, so a worker never ends while its collector still
        shows its last success."""
        try:
            while not self._stop.is_set():
                try:
                    wait = self._collect_once(st)
                except BaseException as err:
                    wait = FALLBACK_INTERVAL_SECONDS
                    self._record(st, st.source.name, f"worker error: {_describe(err)}", 0.0, None, None)
                self._stop.wait(wait)
        finally:
            if not self._stop.is_set():  # only a failing Event could get here; say so rather than go quiet
                self._record(st, st.source.name, "worker stopped", 0.0, None, None)

    def _collect_once(self, st: _SourceState) -> float:
        """Run the source once and record its status; the seconds to wait before the next run."""
        if st.paused:
            if st.status is None or st.status.off_reason is None:
                self._record(st, st.source.name, None, 0.0, st.off_reason or "switched off by a reload", None)
            return 1.0
        src = st.source  # a reload may have replaced it
        interval, interval_error = _usable_interval(getattr(src, "interval_seconds", None))
        started = time.monotonic()
        st.collecting_since = started
        error: str | None = None
        facts: Any = None
        try:
            facts = src.collect()
            # A source may answer and still have failed (a stuck NVML call): its facts say so and are kept.
            failure = getattr(facts, "failure", None)
            error = None if failure is None else str(failure)
        except BaseException as err:  # a failing source reports itself and the agent goes on
            error = _describe(err)
        finally:
            st.collecting_since = None
        duration = time.monotonic() - started
        try:
            off = getattr(src, "off_reason", None)
            parse_errors = getattr(src, "parse_errors", None)
        except Exception as err:
            off, parse_errors = None, None
            error = f"{error}; {_describe(err)}" if error else _describe(err)
        if interval_error is not None:
            error = f"{error}; {interval_error}" if error else interval_error
        with self._lock:
            # A reload may have paused or replaced the source while it collected (gpu.enabled: false shuts NVML
            # down and drops its facts): what this collection saw is then stale, and must not come back.
            current = st.source is src and not st.paused
            if facts is not None and current:
                st.facts = facts
        if not current:
            return 0.0
        self._record(
            st,
            src.name,
            error,
            duration,
            None if off is None else str(off),
            parse_errors if isinstance(parse_errors, int) else None,
        )
        return max(0.0, interval - duration)

    def _record(
        self,
        st: _SourceState,
        name: str,
        error: str | None,
        duration: float,
        off_reason: str | None,
        parse_errors: int | None,
    ) -> None:
        """Keep one collection's status (logging a change of state once) for the next snapshot."""
        try:
            now = self.clock()
        except Exception:  # an injected clock's bug must not end the worker either
            now = time.time()
        if off_reason is not None:
            if off_reason != st.off_reason:
                log.info("collector %s is off: %s", name, off_reason)
            error = None
        elif error is None:
            st.last_success = now
            if st.last_error is not None:
                log.info("collector %s recovered", name)
        elif error != st.last_error:
            log.warning("collector %s failed: %s", name, error)
        with self._lock:
            if st.paused and off_reason is None:
                return  # paused by a reload since: the off status it set stands
            st.last_error, st.off_reason = error, off_reason
            st.status = CollectorStatus(
                name,
                error is None and off_reason is None,
                duration,
                st.last_success,
                error,
                off_reason,
                parse_errors,
            )
        if self._served.view is None:
            self._dirty.set()  # until the first tick, every first report may complete it

    def collector_statuses(self) -> tuple[CollectorStatus, ...]:
        """Every known collector's status: each running source's last report (a failure where its collect() has
        been in flight for too long), and an off status for each known collector the agent does not run."""
        now = time.monotonic()
        out = []
        for st in self._sources:
            status, since = st.status, st.collecting_since
            if since is not None:
                interval, _ = _usable_interval(getattr(st.source, "interval_seconds", None))
                stalled = now - since
                if stalled > max(STALLED_MIN_SECONDS, STALLED_INTERVALS * interval):
                    error = f"collect() has not returned after {stalled:.0f} s"
                    last = status.last_success_timestamp if status is not None else None
                    status = CollectorStatus(st.source.name, False, stalled, last, error)
            if status is not None:
                out.append(status)
        running = {st.source.name for st in self._sources}
        for spec in SOURCES:
            if spec.name not in running:
                out.append(CollectorStatus(spec.name, False, 0.0, None, off_reason=self._absent_reason(spec)))
        return tuple(out)

    def _absent_reason(self, spec: SourceSpec[Any, Any]) -> str:
        off = spec.off_reason(spec.section_of(self.config))
        if off is not None:
            return off
        if spec.switch is None:
            return "not started by this agent"
        # Sources are made at start: a reload that turns one on finds none to resume.
        return f"{spec.section}.{spec.switch} was false when the agent started; turning it on takes a restart"

    def snapshot(self) -> Snapshot:
        with self._lock:
            collectors = self.collector_statuses()
            facts = {st.key.name: st.facts for st in self._sources if not st.paused}
        return Snapshot(self.clock(), collectors=collectors, facts=facts)

    def collect_now(self) -> None:
        """Run every running source once, on this thread, and record each as its worker would (tools and tests that
        drive the agent tick by tick, without its threads)."""
        for st in list(self._sources):
            self._collect_once(st)

    def tick(self) -> View:
        """Advance one tick and return its View."""
        return self.advance()

    def advance(self) -> View:
        """One tick: build one Snapshot, keep it in History, feed the latency windows and the stall tracker, make
        the View (a pure function of what the tick saw), settle the GPU time a scan can have explained, and publish
        the View to its consumers. Views are made here only, on the agent's cadence, whoever reads them."""
        snap = self.snapshot()
        self._clock_watch.check(snap.timestamp, time.monotonic())
        self.history.append(snap.for_history(self._history_keys))
        self.stalls.observe(snap.gpus, self._feeder.feed(snap))
        self._feeder.forget(snap)  # the windows of unmounted pod volumes, which would otherwise stay for ever
        if snap.mounts:  # a table not read says nothing about what is gone
            self.stalls.forget(snap.timestamp, (m.mountpoint for m in snap.mounts))
        if snap.kube is not None:
            self._kube_evidence.update(snap.kube)
        with self._lock:
            ready = all(st.status is not None for st in self._sources)
            classifier, platform = self.classifier, self.platform
        view = build_view(
            snap,
            classifier,
            platform,
            ready=ready,
            windows=self.windows,
            paths=self.config.host_paths(),
            verdicts=self._verdicts,
            mtbf_seconds=self.config.checkpoints.mtbf_seconds,
        )
        stalls, timeline = self.stalls.update(
            snap.timestamp, view.checkpoints, view.mounts, snap.gpus, view.pods, snap.get(ACCESS)
        )
        view = dataclasses.replace(view, stalls=stalls, timeline=timeline)
        self._served = _Served(view, None)
        for consumer in list(self._subscribers):
            try:
                consumer(view)
            except Exception:
                log.exception("a consumer of the View failed; the others are still told")
        return view

    def _run_ticker(self) -> None:
        started = time.monotonic()
        frozen = False
        while not self._stop.is_set():
            self._dirty.wait(self.config.tick_seconds)
            self._dirty.clear()
            if self._stop.is_set():
                break
            with self._lock:
                everyone = all(st.status is not None for st in self._sources)
            if not everyone and time.monotonic() - started < STARTUP_GRACE_SECONDS:
                continue  # a first View with every source in it, unless one of them is slow to start
            try:
                self.advance()
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
            server.start()
            log.info("serving on %s (port %d)", self.config.listen, server.port)
        for st in self._sources:
            t = threading.Thread(target=self._run_source, args=(st,), name=f"source-{st.source.name}", daemon=True)
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._run_ticker, name="ticker", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        for st in self._sources:
            try:
                st.source.close()
            except Exception:
                log.exception("closing source %s", st.source.name)
        deadline = time.monotonic() + STOP_JOIN_SECONDS
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def apply_config(self, new: Config) -> None:
        """Put ``new`` in force as a reload would (validated already; ``listen``, ``tls`` and ``paths`` stay)."""
        platform = resolve_platform(new.platform, new.host_paths())
        self._apply(new, platform, self._classifier(platform.name, new))

    def reload(self) -> bool:
        """Re-read the configuration file and apply it. On any problem, reading, checking or applying it, the last
        good configuration stays in force, the error is logged as ``FILE:LINE: FIELD: message`` (``FILE: message``
        where no line applies) and counted (storwatch_config_reload_errors_total)."""
        path = self.config_path
        if path is None:
            log.info("SIGHUP: no configuration file to reload")
            return False
        try:
            new = self.flags(load_config(path))
            new.validate(path)
            platform = resolve_platform(new.platform, new.host_paths())
            classifier = self._classifier(platform.name, new)
        except ConfigError as err:
            return self._reload_failed(str(err))
        except Exception as err:  # a bug in reading a file must not take a running agent down
            log.debug("reload: reading %s", path, exc_info=True)
            return self._reload_failed(f"{path}: cannot load: {type(err).__name__}: {err}")
        for name in ("listen", "tls", "paths"):
            if getattr(new, name) != getattr(self.config, name):
                log.warning("reload: %s changed; it takes effect on restart", name)
                new = dataclasses.replace(new, **{name: getattr(self.config, name)})
        old = (self.config, self.platform, self.classifier)
        try:
            self._apply(new, platform, classifier)
        except Exception as err:
            log.debug("reload: applying %s", path, exc_info=True)
            try:
                self._apply(*old)
            except Exception:
                log.exception("reload: putting the last good configuration back failed")
            return self._reload_failed(f"{path}: cannot apply: {type(err).__name__}: {err}")
        self.reloads.succeeded()
        self._dirty.set()
        log.info("configuration reloaded from %s", path)
        return True

    def _apply(self, new: Config, platform: Platform, classifier: Classifier) -> None:
        with self._lock:
            self.config = new
            self.platform, self.classifier = platform, classifier
            self.history.resize(new.history_size)
            self.stalls.configure(self._stall_params(new))
            for st in self._sources:
                if st.spec is None:
                    continue
                section = st.spec.section_of(new)
                configure = getattr(st.source, "configure", None)
                if configure is not None:
                    configure(section)
                self._switch(st, st.spec.off_reason(section), section)
        with self._render_lock:  # not while a render is using the old set
            self.exporter.configure(new.nfs.operations)

    def _reload_failed(self, message: str) -> bool:
        self.reloads.failed()
        log.error("reload failed, keeping the last good configuration:\n%s", Lines(message))  # one error a line
        self._dirty.set()  # a tick, so the next scrape shows the count
        return False

    def _switch(self, st: _SourceState, off: str | None, section: Any) -> None:
        """Switched off by a reload: closed (the GPU source shuts NVML down, so the NVIDIA driver can be unloaded for
        an upgrade), its facts dropped, reported off. Switched on again: made anew. Called with the lock held."""
        assert st.spec is not None
        if off is not None and not st.paused:
            st.paused, st.off_reason, st.facts = True, off, None
            st.source.close()
            st.status = CollectorStatus(st.source.name, False, 0.0, st.last_success, None, off)
            log.info("collector %s switched off: %s", st.source.name, off)
        elif off is None and st.paused:
            st.source = st.spec.make(self._context, section)
            st.paused, st.off_reason = False, None
            log.info("collector %s switched on again", st.source.name)

    def run_until_signalled(self, exiting: bool = False) -> None:
        """Serve until SIGTERM or SIGINT; SIGHUP reloads. Must be called from the main thread.

        ``exiting``: the process exits once this returns (``storwatch agent``). The three signals are then ignored
        from the moment the agent stops rather than given back to what was there before: a second SIGTERM
        (``timeout`` sends one to the process and one to its group) would otherwise meet the default action, which
        Python also restores as it shuts down, and kill a process that was exiting cleanly."""
        inbox = SignalInbox()
        try:
            self.start()
            while not inbox.stop_signal:
                inbox.wait(1.0)
                if inbox.hup and not inbox.stop_signal:
                    inbox.hup = False  # a SIGHUP from here on asks for one more reload, after this one
                    log.info("received SIGHUP, reloading the configuration")
                    self.reload()
            log.info("received %s, stopping", signal.Signals(inbox.stop_signal).name)
        finally:
            if exiting:
                inbox.ignore_all()
            self.stop()
            inbox.close()


class SignalInbox:
    """SIGTERM, SIGINT and SIGHUP as the main thread sees them: each handler only notes its signal in a flag, and
    ``signal.set_wakeup_fd`` wakes the thread waiting in ``wait``; logging, stopping and reloading happen there.

    A handler runs in the main thread between two bytecodes, wherever that thread is: one that logged or set a
    threading.Event could run while the main thread held that very lock (inside Event.wait) and wait on it forever,
    which two signals close together did. Installed when made, from the main thread; ``close`` puts back what was
    there before (or SIG_IGN after ``ignore_all``)."""

    def __init__(self) -> None:
        self.stop_signal = 0
        """The last SIGTERM or SIGINT received, 0 for none."""
        self.hup = False
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._old_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._old = {sig: signal.signal(sig, self._note) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self.hup = True
        else:
            self.stop_signal = signum

    def wait(self, timeout: float) -> None:
        """Until a signal arrives or ``timeout`` passes. A signal that another thread took has its handler run in the
        main thread at a bytecode boundary soon after the wake-up, so the caller sees its flag now or, at worst,
        after the next wait."""
        with contextlib.suppress(InterruptedError):
            select.select([self._reader], [], [], timeout)
        with contextlib.suppress(OSError):
            while self._reader.recv(64):
                pass

    def ignore_all(self) -> None:
        """From now on the three signals are ignored (a process about to exit); ``close`` leaves them so."""
        for sig in self._old:
            signal.signal(sig, signal.SIG_IGN)
        self._old = dict.fromkeys(self._old, signal.SIG_IGN)

    def close(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._old_fd)
        self._reader.close()
        self._writer.close()
