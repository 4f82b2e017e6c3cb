"""The collectors: each source on its own worker thread, on its own cadence, with its health recorded.

A worker runs its source's ``collect()``, keeps the facts, records how it went (a status per collector, its changes
logged once, a failure that goes on logged again with backoff, every failure counted) and waits the source's interval,
until the agent stops, or until it is asked to collect soon (``collect_soon``: the sync action, waiting for a
checkpoint it asked a run for, has the checkpoint scan run again rather than at its interval). Whatever a source or
the worker loop raises becomes that collector's failure and the loop goes on. A reload may switch a source off
(closed, its facts dropped) or on again (made anew); a collection that ends after its source was switched off is
dropped.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from storwatch.pace import Backoff
from storwatch.registry import BY_NAME, SOURCES, SourceContext, SourceSpec
from storwatch.sources import Configurable, FactsKey, Source
from storwatch.sources.fileevents import FILE_EVENTS
from storwatch.threadname import name_this_thread
from storwatch.vocabulary import CollectorStatus

log = logging.getLogger(__name__)

FALLBACK_INTERVAL_SECONDS = 10.0
"""How often a worker runs its source when the source's interval_seconds cannot be waited (NaN, infinite, not above
0; the config refuses these, a source may still hold one), and after an error of the worker loop itself."""
FAILURE_LOG_FIRST_SECONDS = 1.0
FAILURE_LOG_MAX_SECONDS = 300.0
"""A collector that keeps failing in the same way is logged when it starts, then again (with how many failures since)
after FAILURE_LOG_FIRST_SECONDS, doubling up to FAILURE_LOG_MAX_SECONDS between lines: the backoff nvmlInit retries
with, so a node without GPUs does not log its GPU collector every second."""
STALLED_MIN_SECONDS = 300.0
STALLED_INTERVALS = 10
"""A collect() in flight longer than the larger of STALLED_MIN_SECONDS and STALLED_INTERVALS intervals is reported
as a failure: sources keep their own deadlines, so only a bug or a hang they did not foresee gets there."""
SOON_MIN_SECONDS = 2.0
"""A collection asked for with ``collect_soon`` starts at least this long after the last one started, however often
it is asked for: an action repeating fast never has a source (a checkpoint walk) run back to back."""


@dataclass
class SourceState:
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
    failures: int = 0
    """Failed collections since the agent started (storwatch_collector_failures_total)."""
    failing: int = 0
    """Failed collections in a row, the last one included; 0 while it succeeds."""
    failure_logged: int = 0
    """``failing`` when the current failure was last logged."""
    next_failure_log: float = 0.0
    """When (the Collectors' clock) a failure that goes on is logged again."""
    failure_log: Backoff = field(default_factory=lambda: Backoff(FAILURE_LOG_FIRST_SECONDS, FAILURE_LOG_MAX_SECONDS))
    soon: threading.Event = field(default_factory=threading.Event)
    """Set to end the worker's wait early (``collect_soon``, and the agent's stop)."""
    started: float | None = None
    """time.monotonic() when its last collection started."""


def given(source: Source[Any]) -> SourceState:
    """A source handed to the Agent directly (tests, tools): it files its facts where the registry's source of its
    name would, and is configured on reload like it."""
    spec = BY_NAME.get(source.name)
    return SourceState(source, spec.facts if spec is not None else FactsKey(source.name), spec)


def describe(err: BaseException) -> str:
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def same_failure(a: str | None, b: str | None) -> bool:
    """Two errors that differ only in their numbers (a countdown, a byte count, seconds in flight) are one failure
    going on, not a new one worth a line of its own."""
    if a is None or b is None:
        return a is b
    return _NUMBER.sub("#", a) == _NUMBER.sub("#", b)


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def usable_interval(value: object) -> tuple[float, str | None]:
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


class Collectors:
    """Every running source, its worker and its last report. ``lock`` guards the states (the agent's reload holds it
    while it reconfigures them); ``reported`` is called after each report (the ticker wakes for the first View)."""

    def __init__(
        self,
        states: list[SourceState],
        context: SourceContext,
        clock: Callable[[], float],
        stop: threading.Event,
        reported: Callable[[], None],
    ) -> None:
        self.states = states
        self.context = context
        self.clock = clock
        self.stop = stop
        self.reported = reported
        self.lock = threading.Lock()

    @classmethod
    def made(cls, sections: Callable[[SourceSpec[Any, Any]], Any], context: SourceContext) -> list[SourceState]:
        """Every source the registry declares that its section leaves on; the others are reported off."""
        made = []
        for spec in SOURCES:
            section = sections(spec)
            if spec.off_reason(section) is None:
                made.append(SourceState(spec.make(context, section), spec.facts, spec))
        return made

    def source(self, name: str) -> Any:
        """The running source of that collector name, or None."""
        return next((st.source for st in self.states if st.source.name == name), None)

    def latest(self, key: FactsKey[Any] | str) -> Any:
        """A running source's newest facts, by its FactsKey or collector name (None before it reports)."""
        with self.lock:
            for st in self.states:
                if st.key is key or st.source.name == key:
                    return st.facts
        return None

    def facts(self) -> tuple[tuple[CollectorStatus, ...], dict[str, Any], bool]:
        """The running collectors' statuses, their newest facts by key, and whether every one has reported."""
        with self.lock:
            statuses = self.statuses()
            facts = {st.key.name: st.facts for st in self.states if not st.paused}
            ready = all(st.status is not None for st in self.states)
        return statuses, facts, ready

    def all_reported(self) -> bool:
        with self.lock:
            return all(st.status is not None for st in self.states)

    def start(self) -> list[threading.Thread]:
        threads = []
        for st in self.states:
            t = threading.Thread(target=self.run, args=(st,), name=f"source-{st.source.name}", daemon=True)
            t.start()
            threads.append(t)
        return threads

    def collect_now(self) -> None:
        """Run every running source once, on this thread, and record each as its worker would."""
        for st in list(self.states):
            self.collect_once(st)

    def collect_soon(self, name: str) -> bool:
        """Have source ``name`` collect again without waiting out its interval (no sooner than SOON_MIN_SECONDS after
        its last collection started; one in flight is followed by another). False: no such source runs."""
        with self.lock:
            found = [st for st in self.states if st.source.name == name and not st.paused]
        for st in found:
            st.soon.set()
        return bool(found)

    def wake(self) -> None:
        """End every worker's wait now (the agent's stop: a worker waits on its own event, not on ``stop``)."""
        for st in self.states:
            st.soon.set()

    def close(self) -> None:
        self.wake()
        for st in self.states:
            try:
                st.source.close()
            except Exception:
                log.exception("closing source %s", st.source.name)

    # -- a worker

    def run(self, st: SourceState) -> None:
        """One source's worker: collect, record how it went, wait the source's interval, until the agent stops.
        Whatever the source or this loop raises (BaseException included: a SystemExit would end a thread silently)
        becomes that collector's failure and the loop goes on, so a worker never ends while its collector still
        shows its last success."""
        name_this_thread()
        try:
            while not self.stop.is_set():
                try:
                    wait = self.collect_once(st)
                except BaseException as err:
                    wait = FALLBACK_INTERVAL_SECONDS
                    self.record(st, st.source.name, f"worker error: {describe(err)}", 0.0, None, None)
                self._rest(st, wait)
        finally:
            if not self.stop.is_set():  # only a failing Event could get here; say so rather than go quiet
                self.record(st, st.source.name, "worker stopped", 0.0, None, None)

    def _rest(self, st: SourceState, seconds: float) -> None:
        """Wait ``seconds``, or less when asked to collect soon; never past the agent's stop."""
        if self.stop.is_set():
            return
        if st.soon.wait(seconds) and not self.stop.is_set():
            st.soon.clear()
            since = time.monotonic() - st.started if st.started is not None else SOON_MIN_SECONDS
            self.stop.wait(max(0.0, SOON_MIN_SECONDS - since))

    def collect_once(self, st: SourceState) -> float:
        """Run the source once and record its status; the seconds to wait before the next run."""
        if st.paused:
            if st.status is None or st.status.off_reason is None:
                self.record(st, st.source.name, None, 0.0, st.off_reason or "switched off by a reload", None)
            return 1.0
        src = st.source  # a reload may have replaced it
        started = time.monotonic()
        st.collecting_since = st.started = started
        error: str | None = None
        facts: Any = None
        cpu_started = time.thread_time()
        try:
            facts = src.collect()
            # A source may answer and still have failed (a stuck NVML call): its facts say so and are kept.
            failure = getattr(facts, "failure", None)
            error = None if failure is None else str(failure)
        except BaseException as err:  # a failing source reports itself and the agent goes on
            error = describe(err)
        finally:
            st.collecting_since = None
        duration = time.monotonic() - started
        # Asked after the collection: a source may set its pace by what it saw (the access source looks again soon
        # while a GPU workload is there).
        interval, interval_error = usable_interval(src.interval_seconds)
        if st.spec is not None and (st.spec.paced or st.spec.budgeted):
            # A read every tick is part of the second's work, whose budget may stretch it; a paced one is slower
            # still while the node is quiet (storwatch/pace.py).
            self.context.pace.spent(src.name, time.thread_time() - cpu_started, interval)
            # What a source may offer (storwatch/sources/__init__.py) is asked for by name: isinstance of a runtime
            # Protocol walks the class's attributes at each call, a quarter of this method's own cost.
            if not getattr(src, "keeps_pace", False):
                interval = self.context.pace.stretch(interval, quiet=st.spec.paced, keeps_second=st.spec.keeps_second)
        try:
            off = getattr(src, "off_reason", None)
            parse_errors = getattr(src, "parse_errors", None)
        except Exception as err:
            off, parse_errors = None, None
            error = f"{error}; {describe(err)}" if error else describe(err)
        if interval_error is not None:
            error = f"{error}; {interval_error}" if error else interval_error
        with self.lock:
            # A reload may have paused or replaced the source while it collected (gpu.enabled: false shuts NVML
            # down and drops its facts): what this collection saw is then stale, and must not come back.
            current = st.source is src and not st.paused
            if facts is not None and current:
                st.facts = facts
        if not current:
            return 0.0
        self.record(
            st,
            src.name,
            error,
            duration,
            None if off is None else str(off),
            parse_errors if isinstance(parse_errors, int) else None,
        )
        return max(0.0, interval - duration)

    def record(
        self,
        st: SourceState,
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
            st.failing = 0
        elif error is None:
            st.last_success = now
            if st.last_error is not None:
                log.info("collector %s recovered after %d failed runs", name, st.failing)
            st.failing = 0
        else:
            self._failed(st, name, error, now)
        with self.lock:
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
                st.failures,
            )
        self.reported()

    def _failed(self, st: SourceState, name: str, error: str, now: float) -> None:
        """Count a failure; log it when it is new, else when the backoff since its last line has passed."""
        st.failures += 1
        st.failing += 1
        if st.failing == 1 or not same_failure(error, st.last_error):
            log.warning("collector %s failed: %s", name, error)
            st.failure_log.reset()
        elif now >= st.next_failure_log:
            log.warning(
                "collector %s still failing (%d failed runs since the last line, %d in a row): %s",
                name,
                st.failing - st.failure_logged,
                st.failing,
                error,
            )
        else:
            return
        st.failure_logged = st.failing
        st.next_failure_log = now + st.failure_log.failed()

    def statuses(self) -> tuple[CollectorStatus, ...]:
        """Each running source's last report, a failure where its collect() has been in flight for too long."""
        now = time.monotonic()
        out = []
        for st in self.states:
            status, since = st.status, st.collecting_since
            if since is not None:
                interval, _ = usable_interval(st.source.interval_seconds)
                stalled = now - since
                if stalled > max(STALLED_MIN_SECONDS, STALLED_INTERVALS * interval):
                    error = f"collect() has not returned after {stalled:.0f} s"
                    last = status.last_success_timestamp if status is not None else None
                    failures = status.failures if status is not None else st.failures
                    status = CollectorStatus(st.source.name, False, stalled, last, error, failures=failures)
            if status is not None:
                out.append(status)
        return tuple(out)

    # -- a reload

    def reconfigure(self, sections: Callable[[SourceSpec[Any, Any]], Any]) -> None:
        """Give every registry source its (reloaded) section, and switch each off or on as its section says. Called
        with ``lock`` held."""
        for st in self.states:
            if st.spec is None:
                continue
            section = sections(st.spec)
            if isinstance(st.source, Configurable):
                st.source.configure(section)
            self._switch(st, st.spec.off_reason(section), section)

    def _switch(self, st: SourceState, off: str | None, section: Any) -> None:
        """Switched off by a reload: closed (the GPU source shuts NVML down, so the NVIDIA driver can be unloaded for
        an upgrade), its facts dropped, reported off. Switched on again: made anew."""
        assert st.spec is not None
        if off is not None and not st.paused:
            st.paused, st.off_reason, st.facts = True, off, None
            st.source.close()
            st.status = CollectorStatus(st.source.name, False, 0.0, st.last_success, None, off, failures=st.failures)
            log.info("collector %s switched off: %s", st.source.name, off)
        elif off is None and st.paused:
            st.source = st.spec.make(self.context, section)
            st.paused, st.off_reason = False, None
            log.info("collector %s switched on again", st.source.name)


class ScanAfterSaves:
    """A save that ended brings the checkpoint scan forward. Once the file events source has seen a save end (its
    ``ended`` count grew), the checkpoint source scans again as soon as its CPU share allows
    (``CheckpointSource.may_scan_soon``), unless a scan began since: the finding, the recovery point and a sync waiting
    on the checkpoint see it within seconds, not at the scans' interval (30 s, longer where scans cost more). So does a
    scan whose checks ran past their budget (``CheckpointSource.more``: a first walk of thousands of files), so that
    they go on. Looked at after every report of every source (a report comes each second), so a scan the share holds
    back comes later."""

    def __init__(self, collectors: Collectors) -> None:
        self._collectors = collectors
        self._ended = 0
        """The file events' ``ended`` count last seen."""
        self._more: tuple[str, ...] = ()
        """The checkpoint source's ``more`` last seen (each collection's is a tuple of its own)."""
        self._since: float | None = None
        """time.monotonic() when a save's end (or checks to go on) was seen that no scan has begun after; None: none
        waits."""
        self._lock = threading.Lock()  # every source's worker reports

    def reported(self) -> None:
        facts = self._collectors.latest(FILE_EVENTS)
        source = self._collectors.source("checkpoints")
        if source is None:
            return
        began: float | None = getattr(source, "began", None)
        more: tuple[str, ...] = getattr(source, "more", ())
        with self._lock:
            saved = facts is not None and facts.ended != self._ended
            checks_go_on = bool(more) and more is not self._more
            if facts is not None:
                self._ended = facts.ended
            self._more = more
            if (saved or checks_go_on) and self._since is None:
                self._since = time.monotonic()
            if self._since is None:
                return
            if began is not None and began >= self._since:
                self._since = None  # a scan began after the save's end: it covers it
                return
            if not source.may_scan_soon():
                return
            self._since = None
        self._collectors.collect_soon("checkpoints")
