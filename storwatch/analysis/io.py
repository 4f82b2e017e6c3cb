"""Join I/O facts onto mounts: the block device's counters, NFS statistics, probes, and the latency windows."""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping
from typing import Any, Protocol, TypeVar

from storwatch.analysis.latency import LatencyWindows, MountLatency
from storwatch.analysis.view import MountIO
from storwatch.snapshot import Snapshot
from storwatch.sources import diskio, nfs
from storwatch.sources.nfs import NFSStats, latency_samples
from storwatch.vocabulary import Mount

# NFS procedures that stand for a mount's reads, writes and fsyncs (COMMIT makes unstable writes durable).
NFS_OPS = {"read": "READ", "write": "WRITE", "fsync": "COMMIT"}
_WINDOW_OF_NFS_OP = {name: op for op, name in NFS_OPS.items()}


class _Counted(Protocol):
    """Facts of a counters source: when they were read, and their change since the read before."""

    @property
    def timestamp(self) -> float: ...

    @property
    def deltas(self) -> Mapping[str, Any]: ...


_F = TypeVar("_F", bound=_Counted)

MOUNTS_COLLECTOR = "mounts"
"""The mount source's name in the snapshot's collector statuses."""
FORGET_EVERY_SECONDS = 10.0
"""How often ``forget`` looks for windows to let go of (it walks every mountpoint's windows)."""


