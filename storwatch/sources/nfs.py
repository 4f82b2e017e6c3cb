"""The NFS source: per-mount, per-operation RPC statistics from /proc/<pid>/mountstats, and their change."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from storwatch.config import NFSConfig
from storwatch.paths import HostPaths
from storwatch.procfs.mountstats import (
    MountStatsError,
    NFSMount,
    OperationTimes,
    line_number,
    moved,
    parse_mountstats,
    parse_operation_times,
)
from storwatch.sources import FactsKey, OnceLog, read_first_named, require_parsed
from storwatch.sources.mountstats_reader import MountStatsReader, OperationLines

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
    mounts: Mapping[str, NFSMount]
    """Every NFS mount's counters since it was mounted, by mountpoint: the whole file is read into tables when first
    looked at (a scrape, the status page), not every second; each table is parsed when first used."""
    deltas: dict[str, dict[str, OpDelta]]
    """Per mountpoint and operation in DELTA_OPERATIONS, the change since the previous read (those with requests)."""


def _nfs_for_history(facts: NFSStats) -> NFSStats:
    # Every mount's per-op table only the newest snapshot needs; History keeps the deltas.
    return dataclasses.replace(facts, mounts={})


NFS: FactsKey[NFSStats] = FactsKey("nfs", _nfs_for_history)
"""The NFS source's facts in a Snapshot."""


class _Tables(Mapping[str, NFSMount]):
    """The NFS mounts of one read of mountstats, cut into blocks and compared with the last read when first used."""

    def __init__(self, data: bytes, reader: MountStatsReader, lock: threading.Lock) -> None:
        self._data: bytes | None = data
        self._reader, self._lock = reader, lock
        self._mounts: dict[str, NFSMount] | None = None

    def _read(self) -> dict[str, NFSMount]:
        mounts = self._mounts
        if mounts is None:
            with self._lock:  # one reader for every read: consumers in two threads take turns
                mounts = self._mounts
                if mounts is None:
                    assert self._data is not None
                    parsed, errors = self._reader.read(self._data)
                    self._reader.report(errors)
                    mounts = self._mounts = {m.mountpoint: m for m in parsed}
                    self._data = None  # 100s of KB on a node with many NFS mounts: not kept past the reading
        return mounts

    def __getitem__(self, mountpoint: str) -> NFSMount:
        return self._read()[mountpoint]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


def _op_delta(prev: OperationTimes, cur: OperationTimes) -> OpDelta | None:
    if cur.requests < prev.requests:  # remounted: the counters started again
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


NO_NFS_INTERVAL_SECONDS = 5.0
"""How often mountstats is read while the last read found no NFS mount (a node without NFS)."""


class NFSSource:
    name = "nfs"

    def __init__(self, paths: HostPaths, config: NFSConfig, clock: Callable[[], float] = time.time) -> None:
        self.paths = paths
        self.clock = clock
        self._nfs_seen = True  # until a read says otherwise
        self.configure(config)
        self._bad_lines = OnceLog(log)
        self.parse_errors = 0
        """Lines of mountstats that could not be parsed: counted by each read of the READ, WRITE and COMMIT lines, and
        by the tables when a consumer has them parsed (in its own thread, hence the lock)."""
        self._count_lock = threading.Lock()
        self._reader = MountStatsReader(self._log_bad_lines)
        self._reader_lock = threading.Lock()
        self._lines = OperationLines(DELTA_OPERATIONS)
        self._last: dict[tuple[str, str], tuple[bytes, OperationTimes]] = {}
        """By (mountpoint, procedure): its line at the last read, and what it parsed to."""

    def configure(self, config: NFSConfig) -> None:
        self._interval = config.interval_seconds

    @property
    def interval_seconds(self) -> float:
        """The configured interval while the last read found an NFS mount; else at least NO_NFS_INTERVAL_SECONDS.

        A node without NFS has nothing here to time, so the file is read at that slower pace (the first read after
        a mount appears starts its counters; its first latency window comes one read later, as for any new mount)."""
        return self._interval if self._nfs_seen else max(self._interval, NO_NFS_INTERVAL_SECONDS)

    @interval_seconds.setter
    def interval_seconds(self, seconds: float) -> None:
        self._interval = seconds

    def _log_bad_lines(self, errors: list[MountStatsError]) -> None:
        # Called by collect() and, for tables read when first used, by whichever thread uses them.
        if errors:
            with self._count_lock:
                self.parse_errors += len(errors)
        for err in errors:
            self._bad_lines.warning(str(err), "mountstats: skipping malformed %s", err)

    def collect(self) -> NFSStats:
        """Every second: the READ, WRITE and COMMIT lines of each NFS mount, and the change of those that moved.
        The rest of the file waits for a consumer (NFSStats.mounts)."""
        path, data = read_first_named(self.paths.host_process_file("mountstats"), "mountstats")
        last = self._last
        now: dict[tuple[str, str], tuple[bytes, OperationTimes]] = {}
        deltas: dict[str, dict[str, OpDelta]] = {}
        found = self._lines.find(data)
        self._check(path, data)
        for mountpoint, name, line, offset in found:
            key = (mountpoint, name)
            before = last.get(key)
            if before is not None and before[0] == line:  # the same line: nothing happened
                now[key] = before
                continue
            try:
                op = parse_operation_times(line)
            except MountStatsError as err:
                self._log_bad_lines([moved(err, line_number(data, offset))])
                continue
            now[key] = (line, op)
            delta = _op_delta(before[1], op) if before is not None else None
            if delta is not None:
                deltas.setdefault(mountpoint, {})[name] = delta
        self._last = now
        self._nfs_seen = bool(found)
        return NFSStats(self.clock(), _Tables(data, self._reader, self._reader_lock), deltas)

    def _check(self, path: str, data: bytes) -> None:
        """Raise UnusableInput when mountstats gave nothing to go by: every mount, NFS or not, has a ``device``
        line (the root filesystem at least), so a file without one that parses is empty, garbage or a torn read.
        Only then is the whole file parsed here, to count and name its bad lines."""
        lines, bad = self._lines.device_lines, self._lines.bad_device_lines
        if lines and bad < lines:
            return
        _, errors = parse_mountstats(data)
        self._log_bad_lines(errors)
        require_parsed(path, "'device ... mounted on ... with fstype ...' line", 0, errors)

    def close(self) -> None:
        pass
