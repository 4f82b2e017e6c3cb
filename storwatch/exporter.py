"""The exporter: renders a View to Prometheus exposition text, once per tick; /metrics serves the cached bytes."""

from __future__ import annotations

import platform as _platform
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import cast

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from storwatch import __version__
from storwatch.analysis.view import View
from storwatch.config import ALL_NFS_OPERATIONS, DEFAULT_NFS_OPERATIONS
from storwatch.procfs.diskstats import DiskStats
from storwatch.procfs.mountstats import NFSMount, NFSOperation
from storwatch.sources.mounts import display_path
from storwatch.sources.probe import BUCKETS
from storwatch.vocabulary import Durability

EMPTY_VIEW_TIMESTAMP = 0.0


def _counter(name: str, help_: str, labels: list[str]) -> CounterMetricFamily:
    # CounterMetricFamily adds the _total suffix itself.
    return CounterMetricFamily(name.removesuffix("_total"), help_, labels=labels)


_MS = 0.001
_DURABILITIES = tuple(Durability)

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


def _disk_values(d: DiskStats) -> tuple[float | None, ...]:
    """The device's counters in the order of _DISK_COUNTERS."""

    def ms(v: int | None) -> float | None:
        return None if v is None else v * _MS

    return (
        d.reads_completed,
        d.reads_merged,
        d.read_bytes,
        ms(d.read_time_ms),
        d.writes_completed,
        d.writes_merged,
        d.written_bytes,
        ms(d.write_time_ms),
        d.discards_completed,
        d.discarded_bytes,
        ms(d.discard_time_ms),
        d.flushes_completed,
        ms(d.flush_time_ms),
        ms(d.io_time_ms),
        ms(d.weighted_io_time_ms),
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


_NFS_OP_COUNTERS = (
    ("storwatch_nfs_operations_total", "RPC requests made, per NFS operation."),
    ("storwatch_nfs_transmissions_total", "RPC transmissions, retransmissions included."),
    ("storwatch_nfs_major_timeouts_total", "Requests that hit a major timeout (server not responding)."),
    ("storwatch_nfs_sent_bytes_total", "Bytes sent for these requests, headers included."),
    ("storwatch_nfs_received_bytes_total", "Bytes received in replies, headers included."),
    ("storwatch_nfs_queue_seconds_total", "Time requests waited before transmission."),
    ("storwatch_nfs_rtt_seconds_total", "Time from transmission to reply."),
    ("storwatch_nfs_execute_seconds_total", "Time from creation to completion (queue + RTT + client processing)."),
    ("storwatch_nfs_errors_total", "Requests that completed with an error status."),
)


class TextFamily(Metric):
    """A family whose samples are already written in the text format (labels sorted and escaped, values formatted as
    render_text formats them), in chunks of whole lines: for the families with a series or more per mount, device or
    NFS procedure, which are nearly all of a large node's series. Building a prometheus_client Sample per series and
    formatting it cost about 6 us; a line written at once about 1. ``samples`` stays empty; a consumer other than
    render_text would see no samples (tests parse the lines back to check them)."""

    def __init__(self, name: str, documentation: str, lines: list[str], typ: str = "counter") -> None:
        super().__init__(name.removesuffix("_total") if typ == "counter" else name, documentation, typ)
        self.lines = lines


class _Lines:
    """One TextFamily being written: ``add`` takes the label set already written (``_labels``) and the value."""

    __slots__ = ("documentation", "lines", "name", "typ")

    def __init__(self, name: str, documentation: str, typ: str = "gauge") -> None:
        self.name, self.documentation, self.typ = name, documentation, typ
        self.lines: list[str] = []

    def add(self, labels: str, value: float | None) -> None:
        if value is not None:
            self.lines.append(f"{self.name}{labels} {_value_text(value)}\n")

    def family(self) -> TextFamily:
        return TextFamily(self.name, self.documentation, self.lines, self.typ)


def _labels(*pairs: tuple[str, str]) -> str:
    """A label set as the text format writes it; ``pairs`` come in the order of their names, as the format sorts
    them (the golden scrape, checked against prometheus_client's own writer, holds every family to it)."""
    return "{" + ",".join(f'{name}="{_label_value(value)}"' for name, value in pairs) + "}"


_XPRT_COUNTERS = (
    ("storwatch_nfs_transport_sends_total", "RPC requests sent on the transport."),
    ("storwatch_nfs_transport_receives_total", "RPC replies received on the transport."),
    ("storwatch_nfs_transport_bad_xids_total", "Replies that matched no outstanding request."),
    ("storwatch_nfs_transport_connects_total", "Connections made (a rise means reconnects)."),
    (
        "storwatch_nfs_transport_requests_in_flight_sum_total",
        "Sum over sends of requests in flight; / sends = average.",
    ),
    ("storwatch_nfs_transport_backlog_sum_total", "Sum over sends of the backlog queue length; / sends = average."),
)

_NFS_BYTES = ("storwatch_nfs_bytes_total", "Bytes through the NFS client by kind (bytes: line).")
_NFS_BYTES_KINDS = ("normal_read", "normal_write", "direct_read", "direct_write", "server_read", "server_write")

# Every NFS family, in the order they are exported; each is written as text (TextFamily).
_NFS_TEXT_COUNTERS = (*_NFS_OP_COUNTERS, *_XPRT_COUNTERS, _NFS_BYTES)


_OpLines = tuple[str, ...]
"""One procedure's sample lines, one per per-op metric (the errors line empty on kernels without that counter)."""


def _op_lines(mp: str, op: NFSOperation) -> _OpLines:
    labels = f'{{mountpoint="{mp}",operation="{_label_value(op.name)}"}} '
    return (
        f"storwatch_nfs_operations_total{labels}{_value_text(op.requests)}\n",
        f"storwatch_nfs_transmissions_total{labels}{_value_text(op.transmissions)}\n",
        f"storwatch_nfs_major_timeouts_total{labels}{_value_text(op.major_timeouts)}\n",
        f"storwatch_nfs_sent_bytes_total{labels}{_value_text(op.bytes_sent)}\n",
        f"storwatch_nfs_received_bytes_total{labels}{_value_text(op.bytes_received)}\n",
        f"storwatch_nfs_queue_seconds_total{labels}{_value_text(op.queue_time_ms * _MS)}\n",
        f"storwatch_nfs_rtt_seconds_total{labels}{_value_text(op.rtt_ms * _MS)}\n",
        f"storwatch_nfs_execute_seconds_total{labels}{_value_text(op.execute_time_ms * _MS)}\n",
        "" if op.errors is None else f"storwatch_nfs_errors_total{labels}{_value_text(op.errors)}\n",
    )


class _NFSMountText:
    """One NFS mount's sample lines as last written, with what they were written from."""

    __slots__ = ("by_metric", "mount", "ops")

    def __init__(self, mount: NFSMount, by_metric: dict[str, str], ops: dict[NFSOperation, _OpLines]) -> None:
        self.mount = mount
        self.by_metric = by_metric
        """Lines by metric, each ready to go into its family."""
        self.ops = ops
        """Each procedure's lines by its counters: a procedure whose counters stand still keeps its lines."""


def _nfs_mount_text(
    mountpoint: str, nfs: NFSMount, before: _NFSMountText | None, operations: tuple[str, ...] | None
) -> _NFSMountText:
    """One NFS mount's sample lines, by metric, as render_text would write them (labels sorted by name), for the
    procedures in ``operations`` (None: all, in the kernel's order) that have been called. Only those procedures'
    lines are parsed."""
    mp = _label_value(mountpoint)
    kept = before.ops if before is not None else {}
    ops: dict[NFSOperation, _OpLines] = {}
    chosen = nfs.operations if operations is None else (nfs.operation(name) for name in operations)
    for op in chosen:
        if op is not None and op.requests:
            lines = kept.get(op)
            ops[op] = lines if lines is not None else _op_lines(mp, op)
    by_metric: dict[str, str] = {}
    if ops:
        for (name, _), column in zip(_NFS_OP_COUNTERS, zip(*ops.values(), strict=True), strict=True):
            by_metric[name] = "".join(column)
    for i, t in enumerate(nfs.transports):
        labels = f'{{mountpoint="{mp}",protocol="{_label_value(t.protocol)}",transport="{i}"}} '
        for (name, _), value in zip(
            _XPRT_COUNTERS, (t.sends, t.recvs, t.bad_xids, t.connect_count, t.req_u, t.backlog_u), strict=True
        ):
            if value is not None:
                by_metric[name] = by_metric.get(name, "") + f"{name}{labels}{_value_text(value)}\n"
    b = nfs.bytes
    if b is not None:
        values = (b.normal_read, b.normal_write, b.direct_read, b.direct_write, b.server_read, b.server_write)
        by_metric[_NFS_BYTES[0]] = "".join(
            f'{_NFS_BYTES[0]}{{kind="{kind}",mountpoint="{mp}"}} {_value_text(value)}\n'
            for kind, value in zip(_NFS_BYTES_KINDS, values, strict=True)
        )
    return _NFSMountText(nfs, by_metric, ops)


_CHECKPOINT_GAUGES = (
    ("storwatch_checkpoint_size_bytes", "Size of the run's newest complete checkpoint."),
    ("storwatch_checkpoint_write_duration_seconds", "How long the newest timed complete checkpoint took to write."),
    ("storwatch_checkpoint_write_bytes_per_second", "Its size over its write duration."),
    ("storwatch_checkpoint_interval_seconds", "Time between the run's two newest complete checkpoints."),
    ("storwatch_checkpoint_kept", "Complete checkpoints the run keeps on disk."),
    ("storwatch_checkpoint_incomplete", "The run's incomplete checkpoints (being written, or abandoned mid-write)."),
    ("storwatch_checkpoint_corrupt", "The run's corrupt checkpoints (finished, then damaged, or never valid)."),
    ("storwatch_checkpoint_write_in_progress", "1 while the run's newest checkpoint is incomplete."),
    (
        "storwatch_checkpoint_orphaned_temp_bytes",
        "Bytes of the run's atomic_save temporaries whose writer is gone (removed by the run's next atomic_save).",
    ),
)

_GPU_GAUGES = (
    ("storwatch_gpu_utilization_ratio", "Share of the last sample period in which a kernel ran on the GPU."),
    ("storwatch_gpu_memory_utilization_ratio", "Share of the last sample period in which device memory was accessed."),
    ("storwatch_gpu_memory_used_bytes", "Device memory allocated."),
    ("storwatch_gpu_memory_total_bytes", "Device memory in all."),
    ("storwatch_gpu_power_watts", "Board power draw."),
    ("storwatch_gpu_temperature_celsius", "GPU core temperature."),
)
# nvmlClocksEventReason* bits (nvml.h).
_THROTTLE_REASONS = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal", 0x20),
    ("hw_thermal", 0x40),
    ("hw_power_brake", 0x80),
    ("display_clocks", 0x100),
)


