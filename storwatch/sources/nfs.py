"""The NFS source: per-mount, per-operation RPC statistics from /proc/<pid>/mountstats, and their change."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from storwatch.config import NFSConfig
from storwatch.paths import HostPaths
from storwatch.procfs.mountstats import NFSMount, NFSOperation, OperationCache, parse_mountstats
from storwatch.sources import OnceLog, read_first

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpDelta:
    """One NFS operation's activity between two reads."""

    requests: int
    execute_seconds: float
    rtt_seconds: float
    major_timeouts: int


@dataclass(frozen=True)
class NFSStats:
    timestamp: float
    mounts: dict[str, NFSMount]
    """Every NFS mount's counters since it was mounted, by mountpoint."""
    deltas: dict[str, dict[str, OpDelta]]
    """Per mountpoint and operation, the change since the previous read (operations with requests only)."""


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
        self._op_cache = OperationCache()

    def configure(self, config: NFSConfig) -> None:
        self.interval_seconds = config.interval_seconds

    def collect(self) -> NFSStats:
        data = read_first(self.paths.host_process_file("mountstats"), "mountstats")
        parsed, errors = parse_mountstats(data, self._op_cache)
        for err in errors:
            self._bad_lines.warning(str(err), "mountstats: skipping malformed %s", err)
        mounts = {m.mountpoint: m for m in parsed}
        deltas: dict[str, dict[str, OpDelta]] = {}
        for mp, cur in mounts.items():
            prev = self._prev.get(mp)
            if prev is None:
                continue
            prev_ops = {op.name: op for op in prev.operations}
            per_op = {}
            for op in cur.operations:
                before = prev_ops.get(op.name)
                if before is op:
                    continue  # the very same line as last time: nothing happened
                d = _op_delta(before, op)
                if d is not None:
                    per_op[op.name] = d
            if per_op:
                deltas[mp] = per_op
        self._prev = mounts
        return NFSStats(self.clock(), mounts, deltas)

    def close(self) -> None:
        pass
