"""The I/O area: block device counters (storwatch_disk_*), each mount's I/O joined from its device or its NFS
statistics and its latency windows (storwatch_mount_device_info, storwatch_mount_*_total,
storwatch_mount_latency_seconds), and the active probes (storwatch_probe_*).

Two functions, because the scrape writes the NFS area between the per-mount I/O and the probes: ``families`` and
``probe_families``."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter.area import ExportState
from storwatch.exporter.text import Family, label_value, labels_text
from storwatch.procfs.diskstats import DiskStats
from storwatch.procfs.mountstats import NFSMount
from storwatch.sources.mounts import display_path
from storwatch.sources.probe import BUCKETS

_MS = 0.001

# (metric, help) for per-device counters, named as node_exporter names them so dashboards carry over.
_DISK_COUNTERS = (
    ("storwatch_disk_reads_completed_total", "Reads completed successfully."),
    ("storwatch_disk_reads_merged_total", "Adjacent reads merged before being issued."),
    ("storwatch_disk_read_bytes_total", "Bytes read."),
    ("storwatch_disk_read_time_seconds_total", "Time spent on reads (sum over all reads)."),
    ("storwatch_disk_writes_completed_total", "Writes completed successfully."),
    ("storwatch_disk_writes_merged_total", "Adjacent writes merged before being issued."),
    ("storwatch_disk_written_bytes_total", "Bytes written."),
    ("storwatch_disk_write_time_seconds_total", "Time spent on writes (sum over all writes)."),
    ("storwatch_disk_discards_completed_total", "Discards completed successfully."),
    ("storwatch_disk_discarded_bytes_total", "Bytes discarded."),
    ("storwatch_disk_discard_time_seconds_total", "Time spent on discards."),
    ("storwatch_disk_flush_requests_total", "Flush requests completed successfully."),
    ("storwatch_disk_flush_requests_time_seconds_total", "Time spent on flush requests."),
    ("storwatch_disk_io_time_seconds_total", "Time the device had I/O in flight."),
    ("storwatch_disk_io_time_weighted_seconds_total", "I/O time weighted by the number of I/Os in flight."),
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
    ("storwatch_mount_reads_completed_total", "Reads completed on the mount's device (NFS: READ requests)."),
    ("storwatch_mount_read_bytes_total", "Bytes read from the mount's device (NFS: bytes received by READ)."),
    ("storwatch_mount_read_time_seconds_total", "Time spent on reads (NFS: READ execute time)."),
    ("storwatch_mount_writes_completed_total", "Writes completed on the mount's device (NFS: WRITE requests)."),
    ("storwatch_mount_written_bytes_total", "Bytes written to the mount's device (NFS: bytes sent by WRITE)."),
    ("storwatch_mount_write_time_seconds_total", "Time spent on writes (NFS: WRITE execute time)."),
    ("storwatch_mount_flushes_completed_total", "Flushes completed on the mount's device (NFS: COMMIT requests)."),
    ("storwatch_mount_flush_time_seconds_total", "Time spent on flushes (NFS: COMMIT execute time)."),
)


def _mount_disk_values(d: DiskStats, partition: bool = False) -> list[tuple[str, float | None]]:
    flushes = None if partition else d.flushes_completed
    flush_ms = None if partition else d.flush_time_ms
    return [
        ("storwatch_mount_reads_completed_total", d.reads_completed),
        ("storwatch_mount_read_bytes_total", d.read_bytes),
        ("storwatch_mount_read_time_seconds_total", d.read_time_ms * _MS),
        ("storwatch_mount_writes_completed_total", d.writes_completed),
        ("storwatch_mount_written_bytes_total", d.written_bytes),
        ("storwatch_mount_write_time_seconds_total", d.write_time_ms * _MS),
        ("storwatch_mount_flushes_completed_total", flushes),
        ("storwatch_mount_flush_time_seconds_total", None if flush_ms is None else flush_ms * _MS),
    ]


def _mount_nfs_values(nfs: NFSMount) -> list[tuple[str, float | None]]:
    out: list[tuple[str, float | None]] = []
    for name, ops_metric, bytes_metric, time_metric, use_sent in (
        ("READ", "reads_completed", "read_bytes", "read_time_seconds", False),
        ("WRITE", "writes_completed", "written_bytes", "write_time_seconds", True),
        ("COMMIT", "flushes_completed", None, "flush_time_seconds", False),
    ):
        op = nfs.operation(name)
        if op is None:
            continue
        out.append((f"storwatch_mount_{ops_metric}_total", op.requests))
        out.append((f"storwatch_mount_{time_metric}_total", op.execute_time_ms * _MS))
        if bytes_metric is not None:
            out.append((f"storwatch_mount_{bytes_metric}_total", op.bytes_sent if use_sent else op.bytes_received))
    return out


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    """Block devices, then each mount's I/O and latency windows."""
    if view is None:
        return
    yield from _disks(view)
    yield from _mount_io(view)


