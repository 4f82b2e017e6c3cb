"""Active probes: write, fsync and read back a small file on chosen mounts, with the statvfs deadline handling.

Opt-in per durability class or mountpoint (``probes:`` in the config), never on read-only mounts. A probe that does
not return within its deadline marks the mount stuck; no second probe starts on it until the first returns.
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from storwatch.calls.blocking import BlockingCalls
from storwatch.config import ProbesConfig
from storwatch.labels import PROBE_BUCKETS, PROBE_OPS
from storwatch.paths import HostPaths
from storwatch.sources import FactsKey
from storwatch.vocabulary import Durability

BUCKETS = PROBE_BUCKETS


@dataclass(frozen=True)
class ProbeTarget:
    mountpoint: str
    durability: Durability
    readonly: bool


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts (one per BUCKETS bound, then +Inf), the sum and the count."""

    buckets: tuple[int, ...]
    sum: float
    count: int


@dataclass(frozen=True)
class ProbeResult:
    mountpoint: str
    timestamp: float
    seconds: dict[str, float] | None
    """write, fsync and read durations of this round's probe; None when it failed or is stuck."""
    stuck: bool
    in_flight_seconds: float
    error: str | None
    histograms: dict[str, Histogram]
    """Every probe of this mount so far, per operation."""


class _Hist:
    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(BUCKETS):
            if value <= bound:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.sum += value
        self.count += 1

    def freeze(self) -> Histogram:
        cumulative, running = [], 0
        for c in self.counts:
            running += c
            cumulative.append(running)
        return Histogram(tuple(cumulative), self.sum, self.count)


class ProbeFacts(tuple[ProbeResult, ...]):
    """This round's probes, and what makes the round a failure of the source: a chosen mount left unprobed because
    of a limit on the calls in flight (a stuck probe is a fact about its mount, not a failure)."""

    failure: str | None

    def __new__(cls, results: tuple[ProbeResult, ...] = (), failure: str | None = None) -> ProbeFacts:
        self = super().__new__(cls, results)
        self.failure = failure
        return self


PROBES: FactsKey[ProbeFacts] = FactsKey("probes")
"""The probe source's facts in a Snapshot."""


def selected(config: ProbesConfig, target: ProbeTarget) -> bool:
    if target.readonly:
        return False
    if target.durability in config.classes:
        return True
    return any(target.mountpoint == p or fnmatch.fnmatchcase(target.mountpoint, p) for p in config.mountpoints)


class ProbeSource:
    name = "probe"

    def __init__(
        self,
        paths: HostPaths,
        config: ProbesConfig,
        targets: Callable[[], Sequence[ProbeTarget]],
        clock: Callable[[], float],
        calls: BlockingCalls | None = None,
    ) -> None:
        self.paths = paths
        self.targets = targets
        self.clock = clock
        self.calls = calls if calls is not None else BlockingCalls(max_inflight=16)
        self._hists: dict[tuple[str, str], _Hist] = {}
        self._lock = threading.Lock()
        self.configure(config)

    def configure(self, config: ProbesConfig) -> None:
        self.config = config
        self.interval_seconds = config.interval_seconds

    @property
    def off_reason(self) -> str | None:
        """Probes are opt-in: off until ``probes.classes`` or ``probes.mountpoints`` chooses something."""
        if self.config.classes or self.config.mountpoints:
            return None
        return "no probes.classes or probes.mountpoints chosen"

    @property
    def histogram_mountpoints(self) -> frozenset[str]:
        """The mounts whose probe histograms are kept: those probed and still mounted (a bound on memory)."""
        with self._lock:
            return frozenset(mp for mp, _ in self._hists)

    def collect(self) -> ProbeFacts:
        config = self.config
        targets = self.targets()
        present = {t.mountpoint for t in targets}
        with self._lock:
            # Histograms of mounts that are gone (or stuck, which _probe_targets leaves out) go with them: a node
            # whose pod volumes come and go would otherwise keep one per volume it ever probed.
            if any(mp not in present for mp, _ in self._hists):
                self._hists = {key: h for key, h in self._hists.items() if key[0] in present}
        chosen = [t for t in targets if selected(config, t)]
        if not chosen:
            return ProbeFacts()
        requests = {
            t.mountpoint: (self.paths.root(t.mountpoint), config.scratch_dir, str(config.size_bytes)) for t in chosen
        }
        outcomes = self.calls.call_many("probe", requests, config.timeout_seconds)
        now = self.clock()
        results = []
        with self._lock:
            for t in chosen:
                out = outcomes.get(t.mountpoint)
                seconds: dict[str, float] | None = None
                error = None
                if out is not None and out.values is not None:
                    try:
                        seconds = dict(zip(PROBE_OPS, (float(v) for v in out.values), strict=True))
                    except ValueError:
                        error = f"unreadable probe answer {out.values!r}"
                    else:
                        for op, value in seconds.items():
                            self._hists.setdefault((t.mountpoint, op), _Hist()).observe(value)
                elif out is not None and out.error is not None:
                    error = out.error
                elif out is not None and out.stuck:
                    error = "probe has not returned"
                hists = {op: h.freeze() for (mp, op), h in self._hists.items() if mp == t.mountpoint}
                results.append(
                    ProbeResult(
                        t.mountpoint,
                        now,
                        seconds,
                        bool(out and out.stuck),
                        out.in_flight_seconds if out else 0.0,
                        error,
                        hists,
                    )
                )
        skipped = [t.mountpoint for t in chosen if (o := outcomes.get(t.mountpoint)) is not None and o.skipped]
        failure = f"{len(skipped)} mounts not probed this round (limit on calls in flight)" if skipped else None
        return ProbeFacts(tuple(results), failure)

    def close(self) -> None:
        self.calls.close()