class WindowFeeder:
    """Feeds each source's new facts into the latency windows exactly once, whatever the tick rate, and lets go of
    the windows of mounts that are gone.

    The tick takes only the newest facts of each source, and a source's worker can read twice between two ticks (a
    tick that takes a while; its cadence and the worker's drift apart): the device and NFS counters' change is then
    worked out from the facts fed last, so no second of I/O is lost and each sample's span is the one it covers."""

    def __init__(self, windows: LatencyWindows) -> None:
        self.windows = windows
        self._fed: dict[str, float] = {}
        """The timestamp of each mount's probe facts last fed, by "probe:<mountpoint>"."""
        self._taken: dict[str, Any] = {}
        """The diskstats and NFS facts last taken, by source: the counters the next ones' change is from."""
        self._next_forget = -math.inf

    def forget(self, snapshot: Snapshot) -> None:
        """At most every FORGET_EVERY_SECONDS: drop the windows of mounts gone from the mount table or idle for an
        hour, and the probe timestamps of mounts no longer probed. Without it a node whose pods come and go keeps
        every short-lived volume's windows for ever."""
        now = snapshot.timestamp
        if now < self._next_forget:
            return
        self._next_forget = now + FORGET_EVERY_SECONDS
        # When the mount table was last read: a mountpoint missing from it did I/O before then, or it is gone. No
        # successful read yet says nothing about what is gone.
        table_time = next(
            (c.last_success_timestamp for c in snapshot.collectors if c.name == MOUNTS_COLLECTOR and c.success), None
        )
        if not snapshot.mounts:  # a table without even / was not read right, whatever its collector says
            table_time = None
        self.windows.forget(now, {m.mountpoint for m in snapshot.mounts}, table_time)
        probed = {f"probe:{p.mountpoint}" for p in snapshot.probes}
        self._fed = {k: t for k, t in self._fed.items() if not k.startswith("probe:") or k in probed}

    def _change(
        self,
        source: str,
        facts: _F,
        deltas_since: Callable[[_F, _F], Mapping[str, Any]],
        kept: Callable[[_F], _F] | None = None,
    ) -> tuple[Mapping[str, Any], float] | None:
        """New facts of ``source`` (a counters source: diskstats, NFS): their change since the facts taken last, and
        when those were read (-inf the first time); None for facts taken already. ``kept``: what is kept of them for
        the next change (all of them by default)."""
        last = self._taken.get(source)
        if last is not None and last.timestamp == facts.timestamp:
            return None
        self._taken[source] = facts if kept is None else kept(facts)
        if last is None:
            return facts.deltas, -math.inf
        return deltas_since(last, facts), last.timestamp

    def _new(self, source: str, timestamp: float) -> float | None:
        """The previous facts' timestamp when these are new (-inf the first time), else None."""
        before = self._fed.get(source, -math.inf)
        if before == timestamp:
            return None
        self._fed[source] = timestamp
        return before

    def feed(
        self, snapshot: Snapshot, keep: Container[str] | None = None
    ) -> list[tuple[str, str, float, float, float, float]]:
        """Feed the windows; return the new samples as (mountpoint, operation, start, end, operations, seconds), the
        start being the previous reading's time (-inf for a source's first): those of the mountpoints in ``keep``
        only, when given (the stall tracker judges the few mounts a GPU's work touches; the windows take every
        mount's)."""
        samples: list[tuple[str, str, float, float, float]] = []
        out: list[tuple[str, str, float, float, float, float]] = []
        add = samples.append

        def taken(first: int, before: float) -> None:
            # This source's samples, from ``first`` on, for the caller.
            out.extend(
                (mp, op, before, t, ops, secs) for mp, op, t, ops, secs in samples[first:] if keep is None or mp in keep
            )

        disks = snapshot.disks
        change = None if disks is None else self._change("diskstats", disks, diskio.deltas_since)
        if disks is not None and change is not None and change[0]:
            disk_deltas, before = change
            first = len(samples)
            t = disks.timestamp
            for mount in snapshot.mounts:
                if mount.block is None:
                    continue
                d = disk_deltas.get(mount.block.device)
                if d is None:
                    continue
                mp = mount.mountpoint
                add((mp, "read", t, d.reads, d.read_time_seconds))
                add((mp, "write", t, d.writes, d.write_time_seconds))
                if d.flushes is not None and d.flush_time_seconds is not None:
                    add((mp, "fsync", t, d.flushes, d.flush_time_seconds))
            taken(first, before)
        stats = snapshot.nfs
        nfs_change = None if stats is None else self._change("nfs", stats, nfs.deltas_since, _without_tables)
        if stats is not None and nfs_change is not None and nfs_change[0]:
            nfs_deltas, before = nfs_change
            first = len(samples)
            t = stats.timestamp
            window_of = _WINDOW_OF_NFS_OP
            for mp, name, requests, seconds in latency_samples(nfs_deltas):
                op = window_of.get(name)
                if op is not None:
                    add((mp, op, t, requests, seconds))
            taken(first, before)
        for probe in snapshot.probes:
            if probe.seconds is None:
                continue
            probed_before = self._new(f"probe:{probe.mountpoint}", probe.timestamp)
            if probed_before is not None:
                first = len(samples)
                for op, seconds in probe.seconds.items():
                    add((probe.mountpoint, f"probe_{op}", probe.timestamp, 1, seconds))
                taken(first, probed_before)
        if samples:
            self.windows.add_all(samples)
        return out


def _without_tables(stats: NFSStats) -> NFSStats:
    """What the feeder keeps of NFS facts: not their tables, which hold the whole file until parsed (100s of KB on a
    node of NFS mounts)."""
    return NFSStats(stats.timestamp, {}, {}, stats.since, stats.read)


def mount_io(mount: Mount, snapshot: Snapshot, windows: LatencyWindows | None) -> MountIO:
    device = mount.block.device if mount.block is not None else None
    counters = snapshot.disks.counters.get(device) if snapshot.disks is not None and device else None
    nfs = snapshot.nfs.mounts.get(mount.mountpoint) if snapshot.nfs is not None else None
    probe = next((p for p in snapshot.probes if p.mountpoint == mount.mountpoint), None)
    latency = MountLatency(windows, mount.mountpoint, snapshot.timestamp) if windows is not None else {}
    return MountIO(device=device, counters=counters, nfs=nfs, probe=probe, latency=latency)
