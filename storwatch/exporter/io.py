"""The I/O area: block device counters (storwatch_disk_*), each mount's I/O joined from its device or its NFS
statistics and its latency windows (storwatch_mount_device_info, storwatch_mount_*_total,
storwatch_mount_latency_seconds), and the active probes (storwatch_probe_*).

Two functions, because the scrape writes the NFS area between the per-mount I/O and the probes: ``families`` and
``probe_families``."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter.area import ExportState
from storwatch.exporter.spec import MOUNTPOINT, Label, MetricSpec, counter, gauge, metric
from storwatch.exporter.text import Family, label_value
from storwatch.labels import PROBE_BUCKETS, PROBE_OPS
from storwatch.printable import shown
from storwatch.procfs.diskstats import DiskStats
from storwatch.procfs.mountstats import NFSMount

# -- the metrics this area writes (storwatch/exporter/catalog.py assembles them)

BLOCK_DEVICE = Label("device", "one per block device in diskstats that has been read or written")

# -- io: block devices (named as node_exporter names them, so dashboards carry over)

DISK_READS_COMPLETED = counter(
    "io", "storwatch_disk_reads_completed_total", "Reads completed successfully.", BLOCK_DEVICE
)
DISK_READS_MERGED = counter(
    "io", "storwatch_disk_reads_merged_total", "Adjacent reads merged before being issued.", BLOCK_DEVICE
)
DISK_READ_BYTES = counter("io", "storwatch_disk_read_bytes_total", "Bytes read.", BLOCK_DEVICE)
DISK_READ_TIME = counter(
    "io", "storwatch_disk_read_time_seconds_total", "Time spent on reads (sum over all reads).", BLOCK_DEVICE
)
DISK_WRITES_COMPLETED = counter(
    "io", "storwatch_disk_writes_completed_total", "Writes completed successfully.", BLOCK_DEVICE
)
DISK_WRITES_MERGED = counter(
    "io", "storwatch_disk_writes_merged_total", "Adjacent writes merged before being issued.", BLOCK_DEVICE
)
DISK_WRITTEN_BYTES = counter("io", "storwatch_disk_written_bytes_total", "Bytes written.", BLOCK_DEVICE)
DISK_WRITE_TIME = counter(
    "io", "storwatch_disk_write_time_seconds_total", "Time spent on writes (sum over all writes).", BLOCK_DEVICE
)
DISK_DISCARDS_COMPLETED = counter(
    "io", "storwatch_disk_discards_completed_total", "Discards completed successfully.", BLOCK_DEVICE
)
DISK_DISCARDED_BYTES = counter("io", "storwatch_disk_discarded_bytes_total", "Bytes discarded.", BLOCK_DEVICE)
DISK_DISCARD_TIME = counter("io", "storwatch_disk_discard_time_seconds_total", "Time spent on discards.", BLOCK_DEVICE)
DISK_FLUSH_REQUESTS = counter(
    "io", "storwatch_disk_flush_requests_total", "Flush requests completed successfully.", BLOCK_DEVICE
)
DISK_FLUSH_REQUESTS_TIME = counter(
    "io", "storwatch_disk_flush_requests_time_seconds_total", "Time spent on flush requests.", BLOCK_DEVICE
)
DISK_IO_TIME = counter("io", "storwatch_disk_io_time_seconds_total", "Time the device had I/O in flight.", BLOCK_DEVICE)
DISK_IO_TIME_WEIGHTED = counter(
    "io",
    "storwatch_disk_io_time_weighted_seconds_total",
    "I/O time weighted by the number of I/Os in flight.",
    BLOCK_DEVICE,
)
DISK_IO_NOW = gauge("io", "storwatch_disk_io_now", "I/Os in flight on the device.", BLOCK_DEVICE)
DISK_UTILIZATION = gauge(
    "io", "storwatch_disk_utilization_ratio", "Share of the last interval the device was busy.", BLOCK_DEVICE
)


# -- io: each mount's I/O (its block device's, or for NFS the READ/WRITE/COMMIT procedures')

MOUNT_DEVICE_INFO = gauge(
    "io",
    "storwatch_mount_device_info",
    "The block device a mount's I/O counters come from, and the devices at the bottom of its stack.",
    MOUNTPOINT,
    Label("device", "one per mount: the block device under it"),
    Label("physical", "one per mount: the devices at the bottom of its stack, comma-separated"),
)
MOUNT_READS_COMPLETED = counter(
    "io",
    "storwatch_mount_reads_completed_total",
    "Reads completed on the mount's device (NFS: READ requests).",
    MOUNTPOINT,
)
MOUNT_READ_BYTES = counter(
    "io",
    "storwatch_mount_read_bytes_total",
    "Bytes read from the mount's device (NFS: bytes received by READ).",
    MOUNTPOINT,
)
MOUNT_READ_TIME = counter(
    "io", "storwatch_mount_read_time_seconds_total", "Time spent on reads (NFS: READ execute time).", MOUNTPOINT
)
MOUNT_WRITES_COMPLETED = counter(
    "io",
    "storwatch_mount_writes_completed_total",
    "Writes completed on the mount's device (NFS: WRITE requests).",
    MOUNTPOINT,
)
MOUNT_WRITTEN_BYTES = counter(
    "io",
    "storwatch_mount_written_bytes_total",
    "Bytes written to the mount's device (NFS: bytes sent by WRITE).",
    MOUNTPOINT,
)
MOUNT_WRITE_TIME = counter(
    "io", "storwatch_mount_write_time_seconds_total", "Time spent on writes (NFS: WRITE execute time).", MOUNTPOINT
)
MOUNT_FLUSHES_COMPLETED = counter(
    "io",
    "storwatch_mount_flushes_completed_total",
    "Flushes completed on the mount's device (NFS: COMMIT requests).",
    MOUNTPOINT,
)
MOUNT_FLUSH_TIME = counter(
    "io",
    "storwatch_mount_flush_time_seconds_total",
    "Time spent on flushes (NFS: COMMIT execute time).",
    MOUNTPOINT,
)
MOUNT_LATENCY = gauge(
    "io",
    "storwatch_mount_latency_seconds",
    "Per-mount operation latency over a window: p50, p95 and max of per-interval averages (the hour's p50 and p95 of "
    "15 s averages), and the mean.",
    MOUNTPOINT,
    Label(
        "op",
        "the mount's own operations, then its probe's",
        ("read", "write", "fsync", *(f"probe_{op}" for op in PROBE_OPS)),
    ),
    Label("window", "the agent's two windows", ("1m", "1h")),
    Label("stat", "the statistics of a window", ("p50", "p95", "max", "mean")),
)


# -- io: active probes

PROBE_DURATION = metric(
    "histogram",
    "io",
    "storwatch_probe_duration_seconds",
    "Active probe latency per operation (write, fsync, read back) of a small file on the mount.",
    (MOUNTPOINT, Label("op", "the probe's steps", PROBE_OPS)),
)
PROBE_SUCCESS = gauge(
    "io",
    "storwatch_probe_success",
    "1 when the mount's last probe completed and read back what it wrote.",
    MOUNTPOINT,
)
PROBE_STUCK = gauge(
    "io", "storwatch_probe_stuck", "1 when the mount's probe has not returned within its deadline.", MOUNTPOINT
)
PROBE_LAST_TIMESTAMP = gauge(
    "io", "storwatch_probe_last_timestamp_seconds", "Unix time of the mount's last probe round.", MOUNTPOINT
)


_MS = 0.001

# Per-device counters, in the order of _disk_values.
_DISK_COUNTERS = (
    DISK_READS_COMPLETED,
    DISK_READS_MERGED,
    DISK_READ_BYTES,
    DISK_READ_TIME,
    DISK_WRITES_COMPLETED,
    DISK_WRITES_MERGED,
    DISK_WRITTEN_BYTES,
    DISK_WRITE_TIME,
    DISK_DISCARDS_COMPLETED,
    DISK_DISCARDED_BYTES,
    DISK_DISCARD_TIME,
    DISK_FLUSH_REQUESTS,
    DISK_FLUSH_REQUESTS_TIME,
    DISK_IO_TIME,
    DISK_IO_TIME_WEIGHTED,
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
    MOUNT_READS_COMPLETED,
    MOUNT_READ_BYTES,
    MOUNT_READ_TIME,
    MOUNT_WRITES_COMPLETED,
    MOUNT_WRITTEN_BYTES,
    MOUNT_WRITE_TIME,
    MOUNT_FLUSHES_COMPLETED,
    MOUNT_FLUSH_TIME,
)
# (procedure, its requests, its bytes (None: none counted), its time, whether its bytes are those sent)
_NFS_MOUNT_COUNTERS = (
    ("READ", MOUNT_READS_COMPLETED, MOUNT_READ_BYTES, MOUNT_READ_TIME, False),
    ("WRITE", MOUNT_WRITES_COMPLETED, MOUNT_WRITTEN_BYTES, MOUNT_WRITE_TIME, True),
    ("COMMIT", MOUNT_FLUSHES_COMPLETED, None, MOUNT_FLUSH_TIME, False),
)


def _mount_disk_values(d: DiskStats, partition: bool = False) -> list[tuple[MetricSpec, float | None]]:
    flushes = None if partition else d.flushes_completed
    flush_ms = None if partition else d.flush_time_ms
    return [
        (MOUNT_READS_COMPLETED, d.reads_completed),
        (MOUNT_READ_BYTES, d.read_bytes),
        (MOUNT_READ_TIME, d.read_time_ms * _MS),
        (MOUNT_WRITES_COMPLETED, d.writes_completed),
        (MOUNT_WRITTEN_BYTES, d.written_bytes),
        (MOUNT_WRITE_TIME, d.write_time_ms * _MS),
        (MOUNT_FLUSHES_COMPLETED, flushes),
        (MOUNT_FLUSH_TIME, None if flush_ms is None else flush_ms * _MS),
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
    in_flight = DISK_IO_NOW.family()
    util = DISK_UTILIZATION.family()
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
    device = MOUNT_DEVICE_INFO.family()
    counters = {spec: spec.family() for spec in _MOUNT_COUNTERS}
    latency = MOUNT_LATENCY.family()
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
            labels = counters[MOUNT_READS_COMPLETED].labels_for((mp,))
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
    hist = PROBE_DURATION.family()
    success = PROBE_SUCCESS.family()
    stuck = PROBE_STUCK.family()
    last = PROBE_LAST_TIMESTAMP.family()
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
