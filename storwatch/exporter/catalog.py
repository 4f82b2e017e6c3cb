"""Every metric the agent exports, declared once: its name, type, help, label names, and what bounds each label's
values (the node's own objects, a cap in the code, or a fixed set listed here).

The exporter's areas make their families from these entries (``SPEC.family()``), so a metric's name, help and label
names are written here and nowhere else. :data:`CATALOG` is the list to generate or check the README's metrics
table, dashboards and alert rules against; ``python -m storwatch.exporter.catalog`` prints it as markdown rows
(``--labels``: each label's bound).
"""

from __future__ import annotations

import argparse
import sys
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from storwatch.analysis.checkpoints import MAX_RUNS
from storwatch.analysis.stalls import CAUSES
from storwatch.config import DEFAULT_NFS_OPERATIONS
from storwatch.exporter.area import ALERTMANAGER_ALERT_RESULTS, ALERTMANAGER_REQUEST_RESULTS, SYNC_COPY_RESULTS
from storwatch.exporter.text import Family
from storwatch.labels import CHECK_ERROR_REASONS, CLAIM_REJECT_REASONS, MAX_DATASET_DIRS, PROBE_OPS
from storwatch.vocabulary import PLATFORMS, Durability, Severity

MetricType = Literal["gauge", "counter", "histogram"]
AreaName = Literal["agent", "mounts", "io", "nfs", "lustre", "gpu", "checkpoints", "kube", "access", "policy", "sync"]
WrittenBy = Literal["storwatch", "prometheus_client"]


@dataclass(frozen=True)
class Label:
    """A label of a metric, and what keeps its values few."""

    name: str
    bound: str
    """Why the label has few values, in a sentence: one per object of the node (mount, GPU, pod), a cap in the code,
    or one per agent."""
    values: tuple[str, ...] | None = None
    """The fixed set of values, where there is one: every exported value is one of these (tested)."""


@dataclass(frozen=True, eq=False)
class MetricSpec:
    """One metric family as a scrape shows it. Each is declared once, so one is equal only to itself (and hashed as
    cheaply: the areas key their families by spec)."""

    name: str
    """The name on every sample line (counters end in ``_total``; a histogram's lines add ``_bucket``, ``_count``,
    ``_sum``)."""
    type: MetricType
    help: str
    labels: tuple[Label, ...]
    """In the order an area passes their values (lines are written with the names sorted)."""
    area: AreaName
    """The exporter module that writes it (storwatch/exporter/AREA.py)."""
    allow_inf: bool = False
    """``+Inf`` is written; the README's row of the metric says what it means there."""
    written_by: WrittenBy = "storwatch"
    """``prometheus_client``: its ProcessCollector writes the family (names and help are its own); the agent area
    passes it on."""

    @property
    def label_names(self) -> tuple[str, ...]:
        return tuple(label.name for label in self.labels)

    def label(self, name: str) -> Label:
        for label in self.labels:
            if label.name == name:
                return label
        raise KeyError(f"{self.name} has no label {name!r}")

    def values(self, label: str) -> tuple[str, ...]:
        """The fixed values of ``label`` (a KeyError where it has none: its values come from the node)."""
        values = self.label(label).values
        if values is None:
            raise KeyError(f"{self.name}: label {label!r} has no fixed set of values")
        return values

    def family(self) -> Family:
        """An empty family for this metric, for one render."""
        return Family(self.name, self.help, self.type, self.label_names, allow_inf=self.allow_inf)


_declared: list[MetricSpec] = []


def _metric(
    typ: MetricType,
    area: AreaName,
    name: str,
    help_: str,
    labels: Sequence[Label] = (),
    allow_inf: bool = False,
    written_by: WrittenBy = "storwatch",
) -> MetricSpec:
    spec = MetricSpec(name, typ, help_, tuple(labels), area, allow_inf, written_by)
    _declared.append(spec)
    return spec


def _gauge(area: AreaName, name: str, help_: str, *labels: Label, allow_inf: bool = False) -> MetricSpec:
    return _metric("gauge", area, name, help_, labels, allow_inf)


def _counter(area: AreaName, name: str, help_: str, *labels: Label) -> MetricSpec:
    return _metric("counter", area, name, help_, labels)


# -- labels shared by several metrics

MOUNTPOINT = Label(
    "mountpoint",
    "one per mount in the node's mount table (its path, escaped where not UTF-8), at most mounts.max_series (256); "
    "the rest counted in storwatch_mount_series_dropped",
)
BLOCK_DEVICE = Label("device", "one per block device in diskstats that has been read or written")
COLLECTOR = Label("collector", "one per source declared in storwatch/registry.py (SOURCES)")
GPU = Label("gpu", "one per GPU on the node (its NVML index)")
UUID = Label("uuid", "one per GPU on the node (its UUID; empty where NVML gives none)")
RUN = Label(
    "run",
    f"one per checkpoint run exported, at most {MAX_RUNS} (analysis/checkpoints.py MAX_RUNS: those with GPU-seconds "
    "at risk, then with findings, then the newest; the rest counted in storwatch_checkpoint_series_dropped), each "
    "named by its path below its root (at most 160 characters)",
)
ROOT = Label("root", "one per checkpoint root (checkpoints.roots, the kubelet's pod volumes) and mount below one")
DURABILITIES = tuple(d.value for d in Durability)
DURABILITY = Label("durability", "the durability classes", DURABILITIES)
NFS_MOUNTPOINT = Label("mountpoint", "one per NFS mount of the node with series (mounts.max_series)")
NFS_OPERATION = Label(
    "operation",
    f"the procedures in nfs.operations that the mount has called ({len(DEFAULT_NFS_OPERATIONS)} by default; "
    'with ["*"] every procedure the kernel counts, about 70 on NFSv4.2)',
)
NFS_TRANSPORT = Label("transport", "one per RPC transport of the mount (its index; more than one with nconnect)")
NFS_PROTOCOL = Label("protocol", "one per transport: its protocol as mountstats names it (tcp, udp, rdma)")
LUSTRE_FSNAME = Label("fsname", "one per Lustre filesystem the node mounts")
LUSTRE_MOUNTPOINT = Label("mountpoint", "one per Lustre client mount; empty when it could not be joined to a mount")
WORKLOAD = Label(
    "workload",
    "one per GPU workload on the node, at most access.max_workloads (the rest counted in "
    "storwatch_workload_series_dropped): its pod (namespace/name, or pod:<uid>), Slurm job (job:<id>), or "
    "process:<comm> for a process in neither (bare processes of one name share it), or other",
)