def _disks(view: View) -> Iterator[Family]:
    disks = view.disks
    if disks is None:
        return
    counters = [Family(name, help_, "counter") for name, help_ in _DISK_COUNTERS]
    in_flight = Family("storwatch_disk_io_now", "I/Os in flight on the device.")
    util = Family("storwatch_disk_utilization_ratio", "Share of the last interval the device was busy.")
    for name, d in sorted(disks.counters.items()):
        if d.reads_completed == 0 and d.writes_completed == 0:
            continue  # never used (spare loop devices, empty drives): not worth a series
        labels = labels_text(("device", name))
        for family, value in zip(counters, _disk_values(d), strict=True):
            family.add_text(labels, value)
        in_flight.add_text(labels, d.in_flight)
        delta = disks.deltas.get(name)
        if delta is not None:
            util.add_text(labels, delta.utilisation)
    yield from (*counters, in_flight, util)


def _mount_io(view: View) -> Iterator[Family]:
    device = Family(
        "storwatch_mount_device_info",
        "The block device a mount's I/O counters come from, and the devices at the bottom of its stack.",
    )
    counters = {name: Family(name, help_, "counter") for name, help_ in _MOUNT_COUNTERS}
    latency = Family(
        "storwatch_mount_latency_seconds",
        "Per-mount operation latency over a window: p50, p95 and max of per-interval averages, and the mean.",
    )
    for mv in view.mounts:
        mp = display_path(mv.mount.mountpoint)
        labels = labels_text(("mountpoint", mp))
        io = mv.io
        block = mv.mount.block
        if block is not None:
            device.add_text(
                labels_text(("device", block.device), ("mountpoint", mp), ("physical", ",".join(block.physical))), 1
            )
        values: list[tuple[str, float | None]] = []
        if io.counters is not None:
            values = _mount_disk_values(io.counters, partition=bool(block and block.partition))
        elif io.nfs is not None:
            values = _mount_nfs_values(io.nfs)
        for metric, value in values:
            counters[metric].add_text(labels, value)
        quoted = label_value(mp)
        for op, summary in sorted(io.latency.items()):
            for window, stats in (("1m", summary.minute), ("1h", summary.hour)):
                prefix = f'{{mountpoint="{quoted}",op="{label_value(op)}",stat="'
                latency.add_text(f'{prefix}p50",window="{window}"}}', stats.p50_seconds)
                latency.add_text(f'{prefix}p95",window="{window}"}}', stats.p95_seconds)
                latency.add_text(f'{prefix}max",window="{window}"}}', stats.max_seconds)
                latency.add_text(f'{prefix}mean",window="{window}"}}', stats.mean_seconds)
    yield device
    yield from counters.values()
    yield latency


_PROBE_BOUNDS = (*(str(b) for b in BUCKETS), "+Inf")


def probe_families(view: View | None, state: ExportState) -> Iterator[Family]:
    """The active probes of the mounts that have one; nothing on a node without any."""
    if view is None:
        return
    labels = ("mountpoint", "op")
    hist = Family(
        "storwatch_probe_duration_seconds",
        "Active probe latency per operation (write, fsync, read back) of a small file on the mount.",
        "histogram",
        labels,
    )
    success = Family(
        "storwatch_probe_success",
        "1 when the mount's last probe completed and read back what it wrote.",
        labels=["mountpoint"],
    )
    stuck = Family(
        "storwatch_probe_stuck", "1 when the mount's probe has not returned within its deadline.", labels=["mountpoint"]
    )
    last = Family(
        "storwatch_probe_last_timestamp_seconds", "Unix time of the mount's last probe round.", labels=["mountpoint"]
    )
    any_probe = False
    for mv in view.mounts:
        probe = mv.io.probe
        if probe is None:
            continue
        any_probe = True
        mp = display_path(mv.mount.mountpoint)
        for op, h in sorted(probe.histograms.items()):
            hist.add_histogram([mp, op], list(zip(_PROBE_BOUNDS, (float(c) for c in h.buckets), strict=True)), h.sum)
        success.add([mp], 1 if probe.seconds is not None else 0)
        stuck.add([mp], 1 if probe.stuck else 0)
        last.add([mp], probe.timestamp)
    if any_probe:
        yield from (hist, success, stuck, last)
