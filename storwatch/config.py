"""The agent's YAML configuration: every field has a default, and a bad file names its line and field.

Files are data: loaded with ``yaml.compose`` (safe, and it keeps line numbers) and validated against the dataclasses
below. A running agent that is given a bad file keeps its last good configuration (see ``agent.Agent.reload``).
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Union

import yaml

from storwatch.checkpoints.limits import DeepLimits, allowed_global_problem
from storwatch.classify import PLATFORMS, Override
from storwatch.model import Durability
from storwatch.paths import DEFAULT_PROCFS, DEFAULT_ROOTFS, DEFAULT_SYSFS, HostPaths

DEFAULT_LISTEN = ":9477"


class ConfigError(ValueError):
    """A configuration problem, already phrased as ``FILE:LINE: FIELD: what is wrong``."""


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


@dataclass(frozen=True)
class MountsConfig:
    interval_seconds: float = 10.0
    statvfs_timeout_seconds: float = 1.0
    max_inflight: int = 16
    """At most this many statvfs calls within their deadline in flight at once."""
    exclude_fstypes: tuple[str, ...] = ()
    """Filesystem types to skip on top of the built-in pseudo filesystems."""
    overrides: tuple[OverrideConfig, ...] = ()
    max_stuck: int = 128
    """At most this many statvfs calls past their deadline left waiting in the helper (threads: max_inflight +
    max_stuck); while that many are stuck, only mounts that answered in time last round are called."""


@dataclass(frozen=True)
class ProbesConfig:
    """Active probes: write, fsync and read back a small file on chosen mounts. Off unless something is chosen."""

    classes: tuple[Durability, ...] = ()
    """Probe every writable mount of these durability classes (e.g. [cluster])."""
    mountpoints: tuple[str, ...] = ()
    """Probe these mountpoints (exact paths or globs) too."""
    scratch_dir: str = ".storwatch-probe"
    """Directory on each probed mount for the probe's file, relative to the mountpoint; created when missing."""
    interval_seconds: float = 30.0
    timeout_seconds: float = 5.0
    size_bytes: int = 4096


@dataclass(frozen=True)
class DiskIOConfig:
    interval_seconds: float = 1.0


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
    interval_seconds: float = 1.0
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
    interval_seconds: float = 1.0
    call_timeout_seconds: float = 2.0
    """Past this an NVML call is stuck: the GPUs show as down and no second sampling starts."""
    samples_interval_seconds: float = 5.0
    """How often the driver's sample buffers (GPU utilisation samples, per-process SM utilisation) are read: 1.5-3 ms
    of CPU per GPU a read on an H100, and the driver keeps about 14 s of samples; 0 reads them every tick."""