class ViewCollector(Collector):
    """Builds fresh metric families from the View it is given (client_python's custom collector pattern)."""

    def __init__(self, nfs_operations: Iterable[str] = DEFAULT_NFS_OPERATIONS) -> None:
        self.view: View | None = None
        self.nfs_operations = nfs_operations
        self._nfs_text: dict[str, _NFSMountText] = {}
        """Each NFS mount's sample lines as last written, by mountpoint."""

    def collect(self) -> Iterator[Metric]:
        view = self.view
        build = GaugeMetricFamily(
            "storwatch_build_info", "storwatch version and Python runtime.", labels=["version", "python"]
        )
        build.add_metric([__version__, _platform.python_version()], 1)
        yield build
        if view is None:
            return
        plat = GaugeMetricFamily(
            "storwatch_platform_info", "The platform preset in use and why.", labels=["platform", "detected_by"]
        )
        plat.add_metric([view.platform.name, view.platform.detected_by], 1)
        yield plat
        yield from self._mounts(view)
        yield from self._disks(view)
        yield from self._mount_io(view)
        yield from self._nfs(view)
        yield from self._probes(view)
        yield from self._gpus(view)
        yield from self._checkpoints(view)
        yield from self._kube(view)
        yield from self._collectors(view)

    @property
    def nfs_operations(self) -> tuple[str, ...] | None:
        """The NFS procedures exported per operation, in the order their lines are written; None for all of them."""
        return self._nfs_operations

    @nfs_operations.setter
    def nfs_operations(self, names: Iterable[str]) -> None:
        names = tuple(dict.fromkeys(names))
        self._nfs_operations = None if ALL_NFS_OPERATIONS in names else names
        self._nfs_text = {}  # written for the old set

    def _mounts(self, view: View) -> Iterator[Metric]:
        info = _Lines("storwatch_mount_info", "A mount on this node with its durability class and the reason for it.")
        durability = _Lines(
            "storwatch_mount_durability",
            "1 for the durability class of each mount (volatile, node, cluster, region), 0 for the others.",
        )
        size = _Lines("storwatch_mount_size_bytes", "Filesystem size in bytes.")
        free = _Lines("storwatch_mount_free_bytes", "Free bytes, root's reserve included.")
        avail = _Lines("storwatch_mount_avail_bytes", "Bytes available to unprivileged users.")
        files = _Lines("storwatch_mount_files", "Inodes in the filesystem.")
        files_free = _Lines("storwatch_mount_files_free", "Free inodes.")
        stuck = _Lines("storwatch_mount_stuck", "1 when a statvfs on the mount has not returned within its deadline.")
        stuck_for = _Lines(
            "storwatch_mount_stuck_seconds", "How long the oldest call on a stuck mount has been in flight."
        )
        readonly = _Lines("storwatch_mount_readonly", "1 when the mount is read-only.")
        for mv in view.mounts:
            m, verdict = mv.mount, mv.verdict
            mp = display_path(m.mountpoint)
            labels = _labels(("mountpoint", mp))
            info.add(
                _labels(
                    ("device", display_path(m.device)),
                    ("durability", verdict.durability.value),
                    ("fstype", m.fstype),
                    ("mountpoint", mp),
                    ("reason", verdict.reason),
                ),
                1,
            )
            for d in _DURABILITIES:
                durability.add(
                    _labels(("durability", d.value), ("mountpoint", mp)), 1 if d is verdict.durability else 0
                )
            if m.usage is not None:
                size.add(labels, m.usage.size_bytes)
                free.add(labels, m.usage.free_bytes)
                avail.add(labels, m.usage.avail_bytes)
                files.add(labels, m.usage.files)
                files_free.add(labels, m.usage.files_free)
            stuck.add(labels, 1 if mv.stuck else 0)
            stuck_for.add(labels, m.stuck_seconds)
            readonly.add(labels, 1 if m.readonly else 0)
        for family in (info, durability, size, free, avail, files, files_free, stuck, stuck_for, readonly):
            yield family.family()

    def _disks(self, view: View) -> Iterator[Metric]:
        disks = view.disks
        if disks is None:
            return
        counters = [_Lines(name, help_, "counter") for name, help_ in _DISK_COUNTERS]
        in_flight = _Lines("storwatch_disk_io_now", "I/Os in flight on the device.")
        util = _Lines("storwatch_disk_utilization_ratio", "Share of the last interval the device was busy.")
        for name, d in sorted(disks.counters.items()):
            if d.reads_completed == 0 and d.writes_completed == 0:
                continue  # never used (spare loop devices, empty drives): not worth a series
            labels = _labels(("device", name))
            for family, value in zip(counters, _disk_values(d), strict=True):
                family.add(labels, value)
            in_flight.add(labels, d.in_flight)
            delta = disks.deltas.get(name)
            if delta is not None:
                util.add(labels, delta.utilisation)
        for family in (*counters, in_flight, util):
            yield family.family()

    def _mount_io(self, view: View) -> Iterator[Metric]:
        device = _Lines(
            "storwatch_mount_device_info",
            "The block device a mount's I/O counters come from, and the devices at the bottom of its stack.",
        )
        counters = {name: _Lines(name, help_, "counter") for name, help_ in _MOUNT_COUNTERS}
        latency = _Lines(
            "storwatch_mount_latency_seconds",
            "Per-mount operation latency over a window: p50, p95 and max of per-interval averages, and the mean.",
        )
        for mv in view.mounts:
            mp = display_path(mv.mount.mountpoint)
            labels = _labels(("mountpoint", mp))
            io = mv.io
            block = mv.mount.block
            if block is not None:
                device.add(
                    _labels(("device", block.device), ("mountpoint", mp), ("physical", ",".join(block.physical))), 1
                )
            values: list[tuple[str, float | None]] = []
            if io.counters is not None:
                values = _mount_disk_values(io.counters, partition=bool(block and block.partition))
            elif io.nfs is not None:
                values = _mount_nfs_values(io.nfs)
            for metric, value in values:
                counters[metric].add(labels, value)
            quoted = _label_value(mp)
            for op, summary in sorted(io.latency.items()):
                for window, stats in (("1m", summary.minute), ("1h", summary.hour)):
                    prefix = f'{{mountpoint="{quoted}",op="{_label_value(op)}",stat="'
                    latency.add(f'{prefix}p50",window="{window}"}}', stats.p50_seconds)
                    latency.add(f'{prefix}p95",window="{window}"}}', stats.p95_seconds)
                    latency.add(f'{prefix}max",window="{window}"}}', stats.max_seconds)
                    latency.add(f'{prefix}mean",window="{window}"}}', stats.mean_seconds)
        yield device.family()
        for family in counters.values():
            yield family.family()
        yield latency.family()

    def _nfs(self, view: View) -> Iterator[Metric]:
        if view.nfs is None:
            return
        # Most of a large node's series. A mount whose mountstats block did not change since the last render is the
        # same NFSMount object (MountStatsReader) and keeps its lines; in a changed one, only the procedures whose
        # counters moved are written again.
        chunks: dict[str, list[str]] = {name: [] for name, _ in _NFS_TEXT_COUNTERS}
        written: dict[str, _NFSMountText] = {}
        for mountpoint, nfs in sorted(view.nfs.mounts.items()):
            text = self._nfs_text.get(mountpoint)
            if text is None or text.mount is not nfs:
                text = _nfs_mount_text(display_path(mountpoint), nfs, text, self._nfs_operations)
            written[mountpoint] = text
            for name, lines in text.by_metric.items():
                chunks[name].append(lines)
        self._nfs_text = written
        yield from (TextFamily(name, help_, chunks[name]) for name, help_ in _NFS_TEXT_COUNTERS)

    def _probes(self, view: View) -> Iterator[Metric]:
        hist = HistogramMetricFamily(
            "storwatch_probe_duration_seconds",
            "Active probe latency per operation (write, fsync, read back) of a small file on the mount.",
            labels=["mountpoint", "op"],
        )
        success = GaugeMetricFamily(
            "storwatch_probe_success",
            "1 when the mount's last probe completed and read back what it wrote.",
            labels=["mountpoint"],
        )
        stuck = GaugeMetricFamily(
            "storwatch_probe_stuck",
            "1 when the mount's probe has not returned within its deadline.",
            labels=["mountpoint"],
        )
        last = GaugeMetricFamily(
            "storwatch_probe_last_timestamp_seconds",
            "Unix time of the mount's last probe round.",
            labels=["mountpoint"],
        )
        any_probe = False
        for mv in view.mounts:
            probe = mv.io.probe
            if probe is None:
                continue
            any_probe = True
            mp = display_path(mv.mount.mountpoint)
            for op, h in sorted(probe.histograms.items()):
                bounds = [*(str(b) for b in BUCKETS), "+Inf"]
                hist.add_metric([mp, op], list(zip(bounds, (float(c) for c in h.buckets), strict=True)), h.sum)
            success.add_metric([mp], 1 if probe.seconds is not None else 0)
            stuck.add_metric([mp], 1 if probe.stuck else 0)
            last.add_metric([mp], probe.timestamp)
        if any_probe:
            yield from (hist, success, stuck, last)

    def _gpus(self, view: View) -> Iterator[Metric]:
        facts = view.gpus
        if facts is None:
            return
        nvml_up = GaugeMetricFamily("storwatch_nvml_up", "1 when NVML is loaded and answering on this node.")
        nvml_up.add_metric([], 1 if facts.nvml_up else 0)
        yield nvml_up
        gpu_labels = ["gpu", "uuid"]
        info = GaugeMetricFamily(
            "storwatch_gpu_info", "A GPU on this node (NVML index, UUID, model).", labels=["gpu", "uuid", "name"]
        )
        up = GaugeMetricFamily(
            "storwatch_gpu_up", "1 when the GPU answers NVML; 0 when lost or stuck.", labels=gpu_labels
        )
        gauges = {name: GaugeMetricFamily(name, help_, labels=gpu_labels) for name, help_ in _GPU_GAUGES}
        throttled = GaugeMetricFamily(
            "storwatch_gpu_clock_throttled",
            "1 while clocks are held down for this reason.",
            labels=[*gpu_labels, "reason"],
        )
        xid = _counter(
            "storwatch_gpu_xid_errors_total", "Xid critical errors since the agent started.", [*gpu_labels, "xid"]
        )
        processes = GaugeMetricFamily("storwatch_gpu_processes", "Compute processes on the GPU.", labels=gpu_labels)
        pod_memory = GaugeMetricFamily(
            "storwatch_gpu_pod_memory_used_bytes",
            "GPU memory held by a pod's processes (pod_uid empty: processes outside any pod).",
            labels=[*gpu_labels, "pod_uid", "namespace", "pod"],
        )
        for g in facts.gpus:
            labels = [str(g.index), g.uuid or ""]
            info.add_metric([*labels, g.name or ""], 1)
            up.add_metric(labels, 1 if g.up else 0)
            if not g.up:
                continue
            for name, value in (
                ("storwatch_gpu_utilization_ratio", g.utilization_ratio),
                ("storwatch_gpu_memory_utilization_ratio", g.memory_utilization_ratio),
                ("storwatch_gpu_memory_used_bytes", g.memory_used_bytes),
                ("storwatch_gpu_memory_total_bytes", g.memory_total_bytes),
                ("storwatch_gpu_power_watts", g.power_watts),
                ("storwatch_gpu_temperature_celsius", g.temperature_celsius),
            ):
                if value is not None:
                    gauges[name].add_metric(labels, value)
            if g.throttle_reasons is not None:
                for reason, bit in _THROTTLE_REASONS:
                    throttled.add_metric([*labels, reason], 1 if g.throttle_reasons & bit else 0)
            for code, count in sorted(g.xid_counts.items()):
                xid.add_metric([*labels, str(code)], count)
            processes.add_metric(labels, len(g.processes))
            by_pod: dict[str, int] = {}
            for proc in g.processes:
                ref = view.containers.get(proc.pid)
                pod = (ref.pod_uid or "") if ref is not None else ""
                by_pod[pod] = by_pod.get(pod, 0) + (proc.used_memory_bytes or 0)
            for pod_uid, used in sorted(by_pod.items()):
                pod_info = view.kube.pod_for_uid(pod_uid) if view.kube is not None and pod_uid else None
                names = [pod_info.namespace, pod_info.name] if pod_info is not None else ["", ""]
                pod_memory.add_metric([*labels, pod_uid, *names], used)
        yield from (info, up, *gauges.values(), throttled, xid, processes, pod_memory)

    def _checkpoints(self, view: View) -> Iterator[Metric]:
        last = GaugeMetricFamily(
            "storwatch_checkpoint_last_complete_timestamp_seconds",
            "Modification time of the run's newest complete checkpoint, with the durability of the mount it is on.",
            labels=["run", "durability", "mountpoint"],
        )
        gauges = {name: GaugeMetricFamily(name, help_, labels=["run"]) for name, help_ in _CHECKPOINT_GAUGES}
        for rv in view.checkpoints:
            run = rv.run
            newest = run.newest_complete
            if newest is not None:
                durability = rv.mount.verdict.durability.value if rv.mount else "unknown"
                mountpoint = display_path(rv.mount.mount.mountpoint) if rv.mount else ""
                last.add_metric([rv.label, durability, mountpoint], newest.mtime)
                gauges["storwatch_checkpoint_size_bytes"].add_metric([rv.label], newest.size_bytes)
                timed = next((c for c in reversed(run.complete) if c.write_seconds is not None), None)
                if timed is not None and timed.write_seconds is not None:
                    gauges["storwatch_checkpoint_write_duration_seconds"].add_metric([rv.label], timed.write_seconds)
                    if timed.write_bytes_per_second is not None:
                        gauges["storwatch_checkpoint_write_bytes_per_second"].add_metric(
                            [rv.label], timed.write_bytes_per_second
                        )
            if run.interval_seconds is not None:
                gauges["storwatch_checkpoint_interval_seconds"].add_metric([rv.label], run.interval_seconds)
            gauges["storwatch_checkpoint_kept"].add_metric([rv.label], len(run.complete))
            gauges["storwatch_checkpoint_incomplete"].add_metric([rv.label], run.incomplete)
            gauges["storwatch_checkpoint_corrupt"].add_metric([rv.label], run.corrupt)
            gauges["storwatch_checkpoint_write_in_progress"].add_metric([rv.label], 1 if run.write_in_progress else 0)
            gauges["storwatch_checkpoint_orphaned_temp_bytes"].add_metric([rv.label], run.orphaned_temp_bytes)
        yield last
        yield from gauges.values()
        facts = view.checkpoint_scan
        if facts is None:
            return
        stuck = GaugeMetricFamily(
            "storwatch_checkpoint_root_stuck",
            "1 while the walk or a check of a checkpoint root (or of a mount below one) is past its deadline.",
            labels=["root"],
        )
        stuck_roots = {s.path for s in facts.stuck_roots}
        for root in sorted({*facts.roots, *stuck_roots}):
            stuck.add_metric([display_path(root)], 1 if root in stuck_roots else 0)
        errors = _counter(
            "storwatch_checkpoint_check_errors_total",
            "Checks of one checkpoint that raised (its verdict says so; the others go on), by kind.",
            ["reason"],
        )
        for reason, count in sorted(facts.check_errors.items()):
            errors.add_metric([reason], count)
        yield from (stuck, errors)

    def _kube(self, view: View) -> Iterator[Metric]:
        kube = view.kube
        if kube is None or not kube.enabled:
            # Off (no cluster on this node): no API server to be up or down, so no up-series that could page.
            return
        up = GaugeMetricFamily("storwatch_kube_api_up", "1 when the Kubernetes API answered the agent's watches.")
        up.add_metric([], 1 if kube.api_up else 0)
        yield up
        if kube.node is not None:
            cordoned = GaugeMetricFamily("storwatch_node_cordoned", "1 when this node is cordoned (unschedulable).")
            cordoned.add_metric([], 1 if kube.node.cordoned else 0)
            draining = GaugeMetricFamily(
                "storwatch_node_draining", "1 when this node is being drained or announced for removal."
            )
            draining.add_metric([], 1 if kube.node.draining else 0)
            taints = GaugeMetricFamily(
                "storwatch_node_removal_taint", "A taint that announces this node's removal.", labels=["taint"]
            )
            for key in kube.node.removal_taints:
                taints.add_metric([key], 1)
            yield from (cordoned, draining, taints)
        left = GaugeMetricFamily(
            "storwatch_pod_deletion_seconds_left",
            "Seconds before a pod on this node that is being deleted is killed.",
            labels=["namespace", "pod"],
        )
        for pod, seconds in kube.terminating_pods(view.timestamp):
            left.add_metric([pod.namespace, pod.name], max(0.0, seconds))
        yield left

    def _collectors(self, view: View) -> Iterator[Metric]:
        enabled = GaugeMetricFamily(
            "storwatch_collector_enabled",
            "1 when the collector runs; 0 when it is off (disabled in the config, or nothing for it on this node).",
            labels=["collector"],
        )
        parse_errors = _counter(
            "storwatch_parse_errors_total",
            "Lines of the collector's input that could not be parsed, counted each time one is read.",
            ["collector"],
        )
        success = GaugeMetricFamily(
            "storwatch_collector_success",
            "1 when the collector's last run read and parsed its input; 0 with the error on /api/status.",
            labels=["collector"],
        )
        duration = GaugeMetricFamily(
            "storwatch_collector_duration_seconds", "How long the collector's last run took.", labels=["collector"]
        )
        last = GaugeMetricFamily(
            "storwatch_collector_last_success_timestamp_seconds",
            "Unix time of the collector's last successful run.",
            labels=["collector"],
        )
        for c in view.collectors:
            enabled.add_metric([c.name], 1 if c.enabled else 0)
            if c.parse_errors is not None:
                parse_errors.add_metric([c.name], c.parse_errors)
            if not c.enabled:
                continue  # an off collector neither succeeds nor fails
            success.add_metric([c.name], 1 if c.success else 0)
            duration.add_metric([c.name], c.duration_seconds)
            if c.last_success_timestamp is not None:
                last.add_metric([c.name], c.last_success_timestamp)
        yield from (enabled, success, duration, last, parse_errors)


