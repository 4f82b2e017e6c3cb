"""The I/O area: block device counters (storwatch_disk_*), each mount's I/O joined from its device or its NFS
statistics and its latency windows (storwatch_mount_device_info, storwatch_mount_*_total,
storwatch_mount_latency_seconds), and the active probes (storwatch_probe_*).

Two functions, because the scrape writes the NFS area between the per-mount I/O and the probes: ``families`` and
``probe_families``."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter import catalog
from storwatch.exporter.area import ExportState
from storwatch.exporter.catalog import MetricSpec
from storwatch.exporter.text import Family, label_value
from storwatch.labels import PROBE_BUCKETS
from storwatch.printable import shown
from storwatch.procfs.diskstats import DiskStats
from storwatch.procfs.mountstats import NFSMount

_MS = 0.001

# Per-device counters, in the order of _disk_values.
_DISK_COUNTERS = (
    catalog.DISK_READS_COMPLETED,
    catalog.DISK_READS_MERGED,
    catalog.DISK_READ_BYTES,
    catalog.DISK_READ_TIME,
    catalog.DISK_WRITES_COMPLETED,
    catalog.DISK_WRITES_MERGED,
    catalog.DISK_WRITTEN_BYTES,
    catalog.DISK_WRITE_TIME,
    catalog.DISK_DISCARDS_COMPLETED,
    catalog.DISK_DISCARDED_BYTES,
    catalog.DISK_DISCARD_TIME,
    catalog.DISK_FLUSH_REQUESTS,
    catalog.DISK_FLUSH_REQUESTS_TIME,
    catalog.DISK_IO_TIME,
    catalog.DISK_IO_TIME_WEIGHTED,
)


def _ms(v: int | None) -> float | None:
    return None if v is None else v * _MS


def _disk_values(d: DiskStats) -> tuple[float | None, ...]:
    """The device's counters in the order of _DISK_COUNTERS."""
    return (
        d.reads_completed,
        d.reads_merged,
        d.read_bytes,
        _ms(d.read_time_ms),
        d.writes_completed,
        d.writes_merged,
        d.written_bytes,
        _ms(d.write_time_ms),
        d.discards_completed,
        d.discarded_bytes,
        _ms(d.discard_time_ms),
        d.flushes_completed,
        _ms(d.flush_time_ms),
        _ms(d.io_time_ms),
        _ms(d.weighted_io_time_ms),
    )


# Per-mount counters: the block device's under it, or for NFS the READ/WRITE/COMMIT procedures' (execute time).
_MOUNT_COUNTERS = (
    catalog.MOUNT_READS_COMPLETED,
    catalog.MOUNT_READ_BYTES,
    catalog.MOUNT_READ_TIME,
    catalog.MOUNT_WRITES_COMPLETED,
    catalog.MOUNT_WRITTEN_BYTES,
    catalog.MOUNT_WRITE_TIME,
    catalog.MOUNT_FLUSHES_COMPLETED,
    catalog.MOUNT_FLUSH_TIME,
)
# (procedure, its requests, its bytes (None: none counted), its time, whether its bytes are those sent)
_NFS_MOUNT_COUNTERS = (
    ("READ", catalog.MOUNT_READS_COMPLETED, catalog.MOUNT_READ_BYTES, catalog.MOUNT_READ_TIME, False),
    ("WRITE", catalog.MOUNT_WRITES_COMPLETED, catalog.MOUNT_WRITTEN_BYTES, catalog.MOUNT_WRITE_TIME, True),
    ("COMMIT", catalog.MOUNT_FLUSHES_COMPLETED, None, catalog.MOUNT_FLUSH_TIME, False),
)


def _mount_disk_values(d: DiskStats, partition: bool = False) -> list[tuple[MetricSpec, float | None]]:
    flushes = None if partition else d.flushes_completed
    flush_ms = None if partition else d.flush_time_ms
    return [
        (catalog.MOUNT_READS_COMPLETED, d.reads_completed),
        (catalog.MOUNT_READ_BYTES, d.read_bytes),
        (catalog.MOUNT_READ_TIME, d.read_time_ms * _MS),
        (catalog.MOUNT_WRITES_COMPLETED, d.writes_completed),
        (catalog.MOUNT_WRITTEN_BYTES, d.written_bytes),
        (catalog.MOUNT_WRITE_TIME, d.write_time_ms * _MS),
        (catalog.MOUNT_FLUSHES_COMPLETED, flushes),
        (catalog.MOUNT_FLUSH_TIME, None if flush_ms is None else flush_ms * _MS),
    ]