@dataclass(frozen=True)
class CheckpointsConfig:
    roots: tuple[str, ...] = ()
    """Host directories to search for checkpoints (the kubelet's pod volumes are added on Kubernetes nodes)."""
    kubelet: bool = True
    """Search /var/lib/kubelet/pods under the host root when it exists."""
    interval_seconds: float = 30.0
    settle_seconds: float = 60.0
    """A Hugging Face Trainer directory is complete once nothing in it changed for this long."""
    deep_per_scan: int = 1
    """Complete checkpoints read in full (every CRC; torch.load with torch installed) per scan, newest first."""
    deep_max_bytes: int = 1 << 30
    """Larger checkpoints are read in full only on demand (storwatch verify --deep)."""
    max_entries: int = 200_000
    max_depth: int = 12
    max_seconds: float = 10.0
    allowed_globals: tuple[str, ...] = ()
    """Extra ``module.name`` (or ``module.*``) globals a torch.save pickle may name, as torch's add_safe_globals; they
    are never imported or called. Any other global outside storwatch's allow-lists makes the checkpoint corrupt."""
    deep_wall_seconds: float = 300.0
    """Wall time of one check; past it the verdict is unknown."""
    deep_max_inflate_ratio: float = 100.0
    deep_max_inflated_bytes: int = 8 << 30
    deep_max_inflated_factor: float = 4.0
    deep_max_json_bytes: int = 16 << 20
    deep_max_json_depth: int = 64
    deep_max_pickle_bytes: int = 64 << 20
    deep_max_pickle_objects: int = 4_000_000
    deep_max_yaml_bytes: int = 16 << 20
    deep_torch_load: bool = True
    """Load torch.save files with torch (weights_only=True) in a limited child process during deep checks."""
    deep_torch_address_space_bytes: int = 3 << 30
    deep_torch_cpu_seconds: int = 120
    deep_torch_wall_seconds: float = 180.0

    def deep_limits(self) -> DeepLimits:
        """The bounds of every checkpoint check (see storwatch/checkpoints/limits.py)."""
        return DeepLimits(
            wall_seconds=self.deep_wall_seconds,
            max_inflate_ratio=self.deep_max_inflate_ratio,
            max_inflated_bytes=self.deep_max_inflated_bytes,
            max_inflated_factor=self.deep_max_inflated_factor,
            max_json_bytes=self.deep_max_json_bytes,
            max_json_depth=self.deep_max_json_depth,
            max_pickle_bytes=self.deep_max_pickle_bytes,
            max_pickle_objects=self.deep_max_pickle_objects,
            max_yaml_bytes=self.deep_max_yaml_bytes,
            torch_load=self.deep_torch_load,
            torch_address_space_bytes=self.deep_torch_address_space_bytes,
            torch_cpu_seconds=self.deep_torch_cpu_seconds,
            torch_wall_seconds=self.deep_torch_wall_seconds,
            allowed_globals=self.allowed_globals,
        )

    timeout_seconds: float = 30.0
    """Deadline of one root's (or one mount's below a root) walk and cheap checks in the helper process; past it the
    root is reported stuck. Walks stop themselves after max_seconds: only a hung mount takes this long."""
    deep_timeout_seconds: float = 360.0
    """Deadline of one deep check in the helper process, beyond deep_wall_seconds (where a check stops itself); past
    it the root holding that checkpoint is reported stuck."""


@dataclass(frozen=True)
class KubeConfig:
    enabled: bool = True
    """Watch the Kubernetes API (in-cluster config or a kubeconfig); off by itself where there is neither."""
    interval_seconds: float = 2.0
    """How often the latest watched state is taken into the View (the watches themselves are continuous)."""