# prometheus_client's own number formatting (Go's, as Prometheus writes numbers), so our text is what it would write.
_float_text = cast(Callable[[float], str], floatToGoString)
# Names as the text format takes them unquoted (prometheus_client quotes or escapes any other; ours are all these).
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# prometheus_client's generate_latest renames these families and types for the text format.
_TEXT_NAME_SUFFIX = {"counter": "_total", "info": "_info"}
_TEXT_TYPE = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


_NEG_INF = float("-inf")


_EXACT_INT = 2**53
"""Below this every int converts to a float exactly, so its decimal digits are the float's."""


def _value_text(value: float) -> str:
    # prometheus_client writes a number as Python's repr of the float, except infinities, NaN and positive numbers of
    # more than 6 integer digits (a Go-style exponent). Below 10**6 the repr is the answer: a count is "42.0".
    if type(value) is int:
        if 0 <= value < 1_000_000:
            return f"{value}.0"
        if 0 < value < _EXACT_INT:
            # floatToGoString's exponent form straight from the digits (byte counters are mostly this big):
            # 12345000 -> "1.2345e+07".
            digits = str(value)
            return f"{(digits[0] + '.' + digits[1:]).rstrip('0.')}e+{len(digits) - 1:02d}"
    elif type(value) is float and _NEG_INF < value < 1_000_000.0:  # NaN fails the comparison
        return repr(value)
    return _float_text(value)


