"""The diskstats source: per-device I/O counters from /proc/diskstats and their change since the last read."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from storwatch.config import DiskIOConfig
from storwatch.paths import HostPaths
from storwatch.procfs.diskstats import DiskStats, DiskStatsDelta, diskstats_delta, parse_diskstats
from storwatch.sources import OnceLog, read_first

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DiskIO:
    timestamp: float
    """Wall-clock time of this read (the clock the agent was given)."""
    counters: dict[str, DiskStats]
    """Every device's counters since boot, by kernel name."""
    deltas: dict[str, DiskStatsDelta]
    """Each device's activity since the previous read; empty on the first read."""


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
        self._prev: dict[str, DiskStats] = {}
        self._prev_mono = 0.0
        self._bad_lines = OnceLog(log)

    def configure(self, config: DiskIOConfig) -> None:
        self.interval_seconds = config.interval_seconds

    def collect(self) -> DiskIO:
        data = read_first((self.paths.proc("diskstats"),), "diskstats")
        mono = self.monotonic()
        disks, errors = parse_diskstats(data)
        for err in errors:
            self._bad_lines.warning(err.line, "diskstats: skipping malformed %s", err)
        counters = {d.name: d for d in disks}
        deltas: dict[str, DiskStatsDelta] = {}
        seconds = mono - self._prev_mono
        if self._prev and seconds > 0:
            for name, cur in counters.items():
                prev = self._prev.get(name)
                if prev is not None:
                    deltas[name] = diskstats_delta(prev, cur, seconds)
        self._prev, self._prev_mono = counters, mono
        return DiskIO(self.clock(), counters, deltas)

    def close(self) -> None:
        pass
