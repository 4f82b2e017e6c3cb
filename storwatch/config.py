"""The agent's YAML configuration: every field has a default, and a bad file names its line and field.

Files are data: loaded with ``yaml.compose`` (safe, and it keeps line numbers) and validated against the dataclasses
below. A running agent that is given a bad file keeps its last good configuration (see ``agent.Agent.reload``).
Parsing is bounded (file size, nesting depth, node count), so no file can exhaust memory or the stack.

Every number has a finite range, declared with the field: ``interval_seconds: float = number(10.0, 0.1, 3600)``.
A new int or float field gets its range the same way (tests/test_config.py fails for one without).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import string
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, Union

from storwatch.paths import DEFAULT_PROCFS, DEFAULT_ROOTFS, DEFAULT_SYSFS, HostPaths
from storwatch.vocabulary import PLATFORMS, Durability, Override

if TYPE_CHECKING:
    import yaml

_GLOBAL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\.([A-Za-z_][A-Za-z0-9_]*|\*)")
NEVER_ALLOWED_MODULES = frozenset(
    ("builtins", "os", "posix", "nt", "sys", "subprocess", "importlib", "runpy", "pickle")
)
"""Modules no checkpoints.allowed_globals entry may name: they hold the classic payload functions."""


def allowed_global_problem(name: str) -> str | None:
    """What is wrong with an entry of checkpoints.allowed_globals, or None."""
    if not _GLOBAL_NAME.fullmatch(name):
        return f"{name!r} is not module.name or module.*"
    if name.split(".", 1)[0] in NEVER_ALLOWED_MODULES:
        return f"{name!r} is in a module that is never allowed ({', '.join(sorted(NEVER_ALLOWED_MODULES))})"
    return None


DEFAULT_LISTEN = ":9477"


MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 16
"""Levels of nesting, the innermost value counted: the schema itself needs five (mounts.overrides[0].mountpoint)."""
MAX_NODES = 100_000


class ConfigError(ValueError):
    """Configuration problems, each already phrased as ``FILE:LINE: FIELD: what is wrong`` (``FILE: ...`` where no
    line applies): every one a file has, found in one pass, in the order of its lines. ``errors`` lists them; the
    message is their lines."""

    def __init__(self, *errors: str) -> None:
        super().__init__("\n".join(errors))
        self.errors: tuple[str, ...] = errors


RANGE = "storwatch.config.range"
"""The key of a numeric field's Range in its dataclass field metadata."""

_N = TypeVar("_N", int, float)


@dataclass(frozen=True)
class Range:
    """The values a numeric field accepts: finite, from ``minimum`` to ``maximum`` inclusive."""

    minimum: float
    maximum: float
    why: str = ""
    """Said after the range in the error, when the bound has a reason a user would not guess."""

    def problem(self, value: float) -> str | None:
        if math.isfinite(value) and self.minimum <= value <= self.maximum:
            return None
        why = f" ({self.why})" if self.why else ""
        return f"must be {_number_text(self.minimum)} to {_number_text(self.maximum)}{why}, got {value}"


