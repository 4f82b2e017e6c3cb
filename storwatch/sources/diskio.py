"""The diskstats source: per-device I/O counters from /proc/diskstats and their change since the last read."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from storwatch.config import DiskIOConfig
from storwatch.paths import HostPaths
from storwatch.procfs.diskstats import (
    DiskStats,
    DiskStatsDelta,
    diskstats_delta,
    diskstats_lines,
    parse_diskstats,
    parse_line,
)
from storwatch.sources import FactsKey, OnceLog, read_first_named, require_parsed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DiskIO:
    timestamp: float
    """Wall-clock time of this read (the clock the agent was given)."""
    counters: Mapping[str, DiskStats]
    """Every device's counters since boot, by kernel name (each parsed when first asked for: :class:`Counters`)."""
    deltas: Mapping[str, DiskStatsDelta]
    """Each device's activity since the previous read (worked out when first asked for); empty on the first read."""
    since: float | None = None
    """The previous read's timestamp, where ``deltas`` start (None: no deltas, or not known). A reader that did not
    take the facts of that read (the tick takes only the newest facts of each source) works out its own deltas from
    the counters of the facts it took last (:func:`deltas_since`)."""


def deltas_since(before: DiskIO, now: DiskIO) -> Mapping[str, DiskStatsDelta]:
    """Each device's activity from ``before`` (facts of an earlier read, with their counters) to ``now``: ``now``'s
    own deltas when they start there."""
    if now.since is None or now.since == before.timestamp or not before.counters:
        return now.deltas
    seconds = now.timestamp - before.timestamp
    return Deltas(before.counters, now.counters, seconds) if seconds > 0 else {}


def _diskio_for_history(facts: DiskIO) -> DiskIO:
    # The deltas keep the two reads they come from; the counters themselves only the newest snapshot needs.
    return DiskIO(facts.timestamp, {}, facts.deltas, facts.since)


DISKIO: FactsKey[DiskIO] = FactsKey("disks", _diskio_for_history)
"""The diskstats source's facts in a Snapshot."""


class Counters(Mapping[str, DiskStats]):
    """One read's devices, each line parsed when first asked for. Every second the latency windows need the devices
    under mounts (a few; a GPU node lists dozens of NVMe namespaces, partitions, loop and dm devices), and a scrape
    every device; the lines were checked as a whole when read (``diskstats_lines``), so parsing one later cannot
    fail."""

    def __init__(self, lines: dict[str, str]) -> None:
        self._lines = lines
        self._parsed: dict[str, DiskStats] = {}

    def __getitem__(self, name: str) -> DiskStats:
        disk = self._parsed.get(name)
        if disk is None:
            disk = self._parsed[name] = parse_line(self._lines[name])
        return disk

    def __iter__(self) -> Iterator[str]:
        return iter(self._lines)

    def __len__(self) -> int:
        return len(self._lines)

    def __contains__(self, name: object) -> bool:
        return name in self._lines


class Deltas(Mapping[str, DiskStatsDelta]):
    """Each device's change between two reads, worked out when first asked for: every second the latency windows ask
    for the devices under mounts, a scrape for every device's utilisation, and History keeps this object, not 64
    deltas a second that nobody may read."""

    def __init__(self, before: Mapping[str, DiskStats], after: Mapping[str, DiskStats], seconds: float) -> None:
        self._before, self._after, self._seconds = before, after, seconds
        self._names = [name for name in after if name in before]
        self._worked_out: dict[str, DiskStatsDelta] = {}

    def __getitem__(self, name: str) -> DiskStatsDelta:
        delta = self._worked_out.get(name)
        if delta is None:
            before = self._before[name]  # KeyError: a device new since the last read has no delta
            delta = self._worked_out[name] = diskstats_delta(before, self._after[name], self._seconds)
        return delta

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._after and name in self._before


class DiskIOSource:
    name = "diskstats"

    def __init__(
        self,
        paths: HostPaths,
        config: DiskIOConfig,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.paths = paths
        self.clock = clock
        self.monotonic = monotonic
        self.configure(config)
        self._prev: Mapping[str, DiskStats] = {}
        self._prev_mono = 0.0
        self._prev_at: float | None = None
        self._bad_lines = OnceLog(log)
        self.parse_errors = 0
        """Lines of /proc/diskstats that could not be parsed, counted at every read that holds them."""

    def configure(self, config: DiskIOConfig) -> None:
        self.interval_seconds = config.interval_seconds

    def collect(self) -> DiskIO:
        path, data = read_first_named((self.paths.proc("diskstats"),), "diskstats")
        mono = self.monotonic()
        lines = diskstats_lines(data)
        counters: Mapping[str, DiskStats]
        if lines is not None:  # the kernel's own layout, every line good: each parsed when asked for
            counters = Counters(lines)
        else:
            disks, errors = parse_diskstats(data)
            self.parse_errors += len(errors)
            for err in errors:
                self._bad_lines.warning(err.line, "diskstats: skipping malformed %s", err)
            # Nothing to report is a failure, not an idle node: an empty file or one of garbage (a torn read, a
            # wrong --path.procfs). The last good read stays the base for the next deltas.
            require_parsed(path, "device", len(disks), errors)
            counters = {d.name: d for d in disks}
        seconds = mono - self._prev_mono
        deltas: Mapping[str, DiskStatsDelta] = (
            Deltas(self._prev, counters, seconds) if self._prev and seconds > 0 else {}
        )
        now = self.clock()
        since = self._prev_at if deltas else None
        self._prev, self._prev_mono, self._prev_at = counters, mono, now
        return DiskIO(now, counters, deltas, since)

    def close(self) -> None:
        pass
