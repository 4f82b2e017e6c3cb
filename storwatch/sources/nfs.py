"""The NFS source: per-mount, per-operation RPC statistics from /proc/<pid>/mountstats, and their change."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from storwatch.config import NFSConfig
from storwatch.paths import HostPaths
from storwatch.procfs.mountstats import MountStatsError, MountStatsReader, NFSMount, NFSOperation
from storwatch.sources import OnceLog, read_first

log = logging.getLogger(__name__)

DELTA_OPERATIONS = ("READ", "WRITE", "COMMIT")
"""The procedures whose change each read computes: the reads, writes and fsyncs the latency windows join (the other
procedures' counters are exported as they stand, and Prometheus takes their rates)."""


class OpDelta(NamedTuple):
    """One NFS operation's activity between two reads (a NamedTuple: up to three per busy mount every second)."""

    requests: int
    execute_seconds: float
    rtt_seconds: float
    major_timeouts: int


@dataclass(frozen=True)
class NFSStats:
    timestamp: float
    mounts: dict[str, NFSMount]
    """Every NFS mount's counters since it was mounted, by mountpoint (tables parsed when first used)."""
    deltas: dict[str, dict[str, OpDelta]]
    """Per mountpoint and operation in DELTA_OPERATIONS, the change since the previous read (those with requests)."""


def _op_delta(prev: NFSOperation | None, cur: NFSOperation) -> OpDelta | None:
    if prev is None or cur.requests < prev.requests:  # new mount, or remounted: counters restarted
        return None
    requests = cur.requests - prev.requests
    if requests <= 0:
        return None
    return OpDelta(
        requests,
        max(0, cur.execute_time_ms - prev.execute_time_ms) / 1000.0,
        max(0, cur.rtt_ms - prev.rtt_ms) / 1000.0,
        max(0, cur.major_timeouts - prev.major_timeouts),
    )


class NFSSource:
    name = "nfs"

    def __init__(self, paths: HostPaths, config: NFSConfig, clock: Callable[[], float] = time.time) -> None:
        self.paths = paths
        self.clock = clock
        self.configure(config)
        self._prev: dict[str, NFSMount] = {}
        self._bad_lines = OnceLog(log)
        self._reader = MountStatsReader(self._log_bad_lines)

    def configure(self, config: NFSConfig) -> None:
        self.interval_seconds = config.interval_seconds

    def _log_bad_lines(self, errors: list[MountStatsError]) -> None:
        # Called by collect() and, for a table parsed when first used, by whichever thread uses it.
        for err in errors:
            self._bad_lines.warning(str(err), "mountstats: skipping malformed %s", err)

    def collect(self) -> NFSStats:
        data = read_first(self.paths.host_process_file("mountstats"), "mountstats")
        parsed, errors = self._reader.read(data)
        self._log_bad_lines(errors)
        mounts = {m.mountpoint: m for m in parsed}
        deltas: dict[str, dict[str, OpDelta]] = {}
        for mp, cur in mounts.items():
            prev = self._prev.get(mp)
            if prev is None or prev is cur:  # a new mount, or the very same block as last time
                continue
            per_op = {}
            for name in DELTA_OPERATIONS:
                op = cur.operation(name)
                d = None if op is None else _op_delta(prev.operation(name), op)
                if d is not None:
                    per_op[name] = d
            if per_op:
                deltas[mp] = per_op
        self._prev = mounts
        return NFSStats(self.clock(), mounts, deltas)

    def close(self) -> None:
        pass
