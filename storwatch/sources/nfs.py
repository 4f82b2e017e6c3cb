"""The NFS source: per-mount, per-operation RPC statistics from /proc/<pid>/mountstats, and their change."""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from storwatch.config import NFSConfig
from storwatch.paths import HostPaths
from storwatch.procfs.mountstats import (
    MountStatsError,
    NFSMount,
    OperationColumns,
    line_number,
    moved,
    parse_mountstats,
    parse_operation_times,
    parse_operation_times_all,
)
from storwatch.sources import FactsKey, OnceLog, read_first_named, require_parsed
from storwatch.sources.mountstats_reader import FoundLines, MountStatsReader, OperationLines

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


class _Read(NamedTuple):
    """The READ, WRITE and COMMIT lines of one read of mountstats that parsed, as columns: item i of each is one
    line's (the lines in file order)."""

    mountpoints: list[str]
    names: list[str]
    times: OperationColumns


class OpDeltas(Mapping[str, Mapping[str, OpDelta]]):
    """Per mountpoint and operation, the change between two reads of the operations that had requests, by
    mountpoint, then procedure: a mount seen twice on one mountpoint (one mounted over the other) counts as the
    later one, as the tables do.

    Kept as the two reads' columns and the lines that moved: the latency windows take :meth:`latency_samples` every
    second, and the OpDelta records, with their RTT and timeouts, are made when first asked for (History keeps this
    object, and a busy node's 192 records a second went unread)."""

    def __init__(
        self, now: _Read | None = None, before: OperationColumns | None = None, moved: list[int] | None = None
    ) -> None:
        self._now, self._before, self._moved = now, before, moved or []
        self._records: dict[str, dict[str, OpDelta]] | None = None

    def latency_samples(self) -> Iterator[tuple[str, str, int, float]]:
        """(mountpoint, procedure, requests, execute seconds) of each line that moved, in file order."""
        if self._now is None or self._before is None:
            return
        mountpoints, names = self._now.mountpoints, self._now.names
        requests, execute, before_requests, before_execute = (
            self._now.times.requests,
            self._now.times.execute_time_ms,
            self._before.requests,
            self._before.execute_time_ms,
        )
        for i in self._moved:
            yield (
                mountpoints[i],
                names[i],
                requests[i] - before_requests[i],
                max(0, execute[i] - before_execute[i]) / 1000.0,
            )

    def _by_mount(self) -> dict[str, dict[str, OpDelta]]:
        records = self._records
        if records is None:
            records = {}
            if self._now is not None and self._before is not None:
                now, before = self._now.times, self._before
                for i in self._moved:
                    records.setdefault(self._now.mountpoints[i], {})[self._now.names[i]] = OpDelta(
                        now.requests[i] - before.requests[i],
                        max(0, now.execute_time_ms[i] - before.execute_time_ms[i]) / 1000.0,
                        max(0, now.rtt_ms[i] - before.rtt_ms[i]) / 1000.0,
                        max(0, now.major_timeouts[i] - before.major_timeouts[i]),
                    )
            self._records = records
        return records

    def __bool__(self) -> bool:
        return bool(self._moved)

    def __getitem__(self, mountpoint: str) -> Mapping[str, OpDelta]:
        return self._by_mount()[mountpoint]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_mount())

    def __len__(self) -> int:
        return len(self._by_mount())

    def __repr__(self) -> str:
        return f"OpDeltas({self._by_mount()!r})"


NO_DELTAS = OpDeltas()