def render_text(families: Iterable[Metric]) -> bytes:
    """The text exposition format (0.0.4) of ``families``, byte for byte what prometheus_client's generate_latest
    writes for them (tested), at a fraction of its cost: it checks each name once per family rather than every label
    name of every sample, formats each label set once per family and value, and leaves out what our families never
    have (OpenMetrics-only samples are still placed as generate_latest places them). A node with 64 busy NFS mounts
    exports about 20,000 series; generate_latest spent about 100 ms a scrape on them."""
    out: list[str] = []
    append = out.append
    label_names: dict[tuple[str, ...], list[str]] = {}
    label_text: dict[tuple[str, ...], str] = {}  # by label names and values: families share their label sets
    for metric in families:
        mtype = metric.type
        name = metric.name + _TEXT_NAME_SUFFIX.get(mtype, "")
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"metric name {name!r} would need escaping, which render_text does not do")
        doc = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        append(f"# HELP {name} {doc}\n# TYPE {name} {_TEXT_TYPE.get(mtype, mtype)}\n")
        if isinstance(metric, TextFamily):
            out.extend(metric.lines)
            continue
        late: dict[str, list[str]] = {}
        extra = {metric.name + suffix: suffix for suffix in ("_created", "_gsum", "_gcount")}
        for sample in metric.samples:
            labels = sample.labels
            if labels:
                keys = tuple(labels)
                names = label_names.get(keys)
                if names is None:
                    for key in keys:
                        if not _LABEL_NAME.fullmatch(key):
                            raise ValueError(f"label name {key!r} would need escaping, which render_text does not do")
                    names = label_names[keys] = sorted(keys)
                values = (*keys, *labels.values())
                text = label_text.get(values)
                if text is None:
                    text = label_text[values] = "{" + ",".join(f'{k}="{_label_value(labels[k])}"' for k in names) + "}"
            else:
                text = ""
            stamp = "" if sample.timestamp is None else f" {int(float(sample.timestamp) * 1000):d}"
            line = f"{sample.name}{text} {_value_text(sample.value)}{stamp}\n"
            suffix = extra.get(sample.name)
            if suffix is None:
                append(line)
            else:
                late.setdefault(suffix, []).append(line)
        for suffix, lines in sorted(late.items()):
            append(f"# HELP {metric.name}{suffix} {doc}\n# TYPE {metric.name}{suffix} gauge\n")
            out.extend(lines)
    return "".join(out).encode("utf-8")