def _number_text(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def number(default: _N, minimum: _N, maximum: _N, why: str = "") -> _N:
    """A numeric field with its default and its range: ``timeout_seconds: float = number(5.0, 0.01, 600)``."""
    return field(default=default, metadata={RANGE: Range(minimum, maximum, why)})


@dataclass(frozen=True)
class PathsConfig:
    procfs: str = DEFAULT_PROCFS
    sysfs: str = DEFAULT_SYSFS
    rootfs: str = DEFAULT_ROOTFS


@dataclass(frozen=True)
class TLSConfig:
    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""
    """When set, clients must present a certificate signed by this CA."""


@dataclass(frozen=True)
class OverrideConfig:
    mountpoint: str
    durability: Durability
    reason: str = ""


DEFAULT_MAX_MOUNT_SERIES = 256
"""mounts.max_series's default."""


@dataclass(frozen=True)
class MountsConfig:
    interval_seconds: float = number(10.0, 0.1, 3600)
    statvfs_timeout_seconds: float = number(1.0, 0.01, 600)
    max_inflight: int = number(16, 1, 1024)
    """At most this many statvfs calls within their deadline in flight at once."""
    exclude_fstypes: tuple[str, ...] = ()
    """Filesystem types to skip on top of the built-in pseudo filesystems."""
    overrides: tuple[OverrideConfig, ...] = ()
    max_stuck: int = number(128, 0, 4096)
    """At most this many statvfs calls past their deadline left waiting in the helper (threads: max_inflight +
    max_stuck); while that many are stuck, only mounts that answered in time last round are called."""
    max_series: int = number(DEFAULT_MAX_MOUNT_SERIES, 1, 100_000)
    """At most this many mounts get series of their own (the ``mountpoint`` label grows with pods: each pod's token,
    secret and volume mounts are mounts of the node). Past it, mounts lose their series in this order: read-only
    and idle ones first, then idle writable ones, then those with I/O; a stuck mount, or one holding checkpoints or
    important data, goes last. The rest are counted in storwatch_mount_series_dropped, and stay in /status, the
    policy and every sum."""


@dataclass(frozen=True)
class ProbesConfig:
    """Active probes: write, fsync and read back a small file on chosen mounts. Off unless something is chosen."""

    classes: tuple[Durability, ...] = ()
    """Probe every writable mount of these durability classes (e.g. [cluster])."""
    mountpoints: tuple[str, ...] = ()
    """Probe these mountpoints (exact paths or globs) too."""
    scratch_dir: str = ".storwatch-probe"
    """Directory on each probed mount for the probe's file, relative to the mountpoint; created when missing."""
    interval_seconds: float = number(30.0, 0.1, 86400)
    timeout_seconds: float = number(5.0, 0.01, 600)
    size_bytes: int = number(4096, 1, 1 << 20)


@dataclass(frozen=True)
class DiskIOConfig:
    interval_seconds: float = number(1.0, 0.1, 3600)


ALL_NFS_OPERATIONS = "*"

DEFAULT_NFS_OPERATIONS = (
    *("READ", "WRITE", "COMMIT"),
    *("GETATTR", "SETATTR", "LOOKUP", "ACCESS", "OPEN", "CLOSE"),
    *("CREATE", "MKDIR", "REMOVE", "RENAME", "READDIR", "READDIRPLUS"),
    *("LAYOUTGET", "LAYOUTCOMMIT", "LAYOUTRETURN"),
)
"""The NFS procedures exported per operation by default: the data path, the metadata calls a training job's reads,
checkpoint writes and renames wait on, and pNFS layouts."""


@dataclass(frozen=True)
class NFSConfig:
    interval_seconds: float = number(1.0, 0.1, 3600)
    operations: tuple[str, ...] = DEFAULT_NFS_OPERATIONS
    """The procedures whose storwatch_nfs_* series are exported, as the kernel names them; ["*"] for every one it
    counts (NFSv4.2 counts about seventy, nine series each, per mount). READ, WRITE and COMMIT feed the per-mount
    counters and latency windows whatever this says."""


MAX_BUFFERED_READ_SECONDS = 10.0
"""The longest gpu.samples_interval_seconds accepted: past it the driver's ring of samples (about 14 s) can overflow."""


@dataclass(frozen=True)
class GPUConfig:
    enabled: bool = True
    """Read GPUs through NVML. On a node without the NVIDIA driver the source reports nvml_up 0 and retries."""
    interval_seconds: float = number(1.0, 0.1, 3600)
    call_timeout_seconds: float = number(2.0, 0.01, 600)
    """Past this an NVML call is stuck: the GPUs show as down and no second sampling starts."""
    samples_interval_seconds: float = number(
        5.0, 0.0, MAX_BUFFERED_READ_SECONDS, why="the driver keeps about 14 s of samples"
    )
    """How often the driver's sample buffers (GPU utilisation samples, per-process SM utilisation) are read: 1.5-3 ms
    of CPU per GPU a read on an H100, and the driver keeps about 14 s of samples; 0 reads them every tick."""


HOW_TO_ADD_ROOTS = "name the directories to search in checkpoints.roots"
"""How a user has a place searched for checkpoints, as a sentence ends with it."""


@dataclass(frozen=True)
class CheckpointsConfig:
    roots: tuple[str, ...] = ()
    """Host directories to search for checkpoints, besides the default places and the kubelet's pod volumes."""
    default_roots: bool = True
    """Also search the places where the platform puts people's data that the node loses, as the platform preset and
    the mount table say (storwatch.classify.default_places): home directories where they are node-local (on
    together-slurm /home is NFS and is not searched; on gradient the workspace /home/paperspace and /artifacts),
    node-local scratch (together-slurm: /scratch, /local, /mnt/local-nvme, /tmp) and every node-local or in-memory
    data mount up to three levels below / (an NVMe at /mnt/nvme, /scratch, /opt/dlami/nvme), never the root
    filesystem's system directories; false: ``roots`` (and the kubelet's pod volumes) alone."""
    kubelet: bool = True
    """Search /var/lib/kubelet/pods under the host root when it exists."""
    interval_seconds: float = number(30.0, 0.1, 86400)
    scan_cpu_share: float = number(0.001, 0.0, 1.0)
    """The share of one core the scans may take (the helper's walk and checks, and this agent's reading of the
    answers): where one scan costs more than this over ``interval_seconds`` (a node with hundreds of runs), scans come
    that much less often, at most ``scan_max_interval_seconds`` apart; a checkpoint asked of a run still has one at
    once. 0: a scan every ``interval_seconds`` whatever it costs."""
    scan_max_interval_seconds: float = number(120.0, 0.1, 86400)
    """The longest ``scan_cpu_share`` may stretch the interval between scans."""
    settle_seconds: float = number(60.0, 0.0, 86400)
    """A Hugging Face Trainer directory is complete once nothing in it changed for this long."""
    mtbf_seconds: float = number(86400.0, 60.0, 2_592_000)
    """Mean time between failures of a training run (the job's, not one node's), for the recommended checkpoint
    interval (storwatch_checkpoint_recommended_interval_seconds)."""
    dataset_min_bytes: int = number(1 << 30, 1, 1 << 50)
    """A directory of dataset shards (Parquet, Arrow, TFRecord, WebDataset tars...) this large on storage lost with
    the node is a finding."""
    deep_per_scan: int = number(1, 0, 1000)
    """Complete checkpoints read in full (every CRC; torch.load with torch installed) per scan, newest first."""
    deep_max_bytes: int = number(1 << 30, 0, 1 << 50)
    """Larger checkpoints are read in full only on demand (storwatch verify --deep)."""
    max_entries: int = number(200_000, 1, 10_000_000)
    max_depth: int = number(12, 1, 64)
    max_seconds: float = number(10.0, 0.1, 3600)
    """How long one walk of a root (or of a mount below one) and its cheap checks go on in a call: a walk past it is
    truncated; checks past it go on at the next call, brought forward (nothing is shown before they are done)."""
    allowed_globals: tuple[str, ...] = ()
    """Extra ``module.name`` (or ``module.*``) globals a torch.save pickle may name, as torch's add_safe_globals; they
    are never imported or called. Any other global outside storwatch's allow-lists makes the checkpoint corrupt."""
    deep_wall_seconds: float = number(300.0, 1.0, 86400)
    """Wall time of one check; past it the verdict is unknown."""
    deep_max_inflate_ratio: float = number(100.0, 1.0, 100_000)
    deep_max_inflated_bytes: int = number(8 << 30, 1 << 20, 1 << 50)
    deep_max_inflated_factor: float = number(4.0, 1.0, 100_000)
    deep_max_json_bytes: int = number(16 << 20, 1 << 10, 1 << 30)
    deep_max_json_depth: int = number(64, 2, 1000)
    deep_max_pickle_bytes: int = number(64 << 20, 1 << 10, 1 << 32)
    deep_max_pickle_objects: int = number(4_000_000, 1000, 1 << 31)
    deep_max_yaml_bytes: int = number(16 << 20, 1 << 10, 1 << 30)
    deep_torch_load: bool = True
    """Load torch.save files with torch (weights_only=True) in a limited child process during deep checks."""
    deep_torch_address_space_bytes: int = number(3 << 30, 256 << 20, 1 << 44)
    deep_torch_cpu_seconds: int = number(120, 1, 86400)
    deep_torch_wall_seconds: float = number(180.0, 1.0, 86400)

    timeout_seconds: float = number(30.0, 0.1, 3600)
    """Deadline of one root's (or one mount's below a root) walk and cheap checks in the helper process; past it the
    root is reported stuck. A call stops itself after max_seconds (its walk, then its checks, which the next call goes
    on with): only a hung mount takes this long."""
    deep_timeout_seconds: float = number(360.0, 1.0, 86400)
    """Deadline of one deep check in the helper process, beyond deep_wall_seconds (where a check stops itself); past
    it the root holding that checkpoint is reported stuck."""


@dataclass(frozen=True)
class FindingsConfig:
    """How urgent a finding (important data only on storage lost with this node) is."""

    rpo_budget_seconds: float = number(3600.0, 0.0, 2_592_000)
    """The recovery-point budget: a run whose checkpoints on storage lost with the node hold more training than this
    (its newest there less its newest durable copy; without a durable copy, at least the span of its checkpoints
    there) is critical; within it, a warning."""
    critical_while_draining: bool = True
    """Every checkpoint or model finding is critical while the node drains (Kubernetes: cordoned with a removal
    taint, or announced for removal), whatever the budget."""


@dataclass(frozen=True)
class PolicyConfig:
    """The rules that turn what the agent sees into actions (docs/policy-actions.md)."""

    enabled: bool = True
    default_set: bool = True
    """Load the shipped default set (storwatch/policies/default.yaml, package data) before ``files``."""
    files: tuple[str, ...] = ()
    """More policy files, loaded in order after the default set (a later file may override an earlier rule)."""
    budget_seconds: float = number(0.02, 0.001, 10.0)
    """The time one rule's evaluations over one View may take; a rule past it is disabled, with the reason, until
    the policy is loaded again."""


@dataclass(frozen=True)
class KubeConfig:
    enabled: bool = True
    """Watch the Kubernetes API (in-cluster config or a kubeconfig); off by itself where there is neither."""
    interval_seconds: float = number(2.0, 0.1, 3600)
    """How often the latest watched state is taken into the View (the watches themselves are continuous)."""


MAX_ALERTMANAGER_BODY_BYTES = 16 << 20


@dataclass(frozen=True)
class AlertmanagerConfig:
    """The Alertmanager webhook receiver, ``POST /api/v1/alertmanager``. Off unless enabled, and then only with a
    credential to check: a bearer token (``token_file``) and/or a client certificate (``tls.client_ca_file``)."""

    enabled: bool = False
    token_file: str = ""
    """A file holding the bearer token Alertmanager sends (its ``http_config.authorization.credentials_file``); read
    when the agent starts and on SIGHUP. With tls.client_ca_file set too, a request needs both."""
    node_label: str = "node"
    """The alert label that names the node an alert is about; alerts naming another node are ignored."""
    node_name: str = ""
    """This node's name as that label gives it; empty: the NODE_NAME environment variable (the DaemonSet sets it from
    spec.nodeName), else the host name."""
    accept_without_node_label: bool = False
    """Take alerts that carry no node label (cluster-wide alerts) as this node's too; by default they are ignored."""
    max_body_bytes: int = number(1 << 20, 1024, MAX_ALERTMANAGER_BODY_BYTES)
    """A larger request is refused (413) before its body is read."""
    max_alerts: int = number(512, 1, 100_000)
    """Alerts held at once; past it the resolved ones go first, then the ones posted least recently (counted)."""
    resolved_keep_seconds: float = number(300.0, 0.0, 86400)
    """How long a resolved alert stays after it was posted resolved, so rules on alerts see it resolve."""
    firing_ttl_seconds: float = number(0.0, 0.0, 30 * 86400)
    """A firing alert not posted again for this long goes (0: never); set it above the route's repeat_interval."""


SYNC_FIELDS = ("namespace", "pod", "run", "node", "checkpoint")
"""The fields a sync template may name: ``{namespace}/{pod}/{run}/{node}/{checkpoint}``."""


def sync_template_problem(template: str) -> str | None:
    """What is wrong with a sync template, or None: only ``{field}`` placeholders of SYNC_FIELDS (no format spec,
    conversion, attribute or index), at least one, and literal text that cannot make a path leave its root (a
    relative path of non-empty components, none ``.`` or ``..``, no NUL or control character)."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as err:
        return f"{template!r} is not a template: {err}"
    fields = 0
    shape: list[str] = []
    for literal, name, spec, conversion in parts:
        if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in literal):
            return f"{template!r} holds a control character"
        shape.append(literal)
        if name is None:
            continue
        if name not in SYNC_FIELDS:
            return f"{template!r}: {{{name}}} is not one of {', '.join('{' + f + '}' for f in SYNC_FIELDS)}"
        if spec or conversion:
            return f"{template!r}: {{{name}}} takes no format spec or conversion"
        fields += 1
        shape.append("x")  # a field is one valid name: only the literal text shapes the path
    if not fields:
        return f"{template!r} names no field: every copy would go to the same path"
    for component in "".join(shape).split("/"):
        if component in ("", ".", ".."):
            return f"{template!r} must be a relative path of non-empty components, none '.' or '..'"
    return None


@dataclass(frozen=True)
class SyncConfig:
    """Verified copies of checkpoints to durable storage (docs/sync.md): where they may go and how."""

    destinations: tuple[str, ...] = ()
    """The allowlisted roots (absolute host paths) a copy may be made under; none: the agent makes no copy."""
    template: str = "{namespace}/{pod}/{run}/{checkpoint}"
    """The copy's path below a root, from sanitised fields (namespace, pod, run, node, checkpoint); a field holding
    '/', '..', NUL or a control character, or an empty one, is refused."""
    keep: int = number(3, 0, 100_000)
    """Verified copies kept in a copy's directory (the newest, by when they were made); 0 keeps every one. Only the
    destination is ever pruned, never the source."""
    bandwidth_bytes_per_second: int = number(0, 0, 1 << 40)
    """The copy's read rate limit; 0: unlimited."""
    deadline_seconds: float = number(3600.0, 1.0, 7 * 86400)
    """Past this a copy is abandoned: its helper process is killed (a destination on a hung mount never holds the
    agent) and its temporaries are removed by the next copy into the same directory."""
    copies_interval_seconds: float = number(30.0, 1.0, 86400)
    """How often the durable roots are walked for the verified copies storwatch made there (what makes a run safe: its
    recovery point, finding and alerts resolve once a copy of its newest checkpoint is seen)."""
    job_scratch: tuple[str, ...] = ()
    """Where a Slurm job's node-local scratch directories are, as host paths with ``{job}``, ``{uid}`` and ``{user}``
    (``/scratch/{user}/{job}``): what ``storwatch sync --job`` looks in besides where the job's processes work and
    write, which an epilog no longer sees (the job's processes are gone by then)."""


@dataclass(frozen=True)
class Config:
    listen: str = DEFAULT_LISTEN
    platform: str = "auto"
    log_level: str = "info"
    tick_seconds: float = number(1.0, 0.1, 3600)
    """How often the newest facts are taken, kept in History and fed to the latency windows and the stall tracker."""
    tick_cpu_share: float = number(0.004, 0.0, 1.0)
    """The share of one core the second-by-second work may take: a tick, and the reads of the paced sources that
    come every tick (diskstats, NFS, NVML, the GPU processes' cgroups). Where one round of it costs more than this over
    ``tick_seconds`` (a node with a hundred busy mounts and devices), ticks and those reads come that much less often,
    at most ``tick_max_seconds`` apart (storwatch/pace.py); stalls are then accounted, and latency windows fed, over
    those intervals. 0: a tick every ``tick_seconds`` whatever it costs."""
    tick_max_seconds: float = number(5.0, 0.1, 3600)
    """The longest ``tick_cpu_share`` may stretch the interval between ticks."""
    view_seconds: float = number(1.0, 0.1, 3600)
    """How often a View is made of them and published (/metrics, /status and /api/status serve the newest); at least
    one tick apart. Each View costs the agent's CPU whether or not anyone reads it: ``view_cpu_share`` stretches the
    interval on a node where that cost is large (BENCHMARKS.md)."""
    view_cpu_share: float = number(0.002, 0.0, 1.0)
    """The share of one core that making Views and judging them with the policy may take: where a View costs more
    than this over ``view_seconds`` (a node with hundreds of runs, mounts and pods), Views come that much less often,
    at most ``view_max_seconds`` apart (storwatch/pace.py CpuBudget); a reload, a drain or a pod's deletion still
    makes one at once. 0: a View every ``view_seconds`` whatever it costs."""
    view_max_seconds: float = number(15.0, 0.1, 3600)
    """The longest ``view_cpu_share`` may stretch the interval between Views."""
    quiet_seconds: float = number(15.0, 0.0, 3600)
    """On a quiet node (no GPU process for ``quiet_after_seconds``), ticks, Views, the policy's evaluations and the
    paced sources' reads (diskstats, NFS, Lustre, GPU processes, access, kube) come this often instead, when longer
    than their own interval; 0: never quiet. The first GPU process the GPU source reports, or a reload, ends it."""
    quiet_after_seconds: float = number(60.0, 0.0, 86_400)
    """How long a node goes without a GPU process (or a reload, or the start) before it is quiet."""
    history_size: int = number(30, 1, 86_400, why="a day at one tick a second")
    """Snapshots kept in History (the last 30 s at one tick a second). Nothing in the agent reads History today: the
    latency windows and the stall tracker keep what they need themselves. Each snapshot held about 80 KB on
    bench/at_scale.py's node, so the former default of 300 held some 25 MB for no reader."""
    paths: PathsConfig = field(default_factory=PathsConfig)
    tls: TLSConfig = field(default_factory=TLSConfig)
    mounts: MountsConfig = field(default_factory=MountsConfig)
    diskio: DiskIOConfig = field(default_factory=DiskIOConfig)
    nfs: NFSConfig = field(default_factory=NFSConfig)
    probes: ProbesConfig = field(default_factory=ProbesConfig)
    gpu: GPUConfig = field(default_factory=GPUConfig)
    checkpoints: CheckpointsConfig = field(default_factory=CheckpointsConfig)
    findings: FindingsConfig = field(default_factory=FindingsConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    kube: KubeConfig = field(default_factory=KubeConfig)
    alertmanager: AlertmanagerConfig = field(default_factory=AlertmanagerConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    extra_sections: Mapping[str, Any] = field(default_factory=dict)
    """The sections of sources that declare their own section type (storwatch/registry.py), by name: the loader
    accepts them only when told their types (``parse_config(..., sections=...)``). Not a key of the file itself."""

    def host_paths(self) -> HostPaths:
        return HostPaths(self.paths.procfs, self.paths.sysfs, self.paths.rootfs)

    def overrides(self) -> tuple[Override, ...]:
        return tuple(Override(o.mountpoint, o.durability, o.reason) for o in self.mounts.overrides)

    def problems(self) -> list[str]:
        """Every problem of the values themselves, each ``FIELD: what is wrong``, in the order the fields are
        declared (ranges, names, paths as text, fields that go together); nothing is read from disk."""
        problems: list[str] = []
        if self.platform != "auto" and self.platform not in PLATFORMS:
            problems.append(f"platform: {self.platform!r} is not one of auto, {', '.join(PLATFORMS)}")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            problems.append(f"log_level: {self.log_level!r} is not one of debug, info, warning, error")
        problems.extend(_range_problems(self))
        for name, section in self.extra_sections.items():
            problems.extend(_range_problems(section, f"{name}."))
        for name in self.nfs.operations:
            if name != ALL_NFS_OPERATIONS and not (name.isascii() and name.replace("_", "").isalnum()):
                problems.append(f"nfs.operations: {name!r} is not a procedure name (READ, GETATTR...) or '*'")
        problems += [
            f"checkpoints.allowed_globals: {p}"
            for p in map(allowed_global_problem, self.checkpoints.allowed_globals)
            if p
        ]
        for root in self.checkpoints.roots:
            if not os.path.isabs(root):
                problems.append(f"checkpoints.roots: {root!r} must be an absolute path on the host")
        scratch = self.probes.scratch_dir
        if not scratch or os.path.isabs(scratch) or ".." in scratch.split("/") or "\0" in scratch:
            problems.append(f"probes.scratch_dir: {scratch!r} must be a relative path inside the mount, without '..'")
        if bool(self.tls.cert_file) != bool(self.tls.key_file):
            problems.append("tls: cert_file and key_file go together")
        if self.tls.client_ca_file and not self.tls.cert_file:
            problems.append("tls.client_ca_file: needs tls.cert_file and tls.key_file")
        problems.extend(_alertmanager_problems(self))
        problems.extend(_sync_problems(self.sync))
        try:
            parse_listen(self.listen)
        except ValueError as err:
            problems.append(f"listen: {err}")
        return problems

    def validate(self, where: str = "config", lines: Mapping[str, int] | None = None) -> None:
        """Raise a ConfigError naming every problem (``problems``), each located at its field's line in ``lines``
        (the loader's), in the order of the lines; one without a line says ``where`` alone, after those with one."""
        found = [_located(where, lines or {}, p) for p in self.problems()]
        if found:
            raise ConfigError(*_in_line_order(found))


def _field_of(problem: str) -> str:
    """The field a ``FIELD: what is wrong`` problem names."""
    return problem.split(":", 1)[0]


def _located(where: str, lines: Mapping[str, int], problem: str) -> tuple[int, str]:
    """(the line of the problem's field, or 0, and the problem as ``where:LINE: FIELD: ...``)."""
    line = lines.get(_field_of(problem), 0)
    return line, f"{where}:{line}: {problem}" if line else f"{where}: {problem}"


def _in_line_order(found: list[tuple[int, str]]) -> list[str]:
    """The problems by line, those without one last, each group in the order it was found."""
    return [text for _, text in sorted(found, key=lambda item: item[0] or math.inf)]


_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _alertmanager_problems(config: Config) -> Iterator[str]:
    section = config.alertmanager
    if section.enabled and not section.token_file and not config.tls.client_ca_file:
        yield (
            "alertmanager.enabled: needs alertmanager.token_file or tls.client_ca_file (or both): the receiver never "
            "takes alerts from an unauthenticated client"
        )
    if not _LABEL_NAME.fullmatch(section.node_label):
        yield f"alertmanager.node_label: {section.node_label!r} is not a Prometheus label name"


def _sync_problems(section: SyncConfig) -> Iterator[str]:
    seen: set[str] = set()
    for root in section.destinations:
        if not os.path.isabs(root) or "\0" in root:
            yield f"sync.destinations: {root!r} must be an absolute path on the host"
        elif not os.path.normpath(root).strip("/"):
            yield "sync.destinations: '/' allows every path on the host: name the durable roots themselves"
        elif os.path.normpath(root) in seen:
            yield f"sync.destinations: {root!r} is given twice"
        seen.add(os.path.normpath(root))
    problem = sync_template_problem(section.template)
    if problem is not None:
        yield f"sync.template: {problem}"
    for template in section.job_scratch:
        problem = job_scratch_problem(template)
        if problem is not None:
            yield f"sync.job_scratch: {problem}"


JOB_SCRATCH_FIELDS = ("job", "uid", "user")


def job_scratch_problem(template: str) -> str | None:
    """What is wrong with a ``sync.job_scratch`` template, or None: an absolute path naming only ``{job}``,
    ``{uid}`` and ``{user}`` (each a whole value, no format spec), without ``.`` or ``..`` components."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as err:
        return f"{template!r} is not a template: {err}"
    for literal, name, spec, conversion in parts:
        if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in literal):
            return f"{template!r} holds a control character"
        if name is not None and (name not in JOB_SCRATCH_FIELDS or spec or conversion):
            return f"{template!r}: {{{name}}} is not one of {{job}}, {{uid}}, {{user}}"
    if not template.startswith("/"):
        return f"{template!r} is not an absolute path"
    if any(c in (".", "..") for c in template.split("/")):
        return f"{template!r} holds a '.' or '..' component"
    return None


def _range_problems(section: Any, prefix: str = "") -> Iterator[str]:
    """``FIELD: problem`` for each number of ``section`` (a config dataclass) outside its range, sections within
    included, in the order they are declared."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        name = f"{prefix}{f.name}"
        declared = f.metadata.get(RANGE)
        if declared is not None:
            problem = declared.problem(value)
            if problem is not None:
                yield f"{name}: {problem}"
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _range_problems(value, f"{name}.")


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` or ``[v6]:PORT`` -> (host, port); an empty host means all addresses."""
    host, sep, port_s = listen.rpartition(":")
    if not sep or not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
        raise ValueError(f"{listen!r} is not HOST:PORT")
    return host.strip("[]"), int(port_s)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


class _Invalid:
    """What ``_build`` returns for a value it could not build (its problem already added)."""


_INVALID = _Invalid()


class _Problems:
    """The problems of one file found while building it: each at its line, with its field."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.found: list[tuple[int, str]] = []
        self.fields: list[str] = []
        """The fields that could not be built: left at their defaults, so validation says nothing more of them."""

    def add(self, line: int, field_path: str, message: str, value_left_out: bool = False) -> _Invalid:
        """``value_left_out``: the field's value could not be built (its default stands in for it)."""
        self.found.append((line, f"{self.where}:{line}: {field_path or '(top level)'}: {message}"))
        if value_left_out:
            self.fields.append(field_path)
        return _INVALID

    def covers(self, field_path: str) -> bool:
        """Whether ``field_path`` is, holds or lies within a field that could not be built (a check of it or of its
        section would judge the default that stands in for the value given, which has its problem already)."""
        return any(
            field_path == bad
            or field_path.startswith((f"{bad}.", f"{bad}["))
            or bad.startswith((f"{field_path}.", f"{field_path}["))
            for bad in self.fields
        )


def _build(
    tp: Any,
    node: yaml.Node,
    field_path: str,
    lines: dict[str, int],
    problems: _Problems,
    sections: Mapping[str, type] | None = None,
) -> Any:
    """Turn a YAML node into a value of type ``tp``; what cannot be built is added to ``problems`` (naming its line
    and field) and comes back as ``_INVALID``, and the rest of the file is still built, so every problem of a file is
    found in one pass. A field that is invalid is left out of its section (its default stands in); a section that
    lacks a required field is invalid itself; an invalid item of a list is left out of it. ``sections``: the top
    level's sections beyond Config's fields (going to ``extra_sections``)."""
    import yaml

    line = node.start_mark.line + 1
    lines[field_path] = line

    def fail(msg: str) -> _Invalid:
        return problems.add(line, field_path, msg, value_left_out=True)

    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            return None
        return _build(args[0], node, field_path, lines, problems)
    if dataclasses.is_dataclass(tp):
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            return typing.cast(Any, tp)()  # "mounts:" with every entry commented out: the defaults
        if not isinstance(node, yaml.MappingNode):
            return fail("expected a mapping of fields")
        hints = typing.get_type_hints(tp)
        known = {f.name: f for f in dataclasses.fields(tp) if f.name != "extra_sections"}
        if sections:
            hints = {**hints, **sections}
        values: dict[str, Any] = {}
        seen: set[str] = set()
        invalid = False
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):  # "? [a, b]": a list or a mapping as a key
                problems.add(key_line, field_path, "a key must be a field name")
                continue
            key = key_node.value
            sub = f"{field_path}.{key}" if field_path else str(key)
            if key not in known and key not in (sections or {}):
                names = sorted([*known, *(sections or {})])
                problems.add(key_line, sub, f"unknown field; known: {', '.join(names)}")
                continue
            if key in seen:  # YAML loaders keep the last silently: the first would be lost without a word
                problems.add(key_line, sub, f"given twice (first on line {lines[sub]})")
                continue
            seen.add(key)
            value = _build(hints[key], value_node, sub, lines, problems)
            if value is _INVALID:
                invalid = invalid or (key in known and _required(known[key]))
                continue
            values[key] = value
        missing = [n for n, f in known.items() if n not in seen and _required(f)]
        if missing:
            return fail(f"missing required field(s): {', '.join(missing)}")
        if invalid:
            return _INVALID
        extra = {name: values.pop(name) for name in sections or () if name in values}
        if extra:
            values["extra_sections"] = extra
        return typing.cast(Any, tp)(**values)
    if origin is tuple:
        (item_tp, _) = typing.get_args(tp)
        if not isinstance(node, yaml.SequenceNode):
            return fail("expected a list")
        items = (_build(item_tp, n, f"{field_path}[{i}]", lines, problems) for i, n in enumerate(node.value))
        return tuple(item for item in items if item is not _INVALID)
    if not isinstance(node, yaml.ScalarNode):
        given = "list" if isinstance(node, yaml.SequenceNode) else "mapping"
        return fail(f"expected a {_type_name(tp)}, got a {given}")
    value = yaml.safe_load(yaml.serialize(node))
    if isinstance(tp, type) and issubclass(tp, Durability):
        try:
            return Durability(value)
        except ValueError:
            return fail(f"{value!r} is not one of {', '.join(d.value for d in Durability)}")
    if tp is bool:
        if not isinstance(value, bool):
            return fail(f"expected true or false, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return fail(f"expected a number, got {value!r}")
        try:
            return float(value)
        except OverflowError:  # an integer of hundreds of digits
            return fail(f"{node.value[:20]}... is out of range")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            return fail(f"expected a whole number, got {value!r}")
        return value
    if tp is str:
        if value is None or isinstance(value, (list, dict)):
            return fail(f"expected a string, got {value!r}")
        return str(value)
    return fail(f"unsupported type {_type_name(tp)}")  # pragma: no cover - a bug in the schema above


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


@functools.cache
def bounded_loader(max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> type[yaml.SafeLoader]:
    """SafeLoader's composer with bounds, made on first use: yaml is imported only to read a file (the commands that
    take the defaults never load it). Nesting past ``max_depth`` (which would exhaust the stack: the composer
    recurses) or more than ``max_nodes`` nodes is a YAML error at the line where it happens. The configuration and
    the policy files are read through it."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self._depth = 0
            self._nodes = 0

        def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
            self._depth += 1
            self._nodes += 1
            try:
                if self._depth > max_depth or self._nodes > max_nodes:
                    what = f"nested deeper than {max_depth} levels" if self._depth > max_depth else "too many nodes"
                    mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                    raise yaml.composer.ComposerError(None, None, what, mark)
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    return BoundedLoader


def parse_config(text: str, where: str = "config", sections: Mapping[str, type] | None = None) -> Config:
    """Parse and validate; every problem is a ConfigError naming ``where`` (and the line, where there is one).
    ``sections``: section types beyond Config's fields, by name (the registry's; see ``Config.extra_sections``)."""
    try:
        return _parse_config(text, where, sections)
    except ConfigError:
        raise
    except Exception as err:  # a file that meets a bug here is still a bad file, not a traceback
        raise ConfigError(f"{where}: cannot load: {type(err).__name__}: {err}") from err


def _parse_config(text: str, where: str, sections: Mapping[str, type] | None) -> Config:
    import yaml

    try:
        node = yaml.compose(text, Loader=bounded_loader())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"{where}{line}: invalid YAML: {problem}") from None
    lines: dict[str, int] = {}
    # A document with no content ("---" alone, as templating tools render an empty config) composes to a null
    # scalar rather than None; both mean "all defaults".
    if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"):
        return _valid(Config(), where, lines)
    problems = _Problems(where)
    built = _build(Config, node, "", lines, problems, sections)
    if not problems.found:
        return _valid(built, where, lines)
    # The values that could be built are checked too (a field that could not be built keeps its default, and no
    # check of it or its section speaks of that default), so one run names every problem of the file.
    config = built if isinstance(built, Config) else Config()
    checked = [_located(where, lines, p) for p in config.problems() if not problems.covers(_field_of(p))]
    raise ConfigError(*_in_line_order(problems.found + checked))


def _valid(config: Config, where: str, lines: Mapping[str, int]) -> Config:
    config.validate(where, lines)
    return config


def load_config(path: str | None, sections: Mapping[str, type] | None = None) -> Config:
    """Load ``path``, or the built-in defaults when it is None (``sections`` as for ``parse_config``)."""
    if path is None:
        return Config()
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_FILE_BYTES} bytes; not a storwatch configuration")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text: {err}") from None
    return parse_config(text, path, sections)