@dataclass(frozen=True)
class Config:
    listen: str = DEFAULT_LISTEN
    platform: str = "auto"
    log_level: str = "info"
    tick_seconds: float = 1.0
    history_size: int = 300
    paths: PathsConfig = field(default_factory=PathsConfig)
    tls: TLSConfig = field(default_factory=TLSConfig)
    mounts: MountsConfig = field(default_factory=MountsConfig)
    diskio: DiskIOConfig = field(default_factory=DiskIOConfig)
    nfs: NFSConfig = field(default_factory=NFSConfig)
    probes: ProbesConfig = field(default_factory=ProbesConfig)
    gpu: GPUConfig = field(default_factory=GPUConfig)
    checkpoints: CheckpointsConfig = field(default_factory=CheckpointsConfig)
    kube: KubeConfig = field(default_factory=KubeConfig)

    def host_paths(self) -> HostPaths:
        return HostPaths(self.paths.procfs, self.paths.sysfs, self.paths.rootfs)

    def overrides(self) -> tuple[Override, ...]:
        return tuple(Override(o.mountpoint, o.durability, o.reason) for o in self.mounts.overrides)

    def validate(self, where: str = "config", lines: dict[str, int] | None = None) -> None:
        problems: list[str] = []
        if self.platform != "auto" and self.platform not in PLATFORMS:
            problems.append(f"platform: {self.platform!r} is not one of auto, {', '.join(PLATFORMS)}")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            problems.append(f"log_level: {self.log_level!r} is not one of debug, info, warning, error")
        for name, value in (
            ("tick_seconds", self.tick_seconds),
            ("mounts.interval_seconds", self.mounts.interval_seconds),
            ("mounts.statvfs_timeout_seconds", self.mounts.statvfs_timeout_seconds),
            ("diskio.interval_seconds", self.diskio.interval_seconds),
            ("nfs.interval_seconds", self.nfs.interval_seconds),
            ("probes.interval_seconds", self.probes.interval_seconds),
            ("probes.timeout_seconds", self.probes.timeout_seconds),
            ("gpu.interval_seconds", self.gpu.interval_seconds),
            ("gpu.call_timeout_seconds", self.gpu.call_timeout_seconds),
            ("checkpoints.interval_seconds", self.checkpoints.interval_seconds),
            ("checkpoints.max_seconds", self.checkpoints.max_seconds),
            ("checkpoints.deep_wall_seconds", self.checkpoints.deep_wall_seconds),
            ("checkpoints.deep_max_inflate_ratio", self.checkpoints.deep_max_inflate_ratio),
            ("checkpoints.deep_max_inflated_bytes", self.checkpoints.deep_max_inflated_bytes),
            ("checkpoints.deep_max_inflated_factor", self.checkpoints.deep_max_inflated_factor),
            ("checkpoints.deep_max_json_bytes", self.checkpoints.deep_max_json_bytes),
            ("checkpoints.deep_max_json_depth", self.checkpoints.deep_max_json_depth),
            ("checkpoints.deep_max_pickle_bytes", self.checkpoints.deep_max_pickle_bytes),
            ("checkpoints.deep_max_pickle_objects", self.checkpoints.deep_max_pickle_objects),
            ("checkpoints.deep_max_yaml_bytes", self.checkpoints.deep_max_yaml_bytes),
            ("checkpoints.deep_torch_address_space_bytes", self.checkpoints.deep_torch_address_space_bytes),
            ("checkpoints.deep_torch_cpu_seconds", self.checkpoints.deep_torch_cpu_seconds),
            ("checkpoints.deep_torch_wall_seconds", self.checkpoints.deep_torch_wall_seconds),
            ("checkpoints.timeout_seconds", self.checkpoints.timeout_seconds),
            ("checkpoints.deep_timeout_seconds", self.checkpoints.deep_timeout_seconds),
            ("kube.interval_seconds", self.kube.interval_seconds),
        ):
            if value <= 0:
                problems.append(f"{name}: must be greater than 0, got {value}")
        if not 0 <= self.gpu.samples_interval_seconds <= MAX_BUFFERED_READ_SECONDS:
            problems.append(
                f"gpu.samples_interval_seconds: must be 0 to {MAX_BUFFERED_READ_SECONDS:g} (the driver keeps about "
                f"14 s of samples), got {self.gpu.samples_interval_seconds}"
            )
        if self.history_size < 1:
            problems.append(f"history_size: must be at least 1, got {self.history_size}")
        for name in self.nfs.operations:
            if name != ALL_NFS_OPERATIONS and not (name.isascii() and name.replace("_", "").isalnum()):
                problems.append(f"nfs.operations: {name!r} is not a procedure name (READ, GETATTR...) or '*'")
        if self.mounts.max_inflight < 1:
            problems.append(f"mounts.max_inflight: must be at least 1, got {self.mounts.max_inflight}")
        problems += [
            f"checkpoints.allowed_globals: {p}"
            for p in map(allowed_global_problem, self.checkpoints.allowed_globals)
            if p
        ]
        if not 0 <= self.mounts.max_stuck <= 4096:
            problems.append(f"mounts.max_stuck: must be 0 to 4096, got {self.mounts.max_stuck}")
        for root in self.checkpoints.roots:
            if not os.path.isabs(root):
                problems.append(f"checkpoints.roots: {root!r} must be an absolute path on the host")
        if not 1 <= self.probes.size_bytes <= 1 << 20:
            problems.append(f"probes.size_bytes: must be 1 to 1048576, got {self.probes.size_bytes}")
        scratch = self.probes.scratch_dir
        if not scratch or os.path.isabs(scratch) or ".." in scratch.split("/") or "\0" in scratch:
            problems.append(f"probes.scratch_dir: {scratch!r} must be a relative path inside the mount, without '..'")
        if bool(self.tls.cert_file) != bool(self.tls.key_file):
            problems.append("tls: cert_file and key_file go together")
        if self.tls.client_ca_file and not self.tls.cert_file:
            problems.append("tls.client_ca_file: needs tls.cert_file and tls.key_file")
        try:
            parse_listen(self.listen)
        except ValueError as err:
            problems.append(f"listen: {err}")
        if problems:

            def located(problem: str) -> str:
                line = (lines or {}).get(problem.split(":", 1)[0])
                return f"{where}:{line}: {problem}" if line else f"{where}: {problem}"

            raise ConfigError("\n".join(located(p) for p in problems))


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` or ``[v6]:PORT`` -> (host, port); an empty host means all addresses."""
    host, sep, port_s = listen.rpartition(":")
    if not sep or not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
        raise ValueError(f"{listen!r} is not HOST:PORT")
    return host.strip("[]"), int(port_s)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _build(tp: Any, node: yaml.Node, where: str, field_path: str, lines: dict[str, int]) -> Any:
    """Turn a YAML node into a value of type ``tp``, or raise ConfigError naming the line and field."""
    line = node.start_mark.line + 1
    lines[field_path] = line

    def fail(msg: str) -> ConfigError:
        return ConfigError(f"{where}:{line}: {field_path or '(top level)'}: {msg}")

    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            return None
        return _build(args[0], node, where, field_path, lines)
    if dataclasses.is_dataclass(tp):
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            return typing.cast(Any, tp)()  # "mounts:" with every entry commented out: the defaults
        if not isinstance(node, yaml.MappingNode):
            raise fail("expected a mapping of fields")
        hints = typing.get_type_hints(tp)
        known = {f.name: f for f in dataclasses.fields(tp)}
        values: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            sub = f"{field_path}.{key}" if field_path else str(key)
            if key not in known:
                line = key_node.start_mark.line + 1
                raise ConfigError(f"{where}:{line}: {sub}: unknown field; known: {', '.join(sorted(known))}")
            if key in values:  # YAML loaders keep the last silently: the first would be lost without a word
                line = key_node.start_mark.line + 1
                raise ConfigError(f"{where}:{line}: {sub}: given twice (first on line {lines[sub]})")
            values[key] = _build(hints[key], value_node, where, sub, lines)
        missing = [
            n
            for n, f in known.items()
            if n not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise fail(f"missing required field(s): {', '.join(missing)}")
        return typing.cast(Any, tp)(**values)
    if origin is tuple:
        (item_tp, _) = typing.get_args(tp)
        if not isinstance(node, yaml.SequenceNode):
            raise fail("expected a list")
        return tuple(_build(item_tp, n, where, f"{field_path}[{i}]", lines) for i, n in enumerate(node.value))
    if not isinstance(node, yaml.ScalarNode):
        raise fail(f"expected a {_type_name(tp)}, got a {'list' if isinstance(node, yaml.SequenceNode) else 'mapping'}")
    value = yaml.safe_load(yaml.serialize(node))
    if isinstance(tp, type) and issubclass(tp, Durability):
        try:
            return Durability(value)
        except ValueError:
            raise fail(f"{value!r} is not one of {', '.join(d.value for d in Durability)}") from None
    if tp is bool:
        if not isinstance(value, bool):
            raise fail(f"expected true or false, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail(f"expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail(f"expected a whole number, got {value!r}")
        return value
    if tp is str:
        if value is None or isinstance(value, (list, dict)):
            raise fail(f"expected a string, got {value!r}")
        return str(value)
    raise fail(f"unsupported type {_type_name(tp)}")  # pragma: no cover - a bug in the schema above


def parse_config(text: str, where: str = "config") -> Config:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"{where}{line}: invalid YAML: {problem}") from None
    lines: dict[str, int] = {}
    # A document with no content ("---" alone, as templating tools render an empty config) composes to a null
    # scalar rather than None; both mean "all defaults".
    if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"):
        config = Config()
    else:
        config = _build(Config, node, where, "", lines)
    config.validate(where, lines)
    return config


def load_config(path: str | None) -> Config:
    """Load ``path``, or the built-in defaults when it is None."""
    if path is None:
        return Config()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text: {err}") from None
    return parse_config(text, path)