# -- agent: build and platform (the scrape opens with them)

BUILD_INFO = _gauge(
    "agent",
    "storwatch_build_info",
    "storwatch version and Python runtime.",
    Label("version", "one: this agent's version"),
    Label("python", "one: the Python version the agent runs on"),
)
PLATFORM_INFO = _gauge(
    "agent",
    "storwatch_platform_info",
    "The platform preset in use and why.",
    Label("platform", "the platform presets", PLATFORMS),
    Label("detected_by", "one: why this preset (configured, a flag, or what auto-detection saw)"),
)

# -- mounts

MOUNT_INFO = _gauge(
    "mounts",
    "storwatch_mount_info",
    "A mount on this node with its durability class and the reason for it.",
    MOUNTPOINT,
    Label("device", "one per mount: its source as the mount table names it"),
    Label("fstype", "one per mount: its filesystem type"),
    DURABILITY,
    Label("reason", "one per mount: the sentence of the evidence that decided its class"),
)
MOUNT_DURABILITY = _gauge(
    "mounts",
    "storwatch_mount_durability",
    "1 for the durability class of each mount (volatile, node, cluster, region), 0 for the others.",
    MOUNTPOINT,
    DURABILITY,
)
MOUNT_SIZE_BYTES = _gauge("mounts", "storwatch_mount_size_bytes", "Filesystem size in bytes.", MOUNTPOINT)
MOUNT_FREE_BYTES = _gauge("mounts", "storwatch_mount_free_bytes", "Free bytes, root's reserve included.", MOUNTPOINT)
MOUNT_AVAIL_BYTES = _gauge(
    "mounts", "storwatch_mount_avail_bytes", "Bytes available to unprivileged users.", MOUNTPOINT
)
MOUNT_FILES = _gauge("mounts", "storwatch_mount_files", "Inodes in the filesystem.", MOUNTPOINT)
MOUNT_FILES_FREE = _gauge("mounts", "storwatch_mount_files_free", "Free inodes.", MOUNTPOINT)
MOUNT_STUCK = _gauge(
    "mounts", "storwatch_mount_stuck", "1 when a statvfs on the mount has not returned within its deadline.", MOUNTPOINT
)
MOUNT_STUCK_SECONDS = _gauge(
    "mounts",
    "storwatch_mount_stuck_seconds",
    "How long the oldest call on a stuck mount has been in flight.",
    MOUNTPOINT,
)
MOUNT_READONLY = _gauge("mounts", "storwatch_mount_readonly", "1 when the mount is read-only.", MOUNTPOINT)
MOUNT_SERIES_DROPPED = _gauge(
    "mounts",
    "storwatch_mount_series_dropped",
    "Mounts of the node's mount table without series of their own, past mounts.max_series: read-only and idle ones "
    "first; they stay in /status, the policy and every sum.",
)

# -- io: block devices (named as node_exporter names them, so dashboards carry over)

DISK_READS_COMPLETED = _counter(
    "io", "storwatch_disk_reads_completed_total", "Reads completed successfully.", BLOCK_DEVICE
)
DISK_READS_MERGED = _counter(
    "io", "storwatch_disk_reads_merged_total", "Adjacent reads merged before being issued.", BLOCK_DEVICE
)
DISK_READ_BYTES = _counter("io", "storwatch_disk_read_bytes_total", "Bytes read.", BLOCK_DEVICE)
DISK_READ_TIME = _counter(
    "io", "storwatch_disk_read_time_seconds_total", "Time spent on reads (sum over all reads).", BLOCK_DEVICE
)
DISK_WRITES_COMPLETED = _counter(
    "io", "storwatch_disk_writes_completed_total", "Writes completed successfully.", BLOCK_DEVICE
)
DISK_WRITES_MERGED = _counter(
    "io", "storwatch_disk_writes_merged_total", "Adjacent writes merged before being issued.", BLOCK_DEVICE
)
DISK_WRITTEN_BYTES = _counter("io", "storwatch_disk_written_bytes_total", "Bytes written.", BLOCK_DEVICE)
DISK_WRITE_TIME = _counter(
    "io", "storwatch_disk_write_time_seconds_total", "Time spent on writes (sum over all writes).", BLOCK_DEVICE
)
DISK_DISCARDS_COMPLETED = _counter(
    "io", "storwatch_disk_discards_completed_total", "Discards completed successfully.", BLOCK_DEVICE
)
DISK_DISCARDED_BYTES = _counter("io", "storwatch_disk_discarded_bytes_total", "Bytes discarded.", BLOCK_DEVICE)
DISK_DISCARD_TIME = _counter("io", "storwatch_disk_discard_time_seconds_total", "Time spent on discards.", BLOCK_DEVICE)
DISK_FLUSH_REQUESTS = _counter(
    "io", "storwatch_disk_flush_requests_total", "Flush requests completed successfully.", BLOCK_DEVICE
)
DISK_FLUSH_REQUESTS_TIME = _counter(
    "io", "storwatch_disk_flush_requests_time_seconds_total", "Time spent on flush requests.", BLOCK_DEVICE
)
DISK_IO_TIME = _counter(
    "io", "storwatch_disk_io_time_seconds_total", "Time the device had I/O in flight.", BLOCK_DEVICE
)
DISK_IO_TIME_WEIGHTED = _counter(
    "io",
    "storwatch_disk_io_time_weighted_seconds_total",
    "I/O time weighted by the number of I/Os in flight.",
    BLOCK_DEVICE,
)
DISK_IO_NOW = _gauge("io", "storwatch_disk_io_now", "I/Os in flight on the device.", BLOCK_DEVICE)
DISK_UTILIZATION = _gauge(
    "io", "storwatch_disk_utilization_ratio", "Share of the last interval the device was busy.", BLOCK_DEVICE
)

# -- io: each mount's I/O (its block device's, or for NFS the READ/WRITE/COMMIT procedures')