# -- the agent itself


@dataclass
class ConfigReloads:
    """How the agent's configuration reloads went (SIGHUP), for storwatch_config_*."""

    errors_total: int = 0
    last_success: bool = True
    """The configuration the agent started with counts as a success: it would not have started otherwise."""

    def succeeded(self) -> None:
        self.last_success = True

    def failed(self) -> None:
        self.errors_total += 1
        self.last_success = False


class ConfigReloadCollector(Collector):
    def __init__(self, reloads: ConfigReloads) -> None:
        self.reloads = reloads

    def collect(self) -> Iterator[Metric]:
        reloads = self.reloads
        errors = _counter(
            "storwatch_config_reload_errors_total",
            "Configuration reloads (SIGHUP) that failed; the last good configuration stayed in force.",
            [],
        )
        errors.add_metric([], reloads.errors_total)
        yield errors
        yield GaugeMetricFamily(
            "storwatch_config_last_reload_success",
            "1 when the last configuration reload succeeded (or none was asked for), 0 when it failed.",
            value=1 if reloads.last_success else 0,
        )


class Exporter:
    """Holds the registry; ``render`` turns a View into exposition bytes."""

    def __init__(
        self,
        process_metrics: bool = True,
        nfs_operations: Iterable[str] = DEFAULT_NFS_OPERATIONS,
        reloads: ConfigReloads | None = None,
    ) -> None:
        """``reloads``: the agent's reload record, exported as storwatch_config_* (left out without it)."""
        self.registry = CollectorRegistry(auto_describe=False)
        self._view_collector = ViewCollector(nfs_operations)
        self.registry.register(self._view_collector)
        if reloads is not None:
            self.registry.register(ConfigReloadCollector(reloads))
        if process_metrics:
            ProcessCollector(registry=self.registry)

    def configure(self, nfs_operations: Iterable[str]) -> None:
        self._view_collector.nfs_operations = nfs_operations

    def render(self, view: View | None) -> bytes:
        self._view_collector.view = view
        return render_text(self.registry.collect())