def _deltas(before: _Read | None, now: _Read) -> OpDeltas:
    """The change from ``before`` to ``now``, line by line. A line without one in ``before`` (a mount new since, or
    one whose line did not parse then) has none; neither has one whose requests went back (the mount was mounted
    again: its counters started again)."""
    if before is None:
        return NO_DELTAS
    if now.mountpoints == before.mountpoints and now.names == before.names:
        times = before.times
    else:
        # Mounts came or went since: line each line up with its own in ``before``, or with itself (no change).
        at = {key: i for i, key in enumerate(zip(before.mountpoints, before.names, strict=True))}
        where = [at.get(key, -1) for key in zip(now.mountpoints, now.names, strict=True)]
        times = OperationColumns(
            *(
                [old[j] if j >= 0 else new[i] for i, j in enumerate(where)]
                for old, new in zip(before.times, now.times, strict=True)
            )
        )
    moved = [i for i, change in enumerate(map(operator.sub, now.times.requests, times.requests)) if change > 0]
    if moved and len(set(zip(now.mountpoints, now.names, strict=True))) < len(now.mountpoints):
        last = {key: i for i, key in enumerate(zip(now.mountpoints, now.names, strict=True))}
        moved = [i for i in moved if last[now.mountpoints[i], now.names[i]] == i]
    return OpDeltas(now, times, moved)


def latency_samples(deltas: Mapping[str, Mapping[str, OpDelta]]) -> Iterator[tuple[str, str, int, float]]:
    """(mountpoint, procedure, requests, execute seconds) of every change in ``deltas``."""
    if isinstance(deltas, OpDeltas):
        yield from deltas.latency_samples()
        return
    for mountpoint, ops in deltas.items():
        for name, delta in ops.items():
            yield mountpoint, name, delta.requests, delta.execute_seconds


@dataclass(frozen=True)
class NFSStats:
    timestamp: float
    mounts: Mapping[str, NFSMount]
    """Every NFS mount's counters since it was mounted, by mountpoint: the whole file is read into tables when first
    looked at (a scrape, the status page), not every second; each table is parsed when first used."""
    deltas: Mapping[str, Mapping[str, OpDelta]]
    """Per mountpoint and operation in DELTA_OPERATIONS, the change since the previous read (those with requests)."""
    since: float | None = None
    """The previous read's timestamp, where ``deltas`` start (None: no deltas, or not known): a reader that did not
    take that read's facts works out its own deltas (:func:`deltas_since`)."""
    read: _Read | None = field(default=None, repr=False, compare=False)
    """This read's lines as columns, for :func:`deltas_since` (not kept in History)."""


def deltas_since(before: NFSStats, now: NFSStats) -> Mapping[str, Mapping[str, OpDelta]]:
    """The change from ``before`` (facts of an earlier read) to ``now``: ``now``'s own deltas when they start there."""
    if now.since is None or now.since == before.timestamp or before.read is None or now.read is None:
        return now.deltas
    return _deltas(before.read, now.read)


def _nfs_for_history(facts: NFSStats) -> NFSStats:
    # Every mount's per-op table only the newest snapshot needs; History keeps the deltas.
    return NFSStats(facts.timestamp, {}, facts.deltas, facts.since)


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
        self._last: _Read | None = None
        """The lines of the last read that parsed."""
        self._last_at = 0.0
        """That read's timestamp."""

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
        found = self._lines.columns(data)
        self._check(path, data)
        times = parse_operation_times_all(found.lines)
        read = _Read(found.mountpoints, found.names, times) if times is not None else self._parse_each(data, found)
        deltas = _deltas(self._last, read)
        now = self.clock()
        since = self._last_at if self._last is not None else None
        self._last, self._last_at = read, now
        self._nfs_seen = bool(found.lines)
        return NFSStats(now, _Tables(data, self._reader, self._reader_lock), deltas, since, read)

    def _parse_each(self, data: bytes, found: FoundLines) -> _Read:
        """The lines parsed one by one, when not all are of the usual shape: each bad one logged and left out."""
        read = _Read([], [], OperationColumns([], [], [], []))
        for mountpoint, name, line, offset in zip(*found, strict=True):
            try:
                op = parse_operation_times(line)
            except MountStatsError as err:
                self._log_bad_lines([moved(err, line_number(data, offset))])
                continue
            read.mountpoints.append(mountpoint)
            read.names.append(name)
            for column, value in zip(read.times, op, strict=True):
                column.append(value)
        return read

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