MOUNT_DEVICE_INFO = _gauge(
    "io",
    "storwatch_mount_device_info",
    "The block device a mount's I/O counters come from, and the devices at the bottom of its stack.",
    MOUNTPOINT,
    Label("device", "one per mount: the block device under it"),
    Label("physical", "one per mount: the devices at the bottom of its stack, comma-separated"),
)
MOUNT_READS_COMPLETED = _counter(
    "io",
    "storwatch_mount_reads_completed_total",
    "Reads completed on the mount's device (NFS: READ requests).",
    MOUNTPOINT,
)
MOUNT_READ_BYTES = _counter(
    "io",
    "storwatch_mount_read_bytes_total",
    "Bytes read from the mount's device (NFS: bytes received by READ).",
    MOUNTPOINT,
)
MOUNT_READ_TIME = _counter(
    "io", "storwatch_mount_read_time_seconds_total", "Time spent on reads (NFS: READ execute time).", MOUNTPOINT
)
MOUNT_WRITES_COMPLETED = _counter(
    "io",
    "storwatch_mount_writes_completed_total",
    "Writes completed on the mount's device (NFS: WRITE requests).",
    MOUNTPOINT,
)
MOUNT_WRITTEN_BYTES = _counter(
    "io",
    "storwatch_mount_written_bytes_total",
    "Bytes written to the mount's device (NFS: bytes sent by WRITE).",
    MOUNTPOINT,
)
MOUNT_WRITE_TIME = _counter(
    "io", "storwatch_mount_write_time_seconds_total", "Time spent on writes (NFS: WRITE execute time).", MOUNTPOINT
)
MOUNT_FLUSHES_COMPLETED = _counter(
    "io",
    "storwatch_mount_flushes_completed_total",
    "Flushes completed on the mount's device (NFS: COMMIT requests).",
    MOUNTPOINT,
)
MOUNT_FLUSH_TIME = _counter(
    "io",
    "storwatch_mount_flush_time_seconds_total",
    "Time spent on flushes (NFS: COMMIT execute time).",
    MOUNTPOINT,
)
MOUNT_LATENCY = _gauge(
    "io",
    "storwatch_mount_latency_seconds",
    "Per-mount operation latency over a window: p50, p95 and max of per-interval averages, and the mean.",
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

PROBE_DURATION = _metric(
    "histogram",
    "io",
    "storwatch_probe_duration_seconds",
    "Active probe latency per operation (write, fsync, read back) of a small file on the mount.",
    (MOUNTPOINT, Label("op", "the probe's steps", PROBE_OPS)),
)
PROBE_SUCCESS = _gauge(
    "io",
    "storwatch_probe_success",
    "1 when the mount's last probe completed and read back what it wrote.",
    MOUNTPOINT,
)
PROBE_STUCK = _gauge(
    "io", "storwatch_probe_stuck", "1 when the mount's probe has not returned within its deadline.", MOUNTPOINT
)
PROBE_LAST_TIMESTAMP = _gauge(
    "io", "storwatch_probe_last_timestamp_seconds", "Unix time of the mount's last probe round.", MOUNTPOINT
)

# -- nfs: per procedure, per transport, and the bytes: line

NFS_OPERATIONS = _counter(
    "nfs", "storwatch_nfs_operations_total", "RPC requests made, per NFS operation.", NFS_MOUNTPOINT, NFS_OPERATION
)
NFS_TRANSMISSIONS = _counter(
    "nfs",
    "storwatch_nfs_transmissions_total",
    "RPC transmissions, retransmissions included.",
    NFS_MOUNTPOINT,
    NFS_OPERATION,
)
NFS_MAJOR_TIMEOUTS = _counter(
    "nfs",
    "storwatch_nfs_major_timeouts_total",
    "Requests that hit a major timeout (server not responding).",
    NFS_MOUNTPOINT,
    NFS_OPERATION,
)
NFS_SENT_BYTES = _counter(
    "nfs",
    "storwatch_nfs_sent_bytes_total",
    "Bytes sent for these requests, headers included.",
    NFS_MOUNTPOINT,
    NFS_OPERATION,
)
NFS_RECEIVED_BYTES = _counter(
    "nfs",
    "storwatch_nfs_received_bytes_total",
    "Bytes received in replies, headers included.",
    NFS_MOUNTPOINT,
    NFS_OPERATION,
)
NFS_QUEUE_SECONDS = _counter(
    "nfs",
    "storwatch_nfs_queue_seconds_total",
    "Time requests waited before transmission.",
    NFS_MOUNTPOINT,
    NFS_OPERATION,
)
NFS_RTT_SECONDS = _counter(
    "nfs", "storwatch_nfs_rtt_seconds_total", "Time from transmission to reply.", NFS_MOUNTPOINT, NFS_OPERATION
)
NFS_EXECUTE_SECONDS = _counter(
    "nfs",
    "storwatch_nfs_execute_seconds_total",
    "Time from creation to completion (queue + RTT + client processing).",
    NFS_MOUNTPOINT,
    NFS_OPERATION,
)
NFS_ERRORS = _counter(
    "nfs",
    "storwatch_nfs_errors_total",
    "Requests that completed with an error status.",
    NFS_MOUNTPOINT,
    NFS_OPERATION,
)
NFS_TRANSPORT_SENDS = _counter(
    "nfs",
    "storwatch_nfs_transport_sends_total",
    "RPC requests sent on the transport.",
    NFS_MOUNTPOINT,
    NFS_TRANSPORT,
    NFS_PROTOCOL,
)
NFS_TRANSPORT_RECEIVES = _counter(
    "nfs",
    "storwatch_nfs_transport_receives_total",
    "RPC replies received on the transport.",
    NFS_MOUNTPOINT,
    NFS_TRANSPORT,
    NFS_PROTOCOL,
)
NFS_TRANSPORT_BAD_XIDS = _counter(
    "nfs",
    "storwatch_nfs_transport_bad_xids_total",
    "Replies that matched no outstanding request.",
    NFS_MOUNTPOINT,
    NFS_TRANSPORT,
    NFS_PROTOCOL,
)
NFS_TRANSPORT_CONNECTS = _counter(
    "nfs",
    "storwatch_nfs_transport_connects_total",
    "Connections made (a rise means reconnects).",
    NFS_MOUNTPOINT,
    NFS_TRANSPORT,
    NFS_PROTOCOL,
)
NFS_TRANSPORT_REQUESTS_IN_FLIGHT_SUM = _counter(
    "nfs",
    "storwatch_nfs_transport_requests_in_flight_sum_total",
    "Sum over sends of requests in flight; / sends = average.",
    NFS_MOUNTPOINT,
    NFS_TRANSPORT,
    NFS_PROTOCOL,
)
NFS_TRANSPORT_BACKLOG_SUM = _counter(
    "nfs",
    "storwatch_nfs_transport_backlog_sum_total",
    "Sum over sends of the backlog queue length; / sends = average.",
    NFS_MOUNTPOINT,
    NFS_TRANSPORT,
    NFS_PROTOCOL,
)
NFS_BYTES = _counter(
    "nfs",
    "storwatch_nfs_bytes_total",
    "Bytes through the NFS client by kind (bytes: line).",
    NFS_MOUNTPOINT,
    Label(
        "kind",
        "the counters of mountstats' bytes: line, in its order",
        ("normal_read", "normal_write", "direct_read", "direct_write", "server_read", "server_write"),
    ),
)

# -- lustre

LUSTRE_CLIENT_INFO = _gauge(
    "lustre",
    "storwatch_lustre_client_info",
    "A Lustre client mount: its llite instance and the mount it was joined to (empty: not known).",
    LUSTRE_FSNAME,
    LUSTRE_MOUNTPOINT,
    Label("instance", "one per Lustre client mount: its llite instance"),
)
LUSTRE_READ_BYTES = _counter(
    "lustre",
    "storwatch_lustre_read_bytes_total",
    "Bytes read through the client mount.",
    LUSTRE_FSNAME,
    LUSTRE_MOUNTPOINT,
)
LUSTRE_WRITTEN_BYTES = _counter(
    "lustre",
    "storwatch_lustre_written_bytes_total",
    "Bytes written through the client mount.",
    LUSTRE_FSNAME,
    LUSTRE_MOUNTPOINT,
)
LUSTRE_OPERATION = Label(
    "operation",
    "the data path and the metadata calls a training job's reads and checkpoint writes wait on, of the 60 or so a "
    "client counts",
    (
        *("read", "write", "open", "close", "fsync", "getattr", "setattr", "create", "unlink", "mkdir", "rmdir"),
        *("rename", "readdir", "statfs", "truncate", "mmap", "flock", "ioctl", "seek"),
    ),
)
LUSTRE_OPERATIONS = _counter(
    "lustre",
    "storwatch_lustre_operations_total",
    "Operations the client mount served, by operation.",
    LUSTRE_FSNAME,
    LUSTRE_MOUNTPOINT,
    LUSTRE_OPERATION,
)
LUSTRE_OPERATION_SECONDS = _counter(
    "lustre",
    "storwatch_lustre_operation_seconds_total",
    "Time the client mount's operations took, by operation (clients that time them: Lustre 2.14 and later for "
    "reads and writes).",
    LUSTRE_FSNAME,
    LUSTRE_MOUNTPOINT,
    LUSTRE_OPERATION,
)

# -- gpu

NVML_UP = _gauge("gpu", "storwatch_nvml_up", "1 when NVML is loaded and answering on this node.")
GPU_INFO = _gauge(
    "gpu",
    "storwatch_gpu_info",
    "A GPU on this node (NVML index, UUID, model).",
    GPU,
    UUID,
    Label("name", "one per GPU: its model"),
)
GPU_UP = _gauge("gpu", "storwatch_gpu_up", "1 when the GPU answers NVML; 0 when lost or stuck.", GPU, UUID)
GPU_UTILIZATION = _gauge(
    "gpu",
    "storwatch_gpu_utilization_ratio",
    "Share of the last sample period in which a kernel ran on the GPU.",
    GPU,
    UUID,
)
GPU_MEMORY_UTILIZATION = _gauge(
    "gpu",
    "storwatch_gpu_memory_utilization_ratio",
    "Share of the last sample period in which device memory was accessed.",
    GPU,
    UUID,
)
GPU_MEMORY_USED = _gauge("gpu", "storwatch_gpu_memory_used_bytes", "Device memory allocated.", GPU, UUID)
GPU_MEMORY_TOTAL = _gauge("gpu", "storwatch_gpu_memory_total_bytes", "Device memory in all.", GPU, UUID)
GPU_POWER = _gauge("gpu", "storwatch_gpu_power_watts", "Board power draw.", GPU, UUID)
GPU_TEMPERATURE = _gauge("gpu", "storwatch_gpu_temperature_celsius", "GPU core temperature.", GPU, UUID)
GPU_CLOCK_THROTTLED = _gauge(
    "gpu",
    "storwatch_gpu_clock_throttled",
    "1 while clocks are held down for this reason.",
    GPU,
    UUID,
    Label(
        "reason",
        "NVML's clock event reasons (nvmlClocksEventReason*), one series each per GPU",
        (
            *("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost"),
            *("sw_thermal", "hw_thermal", "hw_power_brake", "display_clocks"),
        ),
    ),
)
GPU_XID_ERRORS = _counter(
    "gpu",
    "storwatch_gpu_xid_errors_total",
    "Xid critical errors since the agent started.",
    GPU,
    UUID,
    Label("xid", "one per Xid code the GPU reported since the agent started (NVIDIA documents about 150 codes)"),
)
GPU_PROCESSES = _gauge("gpu", "storwatch_gpu_processes", "Compute processes on the GPU.", GPU, UUID)
GPU_POD_MEMORY = _gauge(
    "gpu",
    "storwatch_gpu_pod_memory_used_bytes",
    "GPU memory held by a pod's processes (pod_uid empty: processes outside any pod).",
    GPU,
    UUID,
    Label("pod_uid", "one per pod with a process on the GPU, and empty for processes outside any pod"),
    Label("namespace", "the pod's namespace (empty when the Kubernetes source does not know the pod)"),
    Label("pod", "the pod's name (empty when the Kubernetes source does not know the pod)"),
)
GPU_JOB_MEMORY = _gauge(
    "gpu",
    "storwatch_gpu_job_memory_used_bytes",
    "GPU memory held by a Slurm job's processes (written on nodes where GPU processes run in Slurm jobs).",
    GPU,
    UUID,
    Label("job", "one per Slurm job with a process on the GPU"),
)
GPU_STALL_SECONDS = _counter(
    "gpu",
    "storwatch_gpu_stall_seconds_total",
    "GPU time spent waiting on storage (utilisation low while its process holds memory), by the mount and cause "
    "that explain it: checkpoint_write, data_read or io_contention; counted once settled, about a checkpoint scan "
    "interval after it happened.",
    GPU,
    UUID,
    Label("mountpoint", "one per mount the GPU's work touches (its baselines go with the mount)"),
    Label("cause", "the causes stall attribution tells apart (analysis/stalls.py)", CAUSES),
)

# -- checkpoints: each run

CHECKPOINT_LAST_COMPLETE = _gauge(
    "checkpoints",
    "storwatch_checkpoint_last_complete_timestamp_seconds",
    "Modification time of the run's newest complete checkpoint, with the durability of the mount it is on.",
    RUN,
    Label(
        "durability",
        "the durability classes, and unknown when the run's mount is not known",
        (*DURABILITIES, "unknown"),
    ),
    Label("mountpoint", "one per run: the mount it is on (empty when not known)"),
)
CHECKPOINT_SIZE = _gauge(
    "checkpoints", "storwatch_checkpoint_size_bytes", "Size of the run's newest complete checkpoint.", RUN
)
CHECKPOINT_WRITE_DURATION = _gauge(
    "checkpoints",
    "storwatch_checkpoint_write_duration_seconds",
    "How long the newest timed complete checkpoint took to write.",
    RUN,
)
CHECKPOINT_WRITE_RATE = _gauge(
    "checkpoints", "storwatch_checkpoint_write_bytes_per_second", "Its size over its write duration.", RUN
)
CHECKPOINT_INTERVAL = _gauge(
    "checkpoints",
    "storwatch_checkpoint_interval_seconds",
    "Time between the run's two newest complete checkpoints.",
    RUN,
)
CHECKPOINT_KEPT = _gauge("checkpoints", "storwatch_checkpoint_kept", "Complete checkpoints the run keeps on disk.", RUN)
CHECKPOINT_INCOMPLETE = _gauge(
    "checkpoints",
    "storwatch_checkpoint_incomplete",
    "The run's incomplete checkpoints (being written, or abandoned mid-write).",
    RUN,
)
CHECKPOINT_CORRUPT = _gauge(
    "checkpoints",
    "storwatch_checkpoint_corrupt",
    "The run's corrupt checkpoints (finished, then damaged, or never valid).",
    RUN,
)
CHECKPOINT_UNSAFE = _gauge(
    "checkpoints",
    "storwatch_checkpoint_unsafe",
    "The run's unsafe checkpoints: a pickle in them names a global that runs code when loaded (never complete).",
    RUN,
)
CHECKPOINT_WRITE_IN_PROGRESS = _gauge(
    "checkpoints",
    "storwatch_checkpoint_write_in_progress",
    "1 while a save of the run is in progress: an atomic_save temporary being written, or a newest checkpoint "
    "incomplete and changed within checkpoints.settle_seconds (one unchanged for longer is abandoned, not written).",
    RUN,
)
CHECKPOINT_ORPHANED_TEMP_BYTES = _gauge(
    "checkpoints",
    "storwatch_checkpoint_orphaned_temp_bytes",
    "Bytes of the run's atomic_save temporaries whose writer is gone (removed by the run's next atomic_save).",
    RUN,
)

# -- checkpoints: each run's recovery point and what it costs (analysis/rpo.py)

RECOVERY_POINT = _gauge(
    "checkpoints",
    "storwatch_recovery_point_seconds",
    "Age of the run's newest complete checkpoint on storage that survives losing this node (cluster or region): its "
    "own, or the save its newest durable copy protects; +Inf when it has neither.",
    RUN,
    allow_inf=True,
)
DURABLE_COPY = _gauge(
    "checkpoints",
    "storwatch_checkpoint_durable_copy_timestamp_seconds",
    "When the save the run's newest durable copy protects was made (a verified copy storwatch made, or a checkpoint "
    "at the same path below a durable root); no series while the run has none.",
    RUN,
)
CHECKPOINT_OVERHEAD = _gauge(
    "checkpoints",
    "storwatch_checkpoint_overhead_ratio",
    "The run's checkpoint write time over its current checkpoint interval.",
    RUN,
)
CHECKPOINT_RECOMMENDED_INTERVAL = _gauge(
    "checkpoints",
    "storwatch_checkpoint_recommended_interval_seconds",
    "Checkpoint interval for the run's measured write time and checkpoints.mtbf_seconds (Young/Daly).",
    RUN,
)
GPU_SECONDS_AT_RISK = _gauge(
    "checkpoints",
    "storwatch_gpu_seconds_at_risk",
    "GPU time the run would lose if this node died now: its recovery point times the GPUs its pod holds here.",
    RUN,
    allow_inf=True,
)
CHECKPOINT_DROPPED_GPU_SECONDS_AT_RISK = _gauge(
    "checkpoints",
    "storwatch_checkpoint_dropped_gpu_seconds_at_risk",
    "GPU-seconds at risk of the runs past the bound on runs (no series of their own): with the sum of "
    "storwatch_gpu_seconds_at_risk, the node's whole.",
    allow_inf=True,
)
CHECKPOINT_HEADROOM = _gauge(
    "checkpoints",
    "storwatch_checkpoint_headroom_bytes",
    "Space left on the run's mount once its next checkpoint (the last one's size, plus a quarter) is written; "
    "below 0 it will not fit.",
    RUN,
)
CHECKPOINT_TIER_WRITE = _gauge(
    "checkpoints",
    "storwatch_checkpoint_tier_write_seconds",
    "How long the run's newest checkpoint would take to write on each durability tier of this node, at the median "
    "rate checkpoints timed there were written.",
    RUN,
    Label("durability", "the durability classes of this node's mounts", DURABILITIES),
)

# -- checkpoints: findings (analysis/findings.py)

EPHEMERAL_IMPORTANT = _gauge(
    "checkpoints",
    "storwatch_ephemeral_important_bytes",
    "Bytes of important data (checkpoints, model weights) on storage that does not survive losing this node, "
    "by mount and kind, over every run (those without series of their own included).",
    Label("mountpoint", "one per volatile or node mount holding important data"),
    Label("kind", "what the data is (analysis/findings.py)", ("checkpoint", "model", "dataset")),
)
FINDING = _gauge(
    "checkpoints",
    "storwatch_finding",
    "1 for each open finding (its sentence is on /api/status and in scan --json under findings); its severity is "
    "its run's, which the alerts about the run carry.",
    Label(
        "id",
        f"one per open finding: a run exported (at most {MAX_RUNS}) or a dataset directory (at most "
        f"{MAX_DATASET_DIRS}) on ephemeral storage; 16 hex digits",
    ),
    Label("severity", "how urgent", typing.get_args(Severity)),
    Label("kind", "what the data is (analysis/findings.py)", ("checkpoint", "model", "dataset")),
    Label("mountpoint", "one per volatile or node mount holding important data"),
    Label("run", "the run's label, or the dataset directory's path; one per open finding"),
)
CHECKPOINT_SERIES_DROPPED = _gauge(
    "checkpoints",
    "storwatch_checkpoint_series_dropped",
    f'Label values the bound on runs left out: label="run", runs past the {MAX_RUNS} with series of their own; '
    'label="finding", their findings (no storwatch_finding series). Their bytes stay in '
    "storwatch_ephemeral_important_bytes.",
    Label("label", "the capped labels", ("run", "finding")),
)

# -- checkpoints: the scan itself

CHECKPOINT_ROOT_STUCK = _gauge(
    "checkpoints",
    "storwatch_checkpoint_root_stuck",
    "1 while the walk or a check of a checkpoint root (or of a mount below one) is past its deadline.",
    ROOT,
)
CHECKPOINT_CHECK_ERRORS = _counter(
    "checkpoints",
    "storwatch_checkpoint_check_errors_total",
    "Checks of one checkpoint that raised (its verdict says so; the others go on), by kind.",
    Label("reason", "the kinds of error a check can raise (_checkpoint_worker.py)", CHECK_ERROR_REASONS),
)
CHECKPOINT_CLAIMS_REJECTED = _counter(
    "checkpoints",
    "storwatch_checkpoint_claims_rejected_total",
    "What tenants' files claimed and was refused: event-log lines whose numbers fail a check against the file "
    "they name (dropped), and writer PIDs the kernel does not back (the write is timed, no GPU is charged).",
    Label("reason", "why a claim was refused (sources/checkpoints.py)", CLAIM_REJECT_REASONS),
)
CHECKPOINT_UNREADABLE = _gauge(
    "checkpoints",
    "storwatch_checkpoint_unreadable_entries",
    "Entries under a checkpoint root (or a mount below one) that the last walk was refused (permission): "
    "checkpoints below them are not seen.",
    ROOT,
)

# -- kube

KUBE_API_UP = _gauge("kube", "storwatch_kube_api_up", "1 when the Kubernetes API answered the agent's watches.")
NODE_CORDONED = _gauge("kube", "storwatch_node_cordoned", "1 when this node is cordoned (unschedulable).")
NODE_DRAINING = _gauge("kube", "storwatch_node_draining", "1 when this node is being drained or announced for removal.")
NODE_REMOVAL_TAINT = _gauge(
    "kube",
    "storwatch_node_removal_taint",
    "A taint that announces this node's removal.",
    Label(
        "taint",
        "one per removal taint on this node: the known keys and the cloud handlers' prefixes "
        "(sources/kubevolumes.py REMOVAL_TAINTS)",
    ),
)
POD_DELETION_SECONDS_LEFT = _gauge(
    "kube",
    "storwatch_pod_deletion_seconds_left",
    "Seconds before a pod on this node that is being deleted is killed.",
    Label("namespace", "one per pod on this node being deleted"),
    Label("pod", "one per pod on this node being deleted"),
)

# -- access: each GPU workload's storage profile

_SUMMED = "summed over the workload's GPU processes and the processes below them (its data loader workers)"
WORKLOAD_READ_BYTES = _counter(
    "access",
    "storwatch_workload_read_bytes_total",
    f"Bytes a GPU workload had read from the storage layer (read_bytes of /proc/<pid>/io, {_SUMMED}); reads served "
    "from the page cache are not in it.",
    WORKLOAD,
)
WORKLOAD_WRITTEN_BYTES = _counter(
    "access",
    "storwatch_workload_written_bytes_total",
    f"Bytes a GPU workload sent toward the storage layer (write_bytes of /proc/<pid>/io, {_SUMMED}): counted as "
    "pages are dirtied, before writeback.",
    WORKLOAD,
)
WORKLOAD_READ_CALLS = _counter(
    "access",
    "storwatch_workload_read_calls_total",
    f"Read calls of a GPU workload, on files, pipes and sockets alike (syscr of /proc/<pid>/io, {_SUMMED}).",
    WORKLOAD,
)
WORKLOAD_WRITE_CALLS = _counter(
    "access",
    "storwatch_workload_write_calls_total",
    f"Write calls of a GPU workload, on files, pipes and sockets alike (syscw of /proc/<pid>/io, {_SUMMED}).",
    WORKLOAD,
)
WORKLOAD_READ_CALL_BYTES = _counter(
    "access",
    "storwatch_workload_read_call_bytes_total",
    f"Bytes a GPU workload's read calls returned, page cache hits included (rchar of /proc/<pid>/io, {_SUMMED}); "
    "its rate over that of read_calls_total is the average read size.",
    WORKLOAD,
)
WORKLOAD_WRITE_CALL_BYTES = _counter(
    "access",
    "storwatch_workload_write_call_bytes_total",
    f"Bytes a GPU workload passed to write calls (wchar of /proc/<pid>/io, {_SUMMED}); its rate over that of "
    "write_calls_total is the average write size.",
    WORKLOAD,
)
WORKLOAD_MOUNT = _gauge(
    "access",
    "storwatch_workload_mount",
    "1 for each mount a GPU workload has files open on, by access mode (read or write); at most "
    "access.max_mounts_per_workload mounts per workload.",
    WORKLOAD,
    Label("mountpoint", "the mounts the workload has files open on, at most access.max_mounts_per_workload"),
    Label("mode", "the access modes of its open files", ("read", "write")),
)
WORKLOAD_SERIES_DROPPED = _gauge(
    "access",
    "storwatch_workload_series_dropped",
    'Label values the last render left out: label="workload", GPU workloads past access.max_workloads (none of '
    'their storwatch_workload_* series is written); label="mountpoint", mounts past '
    "access.max_mounts_per_workload, summed over the workloads written.",
    Label("label", "the capped labels", ("workload", "mountpoint")),
)
WORKLOAD_SCAN_PROCESSES = _gauge(
    "access",
    "storwatch_workload_scan_processes",
    "Processes (GPU processes and their descendants) whose counters and children the last access pass read.",
)
WORKLOAD_SCAN_FDS = _gauge(
    "access", "storwatch_workload_scan_fds", "Open files (fd links and fdinfo) the last access pass read."
)
WORKLOAD_SCAN_CPU = _gauge("access", "storwatch_workload_scan_cpu_seconds", "CPU time the last access pass took.")
WORKLOAD_SCAN_BUDGET_REACHED = _gauge(
    "access",
    "storwatch_workload_scan_budget_reached",
    "1 when the last access pass reached this budget of access.max_*_per_pass (processes, fds, cpu) and so read a "
    "sample: the rest is read on the next passes.",
    Label("budget", "the budgets of a pass", ("processes", "fds", "cpu")),
)

# -- policy: the rules in force, what fires, the actions run (storwatch/policy, storwatch/actions)

POLICY_SEVERITIES = ("info", "warning", "critical")
"""A rule's severities (storwatch.actions.base.SEVERITIES; the exporter sits below the actions, a test holds them
equal)."""
ACTION_OUTCOMES = ("ok", "dry_run", "skipped", "rate_limited", "failed")
"""An action's outcomes (storwatch.actions.base.OUTCOMES; likewise)."""
MAX_POLICY_RULES = 256
"""storwatch.policy.load.MAX_RULES (held equal by a test)."""
RULE = Label(
    "rule",
    f"one per rule of the policy in force, at most {MAX_POLICY_RULES} (storwatch/policy/load.py MAX_RULES), each "
    "name at most 64 letters, digits and _.:- (checked when the policy is loaded)",
)
POLICY_RULE_FIRING = _gauge(
    "policy",
    "storwatch_policy_rule_firing",
    "Entities for which the rule fires now (its condition held for its for, or within its keep_firing_for), by the "
    "severity each fires with.",
    RULE,
    Label(
        "severity",
        "the rule's severity; every severity for a rule that takes each entity's own (severity: \"{severity}\")",
        POLICY_SEVERITIES,
    ),
)
POLICY_RULE_ERRORS = _counter(
    "policy",
    "storwatch_policy_rule_errors_total",
    "Evaluations of the rule that gave no bool (a null compared, a missing key, a type with no such operator).",
    RULE,
)
POLICY_RULE_DISABLED = _gauge(
    "policy",
    "storwatch_policy_rule_disabled",
    "1 when the engine stopped evaluating the rule: its evaluations over one View took longer than its time budget.",
    RULE,
)
POLICY_LAST_RELOAD_SUCCESS = _gauge(
    "policy",
    "storwatch_policy_last_reload_success",
    "1 when the last policy load succeeded, 0 when it failed (the policy in force before stays).",
)
POLICY_ACTIONS = _counter(
    "policy",
    "storwatch_policy_actions_total",
    "Actions the rules asked for, by rule, action and result.",
    RULE,
    Label("action", "one per action the agent has (log, event, webhook, request_checkpoint, sync; storwatch/actions)"),
    Label("result", "the outcomes of an action", ACTION_OUTCOMES),
)

# -- sync: the verified copies the sync action made (storwatch/actions/sync_jobs.py)

SYNC_RUN = Label(
    "run",
    f"one per checkpoint run copied since the agent started, at most {MAX_RUNS} (the runs copied longest ago "
    "forgotten first), each named by its path below its root",
)
SYNC_BYTES = _counter(
    "sync",
    "storwatch_sync_bytes_total",
    "Bytes of the checkpoint copies that completed, verified, since the agent started.",
)
SYNC_COPIES = _counter(
    "sync",
    "storwatch_sync_copies_total",
    "Checkpoint copies that ended since the agent started, by result: verified (copied, read back and checked), "
    "failed (refused, an error, a source that changed, or past its deadline: sync.deadline_seconds or its pod's time "
    "left), superseded (stopped for a newer checkpoint of the same run). Each result is written from the start, at 0.",
    Label("result", "how a copy ends (exporter/area.py SYNC_COPY_RESULTS)", SYNC_COPY_RESULTS),
)
SYNC_IN_PROGRESS = _gauge(
    "sync", "storwatch_sync_in_progress", "Checkpoint copies queued or running in the copy worker now."
)
SYNC_LAST_SUCCESS = _gauge(
    "sync",
    "storwatch_sync_last_success_timestamp_seconds",
    "Unix time the run's last checkpoint copy completed, verified.",
    SYNC_RUN,
)
SYNC_DURATION = _metric(
    "histogram",
    "sync",
    "storwatch_sync_duration_seconds",
    "How long each completed checkpoint copy took, from its start in the copy worker to its verified end.",
)

# -- agent: its collectors, reloads and process (the scrape closes with them)

COLLECTOR_ENABLED = _gauge(
    "agent",
    "storwatch_collector_enabled",
    "1 when the collector runs; 0 when it is off (disabled in the config, or nothing for it on this node).",
    COLLECTOR,
)
COLLECTOR_SUCCESS = _gauge(
    "agent",
    "storwatch_collector_success",
    "1 when the collector's last run read and parsed its input; 0 with the error on /api/status.",
    COLLECTOR,
)
COLLECTOR_DURATION = _gauge(
    "agent", "storwatch_collector_duration_seconds", "How long the collector's last run took.", COLLECTOR
)
COLLECTOR_LAST_SUCCESS = _gauge(
    "agent",
    "storwatch_collector_last_success_timestamp_seconds",
    "Unix time of the collector's last successful run.",
    COLLECTOR,
)
EXPORTER_AREA_ERRORS = _counter(
    "agent",
    "storwatch_exporter_area_errors_total",
    "Scrapes whose rendering of this exporter area raised: its families were left out of that scrape, every other "
    "area's written (the log has the error, at most once a minute per area).",
    Label("area", "one per exporter area (storwatch/registry.py exporter_areas) and two parts of the agent's own"),
)
COLLECTOR_FAILURES = _counter(
    "agent",
    "storwatch_collector_failures_total",
    "Runs of the collector that failed (success 0) since the agent started; the log has the first of a failure "
    "that goes on, then lines at a backoff up to 300 s.",
    COLLECTOR,
)
PARSE_ERRORS = _counter(
    "agent",
    "storwatch_parse_errors_total",
    "Lines of the collector's input that could not be parsed, counted each time one is read.",
    COLLECTOR,
)
CONFIG_RELOAD_ERRORS = _counter(
    "agent",
    "storwatch_config_reload_errors_total",
    "Configuration reloads (SIGHUP) that failed; the last good configuration stayed in force.",
)
CONFIG_LAST_RELOAD_SUCCESS = _gauge(
    "agent",
    "storwatch_config_last_reload_success",
    "1 when the last configuration reload succeeded (or none was asked for), 0 when it failed.",
)
TICK_INTERVAL = _gauge(
    "agent",
    "storwatch_tick_interval_seconds",
    "Seconds between the agent's ticks now: tick_seconds, longer on a node where a tick and the reads that come with "
    "it cost more than tick_cpu_share of a core (at most tick_max_seconds), or quiet_seconds on a node without a GPU "
    "process for quiet_after_seconds (diskstats, NFS and GPU process reads follow the same pace).",
)
VIEW_INTERVAL = _gauge(
    "agent",
    "storwatch_view_interval_seconds",
    "Seconds between the agent's Views now: view_seconds, longer where a View costs more than view_cpu_share of a "
    "core over it (at most view_max_seconds), or quiet_seconds on a quiet node.",
)


def _process(typ: MetricType, name: str, help_: str) -> MetricSpec:
    # Written by prometheus_client's ProcessCollector: name and help as it writes them (tested against it).
    return _metric(typ, "agent", name, help_, written_by="prometheus_client")


PROCESS_VIRTUAL_MEMORY = _process("gauge", "process_virtual_memory_bytes", "Virtual memory size in bytes.")
PROCESS_RESIDENT_MEMORY = _process("gauge", "process_resident_memory_bytes", "Resident memory size in bytes.")
PROCESS_START_TIME = _process(
    "gauge", "process_start_time_seconds", "Start time of the process since unix epoch in seconds."
)
PROCESS_CPU_SECONDS = _process(
    "counter", "process_cpu_seconds_total", "Total user and system CPU time spent in seconds."
)
PROCESS_OPEN_FDS = _process("gauge", "process_open_fds", "Number of open file descriptors.")
PROCESS_MAX_FDS = _process("gauge", "process_max_fds", "Maximum number of open file descriptors.")


# -- agent: the Alertmanager receiver (POST /api/v1/alertmanager)

ALERTMANAGER_REQUESTS = _counter(
    "agent",
    "storwatch_alertmanager_requests_total",
    "Requests to the Alertmanager receiver by what became of them: accepted (2xx), unauthorized (401), bad_request "
    "(400, 405, 411: the message names the field), too_large (413), busy (503: every body slot in use), off (404: "
    "alertmanager.enabled is false).",
    Label("result", "what can become of a request", ALERTMANAGER_REQUEST_RESULTS),
)
ALERTMANAGER_ALERTS = _counter(
    "agent",
    "storwatch_alertmanager_alerts_total",
    "Alerts in accepted requests by what became of them: stored (new, or firing again with a later startsAt), "
    "updated (a repeat post of one held), stale (a late post of an earlier firing, ended before the held one "
    "began), ignored (another node's, or without the node label), evicted (held ones dropped to stay within "
    "alertmanager.max_alerts).",
    Label("result", "what can become of an alert", ALERTMANAGER_ALERT_RESULTS),
)

CATALOG: tuple[MetricSpec, ...] = tuple(_declared)
"""Every metric, in the order declared here (by area, roughly as a scrape writes them)."""
BY_NAME: Mapping[str, MetricSpec] = {spec.name: spec for spec in CATALOG}
if len(BY_NAME) != len(CATALOG):
    raise RuntimeError("storwatch.exporter.catalog declares a metric name twice")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _labels_cell(spec: MetricSpec) -> str:
    return ", ".join(
        label.name if label.values is None else f"{label.name} ({', '.join(label.values)})" for label in spec.labels
    )


def markdown_rows(specs: Sequence[MetricSpec] = CATALOG) -> Iterator[str]:
    """The metrics as rows of the README's table (metric, labels, meaning), fixed label values in brackets."""
    yield "| metric | labels | meaning |"
    yield "|---|---|---|"
    for spec in specs:
        kind = " (histogram)" if spec.type == "histogram" else ""
        yield f"| `{spec.name}`{kind} | {_cell(_labels_cell(spec))} | {_cell(spec.help)} |"


def label_rows(specs: Sequence[MetricSpec] = CATALOG) -> Iterator[str]:
    """Each label of each metric with what bounds its values (and the values, where they are a fixed set)."""
    yield "| metric | label | bound |"
    yield "|---|---|---|"
    for spec in specs:
        for label in spec.labels:
            values = "" if label.values is None else f": {', '.join(label.values)}"
            yield f"| `{spec.name}` | {label.name} | {_cell(label.bound + values)} |"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m storwatch.exporter.catalog", description="Print every metric storwatch exports."
    )
    parser.add_argument("--labels", action="store_true", help="each label's bound instead of the metrics table")
    args = parser.parse_args(argv)
    rows = label_rows() if args.labels else markdown_rows()
    sys.stdout.write("".join(row + "\n" for row in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