def _mount_nfs_values(nfs: NFSMount) -> list[tuple[MetricSpec, float | None]]:
    out: list[tuple[MetricSpec, float | None]] = []
    for name, ops_metric, bytes_metric, time_metric, use_sent in _NFS_MOUNT_COUNTERS:
        op = nfs.operation(name)
        if op is None:
            continue
        out.append((ops_metric, op.requests))
        out.append((time_metric, op.execute_time_ms * _MS))
        if bytes_metric is not None:
            out.append((bytes_metric, op.bytes_sent if use_sent else op.bytes_received))
    return out


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    """Block devices, then each mount's I/O and latency windows."""
    if view is None:
        return
    yield from _disks(view)
    yield from _mount_io(view, state.unexported_mounts(view))


def _disks(view: View) -> Iterator[Family]:
    disks = view.disks
    if disks is None:
        return
    counters = [spec.family() for spec in _DISK_COUNTERS]
    in_flight = catalog.DISK_IO_NOW.family()
    util = catalog.DISK_UTILIZATION.family()
    for name, d in sorted(disks.counters.items()):
        if d.reads_completed == 0 and d.writes_completed == 0:
            continue  # never used (spare loop devices, empty drives): not worth a series
        labels = in_flight.labels_for((name,))
        for family, value in zip(counters, _disk_values(d), strict=True):
            family.add_text(labels, value)
        in_flight.add_text(labels, d.in_flight)
        delta = disks.deltas.get(name)
        if delta is not None:
            util.add_text(labels, delta.utilisation)
    yield from (*counters, in_flight, util)


def _mount_io(view: View, left_out: frozenset[str]) -> Iterator[Family]:
    device = catalog.MOUNT_DEVICE_INFO.family()
    counters = {spec: spec.family() for spec in _MOUNT_COUNTERS}
    latency = catalog.MOUNT_LATENCY.family()
    # A series per mount, operation, window and statistic: per window and statistic, a template of the label set
    # that each mount and operation fills.
    minute, hour = (
        tuple(latency.labels_template({"window": window, "stat": stat}) for stat in ("p50", "p95", "max", "mean"))
        for window in ("1m", "1h")
    )
    for mv in view.mounts:
        if mv.mount.mountpoint in left_out:
            continue
        mp = shown(mv.mount.mountpoint)
        io = mv.io
        block = mv.mount.block
        if block is not None:
            device.add((mp, block.device, ",".join(block.physical)), 1)
        values: list[tuple[MetricSpec, float | None]] = []
        if io.counters is not None:
            values = _mount_disk_values(io.counters, partition=bool(block and block.partition))
        elif io.nfs is not None:
            values = _mount_nfs_values(io.nfs)
        if values:
            labels = counters[catalog.MOUNT_READS_COMPLETED].labels_for((mp,))
            for spec, value in values:
                counters[spec].add_text(labels, value)
        quoted = label_value(mp)
        for op, summary in sorted(io.latency.items()):
            quoted_op = label_value(op)
            for (p50, p95, most, mean), w in ((minute, summary.minute), (hour, summary.hour)):
                latency.add_text(p50.format(quoted, quoted_op), w.p50_seconds)
                latency.add_text(p95.format(quoted, quoted_op), w.p95_seconds)
                latency.add_text(most.format(quoted, quoted_op), w.max_seconds)
                latency.add_text(mean.format(quoted, quoted_op), w.mean_seconds)
    yield device
    yield from counters.values()
    yield latency


_PROBE_BOUNDS = (*(str(b) for b in PROBE_BUCKETS), "+Inf")


def probe_families(view: View | None, state: ExportState) -> Iterator[Family]:
    """The active probes of the mounts that have one; nothing on a node without any."""
    if view is None:
        return
    hist = catalog.PROBE_DURATION.family()
    success = catalog.PROBE_SUCCESS.family()
    stuck = catalog.PROBE_STUCK.family()
    last = catalog.PROBE_LAST_TIMESTAMP.family()
    any_probe = False
    left_out = state.unexported_mounts(view)  # a probed mount ranks above an idle one: it is cut only past the rest
    for mv in view.mounts:
        if mv.mount.mountpoint in left_out:
            continue
        probe = mv.io.probe
        if probe is None:
            continue
        any_probe = True
        mp = shown(mv.mount.mountpoint)
        for op, h in sorted(probe.histograms.items()):
            hist.add_histogram([mp, op], list(zip(_PROBE_BOUNDS, (float(c) for c in h.buckets), strict=True)), h.sum)
        success.add([mp], 1 if probe.seconds is not None else 0)
        stuck.add([mp], 1 if probe.stuck else 0)
        last.add([mp], probe.timestamp)
    if any_probe:
        yield from (hist, success, stuck, last)
