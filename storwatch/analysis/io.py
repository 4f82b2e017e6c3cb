"""Join I/O facts onto mounts: the block device's counters, NFS statistics, probes, and the latency windows."""

from __future__ import annotations

import math

from storwatch.analysis.latency import LatencyWindows, MountLatency
from storwatch.analysis.view import MountIO
from storwatch.snapshot import Snapshot
from storwatch.sources.nfs import OpDelta
from storwatch.vocabulary import Mount

# NFS procedures that stand for a mount's reads, writes and fsyncs (COMMIT makes unstable writes durable).
NFS_OPS = {"read": "READ", "write": "WRITE", "fsync": "COMMIT"}


MOUNTS_COLLECTOR = "mounts"
"""The mount source's name in the snapshot's collector statuses."""
FORGET_EVERY_SECONDS = 10.0
"""How often ``forget`` looks for windows to let go of (it walks every mountpoint's windows)."""


class WindowFeeder:
    """Feeds each source's new facts into the latency windows exactly once, whatever the tick rate, and lets go of
    the windows of mounts that are gone."""

    def __init__(self, windows: LatencyWindows) -> None:
        self.windows = windows
        self._fed: dict[str, float] = {}
        """The timestamp of the facts last fed, by source ("diskstats", "nfs", "probe:<mountpoint>")."""
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

    def feed(self, snapshot: Snapshot) -> list[tuple[str, str, float, float, float, float]]:
        """Feed the windows; return the new samples as (mountpoint, operation, start, end, operations, seconds), the
        start being the previous reading's time (-inf for a source's first)."""
        samples: list[tuple[str, str, float, float, float]] = []
        spans: list[tuple[int, float]] = []  # (samples before this source's, its previous timestamp)
        add = samples.append
        disks = snapshot.disks
        if disks is not None and disks.deltas and (before := self._new("diskstats", disks.timestamp)) is not None:
            spans.append((len(samples), before))
            t = disks.timestamp
            for mount in snapshot.mounts:
                if mount.block is None:
                    continue
                d = disks.deltas.get(mount.block.device)
                if d is None:
                    continue
                mp = mount.mountpoint
                add((mp, "read", t, d.reads, d.read_time_seconds))
                add((mp, "write", t, d.writes, d.write_time_seconds))
                if d.flushes is not None and d.flush_time_seconds is not None:
                    add((mp, "fsync", t, d.flushes, d.flush_time_seconds))
        nfs = snapshot.nfs
        if nfs is not None and nfs.deltas and (before := self._new("nfs", nfs.timestamp)) is not None:
            spans.append((len(samples), before))
            t = nfs.timestamp
            for mp, ops in nfs.deltas.items():
                for op, name in NFS_OPS.items():
                    delta: OpDelta | None = ops.get(name)
                    if delta is not None:
                        add((mp, op, t, delta.requests, delta.execute_seconds))
        for probe in snapshot.probes:
            if probe.seconds is None:
                continue
            before = self._new(f"probe:{probe.mountpoint}", probe.timestamp)
            if before is not None:
                spans.append((len(samples), before))
                for op, seconds in probe.seconds.items():
                    add((probe.mountpoint, f"probe_{op}", probe.timestamp, 1, seconds))
        if samples:
            self.windows.add_all(samples)
        out: list[tuple[str, str, float, float, float, float]] = []
        bounds = [*spans[1:], (len(samples), 0.0)] if spans else []
        for (first, before), (end, _) in zip(spans, bounds, strict=True):
            out.extend((mp, op, before, t, ops, secs) for mp, op, t, ops, secs in samples[first:end])
        return out


def mount_io(mount: Mount, snapshot: Snapshot, windows: LatencyWindows | None) -> MountIO:
    device = mount.block.device if mount.block is not None else None
    counters = snapshot.disks.counters.get(device) if snapshot.disks is not None and device else None
    nfs = snapshot.nfs.mounts.get(mount.mountpoint) if snapshot.nfs is not None else None
    probe = next((p for p in snapshot.probes if p.mountpoint == mount.mountpoint), None)
    latency = MountLatency(windows, mount.mountpoint, snapshot.timestamp) if windows is not None else {}
    return MountIO(device=device, counters=counters, nfs=nfs, probe=probe, latency=latency)
