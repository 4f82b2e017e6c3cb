"""Join I/O facts onto mounts: the block device's counters, NFS statistics, probes, and the latency windows."""

from __future__ import annotations

import math
from collections.abc import Container

from storwatch.analysis.latency import LatencyWindows, MountLatency
from storwatch.analysis.view import MountIO
from storwatch.snapshot import Snapshot
from storwatch.sources import diskio, nfs
from storwatch.sources.diskio import DiskIO
from storwatch.sources.nfs import NFSStats, latency_samples
from storwatch.vocabulary import Mount

# NFS procedures that stand for a mount's reads, writes and fsyncs (COMMIT makes unstable writes durable).
NFS_OPS = {"read": "READ", "write": "WRITE", "fsync": "COMMIT"}
_WINDOW_OF_NFS_OP = {name: op for op, name in NFS_OPS.items()}


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
        self._disks: DiskIO | None = None
        self._nfs: NFSStats | None = None
        """The diskstats and NFS facts last taken: the counters the next ones' change is from."""
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
        if disks is not None and disks is not self._disks:
            last, self._disks = self._disks, disks
            disk_deltas = disks.deltas if last is None else diskio.deltas_since(last, disks)
            before = -math.inf if last is None else last.timestamp
        else:
            disk_deltas = None
        if disks is not None and disk_deltas:
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
        if stats is not None and stats.timestamp != (self._nfs.timestamp if self._nfs is not None else None):
            # Kept without its tables, which hold the whole file until parsed (100s of KB on a node of NFS mounts).
            last_stats, self._nfs = self._nfs, NFSStats(stats.timestamp, {}, {}, stats.since, stats.read)
            nfs_deltas = stats.deltas if last_stats is None else nfs.deltas_since(last_stats, stats)
            before = -math.inf if last_stats is None else last_stats.timestamp
        else:
            nfs_deltas = None
        if stats is not None and nfs_deltas:
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


def mount_io(mount: Mount, snapshot: Snapshot, windows: LatencyWindows | None) -> MountIO:
    device = mount.block.device if mount.block is not None else None
    counters = snapshot.disks.counters.get(device) if snapshot.disks is not None and device else None
    nfs = snapshot.nfs.mounts.get(mount.mountpoint) if snapshot.nfs is not None else None
    probe = next((p for p in snapshot.probes if p.mountpoint == mount.mountpoint), None)
    latency = MountLatency(windows, mount.mountpoint, snapshot.timestamp) if windows is not None else {}
    return MountIO(device=device, counters=counters, nfs=nfs, probe=probe, latency=latency)
