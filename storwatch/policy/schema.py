"""What a rule can read: one typed schema of fields per entity kind (mount, run, gpu, workload, finding, node, alert),
and the entities of a View (and of the alerts Alertmanager posted) built to it. docs/policy.md is generated from this
schema (``storwatch policy show`` prints it).

Every value is what the View knows, or null where it does not know: never a stand-in. Lists hold at most
``MAX_LIST_ITEMS`` items and strings at most ``MAX_STRING_CHARS`` characters (cut beyond), so that an evaluation over
any entity stays within the bounds the CEL wrapper assumes (storwatch.policy.cel).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from storwatch import words
from storwatch.actions.base import ENTITY_KINDS, Alert, Entity, EntityKind, FieldValue, Severity
from storwatch.policy.cel import MAX_LIST_ITEMS, MAX_STRING_CHARS, SCALAR, STRING_FIELD, Size, list_of, map_of
from storwatch.printable import shown

if TYPE_CHECKING:
    from storwatch.analysis.recovery import RunRecovery
    from storwatch.analysis.view import MountView, PodInfo, RunView, View

FieldType = Literal["bool", "int", "double", "string", "list<string>", "map<string, string>"]


@dataclass(frozen=True)
class Field:
    name: str
    type: FieldType
    doc: str
    """What it holds, in one line."""
    nullable: bool = False
    """Null where the View does not know it (the doc says when)."""


@dataclass(frozen=True)
class Kind:
    """One kind of entity: what it is, what keys it, and its fields."""

    kind: EntityKind
    doc: str
    key: str
    """What the key of one of these is (a rule's state is kept per rule and key)."""
    fields: tuple[Field, ...]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.fields)

    @property
    def sizes(self) -> dict[str, Size]:
        """The largest value each field may hold, for the CEL estimate (storwatch.policy.cel.estimate)."""
        return {f.name: field_size(f) for f in self.fields}

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)


def field_size(f: Field) -> Size:
    """The largest value of a field: strings of ``MAX_STRING_CHARS``, lists and maps of ``MAX_LIST_ITEMS``."""
    if f.type == "string":
        return STRING_FIELD
    if f.type == "list<string>":
        return list_of(MAX_LIST_ITEMS, STRING_FIELD)
    if f.type == "map<string, string>":
        return map_of(MAX_LIST_ITEMS, STRING_FIELD, STRING_FIELD)
    return SCALAR


def _f(name: str, type_: FieldType, doc: str, nullable: bool = False) -> Field:
    return Field(name, type_, doc, nullable)


_MOUNT = Kind(
    "mount",
    "A mount of the node's mount table, with its durability verdict and its I/O.",
    "its mountpoint",
    (
        _f("mountpoint", "string", "Where it is mounted, as the host names it."),
        _f("device", "string", "Its source, as the mount table names it."),
        _f("fstype", "string", "Its filesystem type."),
        _f("durability", "string", "How long data on it survives: volatile, node, cluster or region."),
        _f("ephemeral", "bool", "Lost with the node (volatile or node)."),
        _f("durability_reason", "string", "The sentence of the evidence that decided its class."),
        _f("readonly", "bool", "Mounted read-only."),
        _f("stuck", "bool", "A statvfs or the probe on it has not returned within its deadline."),
        _f("stuck_seconds", "double", "How long its oldest statvfs has been in flight (0 when none is stuck)."),
        _f("size_bytes", "int", "Filesystem size; null while statvfs has not answered.", True),
        _f("avail_bytes", "int", "Bytes available to unprivileged users; null while statvfs has not answered.", True),
        _f("used_ratio", "double", "Share of the filesystem in use, 0..1; null while statvfs has not answered.", True),
        _f("files_free", "int", "Free inodes; null while statvfs has not answered.", True),
        _f(
            "read_latency_p95_seconds",
            "double",
            "p95 of the per-interval read latency over the last minute; null without a source or a read in it.",
            True,
        ),
        _f(
            "write_latency_p95_seconds",
            "double",
            "p95 of the per-interval write latency over the last minute; null without a source or a write in it.",
            True,
        ),
        _f("probe_ok", "bool", "The last probe wrote, synced and read back; null where the mount is not probed.", True),
        _f("namespace", "string", "The namespace of the pod whose volume it is; null for no pod's volume.", True),
        _f("pod", "string", "The pod whose volume it is; null for no pod's volume (or before the API names it).", True),
        _f(
            "volume_kind",
            "string",
            "The kind of that volume (emptyDir, persistentVolumeClaim...); null for none.",
            True,
        ),
        _f("pvc", "string", "The PersistentVolumeClaim behind it; null for none.", True),
        _f("storage_class", "string", "The StorageClass of that claim; null for none.", True),
        _f("runs", "int", "Checkpoint runs on it, among those the View keeps."),
        _f("important_bytes", "int", "Bytes of the findings on it (important data it would lose with the node)."),
    ),
)

_RUN = Kind(
    "run",
    "A checkpoint run (a directory a job writes its series of checkpoints into), joined with its mount, recovery "
    "figures and writers; the runs the View keeps (at most 100, those at risk first).",
    "its label (its path below its scan root)",
    (
        _f("run", "string", "Its label: its path below its scan root, unique on the node."),
        _f("path", "string", "Its directory as the host names it."),
        _f("mountpoint", "string", "The mount holding it; null when none is known.", True),
        _f("durability", "string", "That mount's class; null when no mount is known.", True),
        _f("ephemeral", "bool", "That mount is lost with the node; null when no mount is known.", True),
        _f("complete", "int", "Complete checkpoints kept."),
        _f("incomplete", "int", "Incomplete checkpoints (cut short, or being written)."),
        _f("corrupt", "int", "Corrupt checkpoints."),
        _f("unsafe", "int", "Checkpoints whose pickle names a global that runs code when loaded."),
        _f("abandoned", "int", "Incomplete checkpoints nothing writes any more."),
        _f("newest_verdict", "string", "The newest checkpoint's verdict (complete, incomplete, corrupt...).", True),
        _f("newest_reason", "string", "Why the newest checkpoint has its verdict; null without checkpoints.", True),
        _f(
            "newest_complete_age_seconds",
            "double",
            "Age of the newest complete checkpoint anywhere; null without one or when it is dated in the future.",
            True,
        ),
        _f("newest_complete_bytes", "int", "Size of the newest complete checkpoint; null without one.", True),
        _f(
            "recovery_point_seconds",
            "double",
            "Age of the newest complete checkpoint that survives losing the node; infinity when there is none; "
            "null when it is dated in the future.",
            True,
        ),
        _f("durable_checkpoint", "bool", "A complete checkpoint of it survives losing the node."),
        _f("interval_seconds", "double", "Time between its two newest complete checkpoints; null with fewer.", True),
        _f("write_cost_seconds", "double", "How long its newest timed checkpoint took to write; null if none.", True),
        _f("recommended_interval_seconds", "double", "Daly's interval for that write cost; null without one.", True),
        _f(
            "headroom_bytes",
            "int",
            "Space left on its mount once its next checkpoint is written (negative: it will not fit); null without "
            "the mount's usage or a complete checkpoint.",
            True,
        ),
        _f(
            "gpus",
            "int",
            "GPUs on this node held by the pod it writes into, or by the processes seen writing it; null when nothing "
            "ties it to a process (unknown, never 0).",
            True,
        ),
        _f(
            "gpu_seconds_at_risk",
            "double",
            "GPU time lost if the node died now (recovery point x GPUs; infinity without a durable checkpoint); null "
            "without GPUs or while the recovery point is unknown.",
            True,
        ),
        _f(
            "severity",
            "string",
            "How urgent its risk is: its finding's severity (critical when the training only this node's storage "
            "holds is past the recovery-point budget, or while the node drains), warning when it has no finding "
            "(nothing of it is only on storage lost with the node). The alerts about it carry the same.",
        ),
        _f(
            "workload",
            "string",
            "Who writes it: pod (namespace/name), Slurm job (job:N) or process; null if unknown.",
            True,
        ),
        _f("writing", "bool", "A save is in progress."),
        _f("writers", "int", "GPU processes seen writing it."),
        _f("orphaned_temps", "int", "atomic_save temporaries whose writer is gone."),
        _f("orphaned_temp_bytes", "int", "Bytes those temporaries take."),
        _f(
            "pod_terminating",
            "bool",
            "The pod whose volume holds it is being deleted; null when it is no pod's volume or the API is not known.",
            True,
        ),
        _f("pod_seconds_left", "double", "Seconds until that pod is killed; null when it is not being deleted.", True),
        _f(
            "pod_grace_seconds",
            "double",
            "That pod's grace period (deletionGracePeriodSeconds once it is being deleted, else its "
            "terminationGracePeriodSeconds): how long it has from SIGTERM to SIGKILL; null for no pod or none given.",
            True,
        ),
        _f("node_draining", "bool", "This node is being drained; null off Kubernetes or before the API answers.", True),
        _f(
            "namespace",
            "string",
            "The namespace of the pod whose volume holds it, else of the pod of its writer; null for no known pod.",
            True,
        ),
        _f("pod", "string", "The name of that pod; null for no known pod.", True),
        _f(
            "checkpoint",
            "string",
            "The name of its newest complete checkpoint (a file or directory in the run); null without one.",
            True,
        ),
        _f(
            "protection",
            "string",
            "What protects it, in words: how old its newest checkpoint that survives losing the node is and where that "
            "is, or that none does, or why that is unknown.",
        ),
        _f(
            "at_risk",
            "string",
            "The GPU time lost if the node died now, in words (all of it when nothing survives; unknown while its GPUs "
            "or its recovery point are).",
        ),
        _f(
            "going",
            "string",
            "What is taking it away, in words: the node draining, its pod being deleted (with the time left); null "
            "while neither.",
            True,
        ),
        _f(
            "move_to",
            "string",
            "Where its checkpoints could go: the first of sync.destinations, else a durable mount of its pod or the "
            "node; null when none is known or it is on durable storage.",
            True,
        ),
        _f(
            "next_step",
            "string",
            "What to do about checkpoints only on storage lost with the node, in words: copy them to move_to, or, with "
            "no durable destination known, how to set one; empty on durable storage.",
        ),
    ),
)

_GPU = Kind(
    "gpu",
    "A GPU as NVML reports it, with the stalls storage caused it.",
    "its UUID (its index where NVML gives none)",
    (
        _f("index", "int", "NVML's index."),
        _f("uuid", "string", "Its UUID; null where NVML gives none.", True),
        _f("name", "string", "Its product name; null where NVML gives none.", True),
        _f("up", "bool", "NVML answers for it (false: lost, or sampling stuck)."),
        _f("utilization_ratio", "double", "Share of the last sample period a kernel ran, 0..1; null when down.", True),
        _f("memory_used_bytes", "int", "Device memory allocated; null when down.", True),
        _f("memory_total_bytes", "int", "Device memory; null when down.", True),
        _f("processes", "int", "Compute processes on it."),
        _f("workloads", "list<string>", "The workloads of those processes (pod, Slurm job or process)."),
        _f("xid_errors", "int", "Xid critical errors seen since the agent started."),
        _f(
            "stalling",
            "bool",
            "Storage stalls it now (a stall among those not settled yet); null where stalls are not tracked.",
            True,
        ),
        _f("stall_cause", "string", "The cause of its newest current stall; null when none.", True),
        _f("stall_mountpoint", "string", "The mount its newest current stall is charged to; null when none.", True),
        _f(
            "stall_now",
            "string",
            "Its current stall in words (its cause and mount), or that it is not stalled, or that stalls are not "
            "tracked.",
        ),
        _f(
            "stall_seconds_total",
            "double",
            "GPU time settled as lost to storage since the agent started; null where stalls are not tracked.",
            True,
        ),
        _f(
            "stall_share_10m",
            "double",
            "GPU time settled as lost to storage in the last 10 minutes of Views, over 10 minutes (0..1). Stalls are "
            "settled about 40 s after they happen, so this trails the GPU by that much; null until the engine has "
            "watched for 10 minutes, and where stalls are not tracked.",
            True,
        ),
    ),
)

_WORKLOAD = Kind(
    "workload",
    "A GPU process and the processes below it: its storage-layer I/O and the mounts it has files open on.",
    "pid:<its PID>",
    (
        _f("pid", "int", "The GPU process, as NVML names it."),
        _f("workload", "string", "Its pod (namespace/name, or pod:<uid>), Slurm job (job:<id>) or pid:<pid>."),
        _f("comm", "string", "The process's command name (set by the process itself); null if unreadable.", True),
        _f("namespace", "string", "Its pod's namespace; null outside a known pod.", True),
        _f("pod", "string", "Its pod's name; null outside a known pod.", True),
        _f("slurm_job", "int", "Its Slurm job; null outside one.", True),
        _f("gpus", "list<string>", "The UUIDs (or indexes) of the GPUs it runs on."),
        _f("read_bytes", "int", "Bytes its processes caused to be read from storage since they started."),
        _f("write_bytes", "int", "Bytes its processes caused to be written to storage since they started."),
        _f("mounts_read", "list<string>", "Mounts it has files open on for reading."),
        _f("mounts_written", "list<string>", "Mounts it has files open on for writing."),
        _f("writes_ephemeral", "bool", "One of the mounts it writes is lost with the node."),
        _f("processes", "int", "Its processes whose counters are summed."),
        _f("sampled", "bool", "Not every process or file of it was read in the last pass (its budget)."),
    ),
)

_FINDING = Kind(
    "finding",
    "Important data (checkpoints, model weights, dataset shards) on storage lost with the node.",
    "its id (stable: the same run on the same mount keeps it)",
    (
        _f("id", "string", "Stable: the same run on the same mount keeps it."),
        _f("kind", "string", "What the data is: checkpoint, model or dataset."),
        _f("severity", "string", "warning or critical, by the recovery-point budget and the node's drain."),
        _f("severity_reason", "string", "Why it has that severity."),
        _f("mountpoint", "string", "The mount holding it."),
        _f("durability", "string", "That mount's class (volatile or node)."),
        _f("pod_uid", "string", "The pod whose volume holds it; null off Kubernetes.", True),
        _f("run", "string", "The run's label, or the dataset directory's name."),
        _f("path", "string", "Its directory as the host names it."),
        _f("count", "int", "Complete checkpoints of the run on this mount."),
        _f("bytes", "int", "Its bytes there."),
        _f("newest_age_seconds", "double", "Age of its newest file; null when dated in the future.", True),
        _f(
            "durable_age_seconds",
            "double",
            "Age of the run's newest complete checkpoint on durable storage; null: none, or dated in the future.",
            True,
        ),
        _f(
            "exposed_seconds",
            "double",
            "Training held only by storage lost with the node; null for datasets or dates in the future.",
            True,
        ),
        _f("exposed_at_least", "bool", "exposed_seconds is a lower bound (no durable copy to measure from)."),
        _f("move_to", "string", "A durable mount to move it to; null when none is known.", True),
        _f("sentence", "string", "What it is, in a sentence a person can act on."),
    ),
)

_NODE = Kind(
    "node",
    "This node: its platform, its Kubernetes lifecycle, and counts over the View.",
    "node",
    (
        _f("platform", "string", "The platform preset: generic, together-k8s, together-slurm or gradient."),
        _f("ready", "bool", "Every source has reported at least once."),
        _f("kubernetes", "bool", "The Kubernetes source is on."),
        _f("kube_api_up", "bool", "The Kubernetes API answers; null when the source is off.", True),
        _f("node_name", "string", "The node's name in Kubernetes; null off Kubernetes.", True),
        _f("cordoned", "bool", "The node is cordoned; null off Kubernetes.", True),
        _f("draining", "bool", "Pods are being, or about to be, evicted; null off Kubernetes.", True),
        _f("removal_taints", "list<string>", "Taints that announce the node is going away."),
        _f("terminating_pods", "int", "Pods on it being deleted; null off Kubernetes.", True),
        _f("nvml_up", "bool", "NVML answers; null when the GPU source is off.", True),
        _f("gpus", "int", "GPUs NVML reports; null when the GPU source is off.", True),
        _f("stuck_mounts", "int", "Mounts with a statvfs or probe past its deadline."),
        _f("findings", "int", "Findings (important data on storage lost with the node), those left out included."),
        _f("critical_findings", "int", "Findings of severity critical among those the View lists."),
        _f("runs", "int", "Checkpoint runs, those left out of the View's list included."),
        _f("collectors_failing", "list<string>", "Sources whose last collection failed."),
    ),
)

_ALERT = Kind(
    "alert",
    "An alert Alertmanager posted to the agent for this node.",
    "its fingerprint",
    (
        _f("fingerprint", "string", "Alertmanager's fingerprint of its labels."),
        _f("status", "string", "firing or resolved."),
        _f("alertname", "string", "Its alertname label; null without one.", True),
        _f("severity", "string", "Its severity label; null without one.", True),
        _f("labels", "map<string, string>", "Its labels."),
        _f("annotations", "map<string, string>", "Its annotations."),
        _f("starts_at", "double", "When it started firing (seconds since the epoch)."),
        _f("ends_at", "double", "When it ended; null while it fires.", True),
        _f("age_seconds", "double", "Seconds since it started firing, at the View's time."),
        _f(
            "entity_kind",
            "string",
            "The kind of the entity of this node its labels name, which its actions act on: run (its run label), "
            "else mount (mountpoint), else gpu (uuid, or gpu: the NVML index); null when they name none here.",
            True,
        ),
        _f("entity_key", "string", "That entity's key; null when the alert names none here.", True),
        _f(
            "checkpoint",
            "string",
            "The newest complete checkpoint of the run it names (what sync copies); null without one.",
            True,
        ),
    ),
)

SCHEMA: Mapping[EntityKind, Kind] = {k.kind: k for k in (_MOUNT, _RUN, _GPU, _WORKLOAD, _FINDING, _NODE, _ALERT)}
"""Every kind's fields, in the order of ENTITY_KINDS."""
assert tuple(SCHEMA) == ENTITY_KINDS

SEVERITY_FIELDS: Mapping[EntityKind, str] = {"run": "severity", "finding": "severity", "alert": "severity"}
"""The field holding each kind's own severity, where it has one: a rule's ``severity: "{severity}"`` takes it per
entity, so a run shows one severity in its finding, the policy's rules and the alerts. A value that is not info,
warning or critical (an alert without a severity label) counts as warning."""


def type_problem(f: Field, value: object) -> str | None:
    """What is wrong with ``value`` for field ``f`` (its type, a null where none is allowed, a list too long), or
    None."""
    if value is None:
        return None if f.nullable else "is null, and it is never unknown"
    ok: bool
    if f.type == "bool":
        ok = isinstance(value, bool)
    elif f.type == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif f.type == "double":
        ok = isinstance(value, float)
    elif f.type == "string":
        ok = isinstance(value, str)
    elif f.type == "list<string>":
        ok = isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value)
        if ok and len(value) > MAX_LIST_ITEMS:  # type: ignore[arg-type]
            return f"has more than {MAX_LIST_ITEMS} items"
    else:
        ok = isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        if ok and len(value) > MAX_LIST_ITEMS:  # type: ignore[arg-type]
            return f"has more than {MAX_LIST_ITEMS} entries"
    return None if ok else f"is {type(value).__name__} {value!r:.60}, not {f.type}"


def problems(kind: EntityKind, fields: Mapping[str, object]) -> list[str]:
    """Every way ``fields`` differ from the schema of ``kind``: a field missing or unknown, a wrong type."""
    spec = SCHEMA[kind]
    out = [f"{name}: not a field of {kind}" for name in fields if name not in spec.names]
    for f in spec.fields:
        if f.name not in fields:
            out.append(f"{f.name}: missing")
            continue
        why = type_problem(f, fields[f.name])
        if why:
            out.append(f"{f.name}: {why}")
    return out


# -- values, bounded


def _s(value: str | None) -> str | None:
    if value is None:
        return None
    return value if len(value) <= MAX_STRING_CHARS else value[:MAX_STRING_CHARS]


def _path(value: str) -> str:

    return _s(shown(value)) or ""


def _list(values: Iterable[str]) -> tuple[str, ...]:
    out: list[str] = []
    for v in values:
        if len(out) == MAX_LIST_ITEMS:
            break
        out.append(_s(v) or "")
    return tuple(out)


def _map(values: Mapping[str, str]) -> dict[str, str]:
    return {_s(k) or "": _s(v) or "" for k, v in list(values.items())[:MAX_LIST_ITEMS]}


def _double(value: float | None) -> float | None:
    """A float, never NaN (unknown is null); an infinity stays one (it means unbounded, as in the metrics)."""
    if value is None or math.isnan(value):
        return None
    return float(value)


# -- entities of a View


def _mount_fields(mv: MountView, view: View, runs: int, important: int) -> dict[str, FieldValue]:
    m = mv.mount
    u = m.usage
    ref = mv.volume
    lat = mv.io.latency
    read = lat.get("read")
    write = lat.get("write")
    probe = mv.io.probe
    return {
        "mountpoint": _path(m.mountpoint),
        "device": _path(m.device),
        "fstype": _s(m.fstype) or "",
        "durability": mv.verdict.durability.value,
        "ephemeral": mv.verdict.durability.ephemeral,
        "durability_reason": _s(mv.verdict.reason) or "",
        "readonly": m.readonly,
        "stuck": mv.stuck,
        "stuck_seconds": float(m.stuck_seconds),
        "size_bytes": u.size_bytes if u else None,
        "avail_bytes": u.avail_bytes if u else None,
        "used_ratio": _double(u.used_ratio) if u else None,
        "files_free": u.files_free if u else None,
        "read_latency_p95_seconds": _double(read.minute.p95_seconds) if read else None,
        "write_latency_p95_seconds": _double(write.minute.p95_seconds) if write else None,
        "probe_ok": None if probe is None else (probe.seconds is not None and not probe.stuck and probe.error is None),
        "namespace": _s(ref.namespace) if ref else None,
        "pod": _s(ref.pod) if ref else None,
        "volume_kind": _s(ref.volume_kind) if ref else None,
        "pvc": _s(ref.pvc) if ref else None,
        "storage_class": _s(ref.storage_class) if ref else None,
        "runs": runs,
        "important_bytes": important,
    }


def _node_draining(view: View) -> bool | None:
    kube = view.kube
    if kube is None or not kube.enabled or kube.node is None:
        return None
    return kube.node.draining


def run_severity(view: View) -> dict[str, Severity]:
    """Each run's severity, by its label: its checkpoint or model finding's, warning for a run without one (nothing of
    it is only on storage lost with the node). What a run entity's ``severity`` holds; the alerts about a run take
    the same from ``storwatch_finding``'s severity label, warning where it has no finding (mixin/rules.py)."""
    out: dict[str, Severity] = {rv.label: "warning" for rv in view.checkpoints}
    for f in view.findings:
        if f.kind != "dataset" and f.run in out and (out[f.run] == "warning" or f.severity == "critical"):
            out[f.run] = f.severity
    return out


def _run_entities(view: View) -> list[Entity]:
    recovery = {r.run: r for r in view.recovery}
    severities = run_severity(view)
    draining = _node_draining(view)
    move_to = {f.run: f.move_to for f in view.findings if f.kind != "dataset"}
    out = []
    for rv in view.checkpoints:
        run = rv.run
        rec = recovery.get(rv.id)
        newest = run.checkpoints[-1] if run.checkpoints else None
        newest_complete = run.newest_complete
        mount = rv.mount
        terminating: bool | None = None
        seconds_left: float | None = None
        grace: float | None = None
        pod = rv.pod  # the pod whose end takes the run away (analysis/build.py run_pods)
        if pod is not None:
            seconds_left = pod.seconds_left(view.timestamp)
            terminating = seconds_left is not None
            grace = pod.grace_seconds if pod.grace_seconds is not None else pod.termination_grace_seconds
        rp = rec.recovery_point_seconds if rec is not None else None
        durable = (
            rec is not None
            and not (rp is not None and math.isinf(rp))
            and (rp is not None or rec.unknown_reason is not None)
        )
        fields: dict[str, FieldValue] = {
            "run": _s(rv.label) or "",
            "path": _path(rv.directory),
            "mountpoint": _path(mount.mount.mountpoint) if mount else None,
            "durability": mount.verdict.durability.value if mount else None,
            "ephemeral": mount.verdict.durability.ephemeral if mount else None,
            "complete": len(run.complete),
            "incomplete": run.incomplete,
            "corrupt": run.corrupt,
            "unsafe": run.unsafe,
            "abandoned": run.abandoned,
            "newest_verdict": newest.verdict if newest else None,
            "newest_reason": _s(newest.reason) if newest else None,
            "newest_complete_age_seconds": _double(rec.newest_age_seconds) if rec else None,
            "newest_complete_bytes": newest_complete.size_bytes if newest_complete else None,
            "recovery_point_seconds": _double(rp),
            "durable_checkpoint": durable,
            "interval_seconds": _double(run.interval_seconds),
            "write_cost_seconds": _double(rec.write_cost_seconds) if rec else None,
            "recommended_interval_seconds": _double(rec.recommended_interval_seconds) if rec else None,
            "headroom_bytes": rec.headroom_bytes if rec else None,
            "gpus": rec.gpus if rec else None,
            "gpu_seconds_at_risk": _double(rec.gpu_seconds_at_risk) if rec else None,
            "severity": severities.get(rv.label, "warning"),
            "workload": _s(rec.workload) if rec else None,
            "writing": rv.writing,
            "writers": len(rv.writers),
            "orphaned_temps": run.orphaned_temps,
            "orphaned_temp_bytes": run.orphaned_temp_bytes,
            "pod_terminating": terminating,
            "pod_seconds_left": _double(seconds_left),
            "pod_grace_seconds": _double(grace),
            "node_draining": draining,
            "namespace": _s(pod.namespace) if pod is not None else None,
            "pod": _s(pod.name) if pod is not None else None,
            "checkpoint": _s(os.path.basename(newest_complete.path.rstrip("/"))) if newest_complete else None,
            **_run_words(rv, rec, draining, pod, seconds_left, move_to.get(rv.label)),
        }
        pids = tuple(dict.fromkeys((*rv.writers, *run.writing_pids)))
        out.append(
            Entity(
                "run",
                rv.label,
                fields,
                run_dir=run.path,
                writer_pids=pids,
                writers_seen=dict(rv.writers_seen),
                run_root=run.root,
                checkpoint_path=newest_complete.path if newest_complete else None,
                checkpoint_mtime=newest_complete.mtime if newest_complete else None,
                owner=_run_owner(view, rv, pod),
            )
        )
    return out


def _run_words(
    rv: RunView,
    rec: RunRecovery | None,
    draining: bool | None,
    pod: PodInfo | None,
    seconds_left: float | None,
    move_to: str | None,
) -> dict[str, FieldValue]:
    """A run's figures in the words its messages use (storwatch.words): what protects it, what is at risk, what is
    taking it away, and where its checkpoints could go."""
    rp = rec.recovery_point_seconds if rec is not None else None
    copy = rv.newest_copy
    if rec is None or (rp is None and rec.unknown_reason is None):
        protection = "whether a checkpoint of it survives losing the node is unknown"
    elif rp is None:
        why = rec.unknown_reason
        protection = f"the age of its newest checkpoint that survives losing the node is unknown ({why})"
    elif math.isinf(rp):
        protection = "no checkpoint of it survives losing the node"
    else:
        protection = f"its newest checkpoint that survives losing the node is {words.span(rp)} old"
        if copy is not None:
            how = "storwatch's verified copy" if copy.how == "verified" else "a copy at the same path"
            protection += f" ({how} at {copy.where})"
    gpus = rec.gpus if rec is not None else None
    if not gpus:
        at_risk = "no GPU of this node is known to write it" if gpus == 0 else "its GPUs are unknown"
    elif rp is None:
        at_risk = f"the GPU time at risk on its {gpus} GPUs is unknown"
    elif math.isinf(rp):
        at_risk = f"all the GPU time of its {gpus} GPUs since it began is at risk"
    else:
        at_risk = f"{words.span(rp * gpus)} of GPU time at risk ({gpus} GPUs)"
    parts = []
    if draining:
        parts.append("the node is draining")
    if pod is not None and seconds_left is not None:
        parts.append(f"its pod {_s(pod.namespace)}/{_s(pod.name)} is being deleted ({words.span(seconds_left)} left)")
    ephemeral = rv.mount is not None and rv.mount.verdict.durability.ephemeral
    if move_to is not None:
        step = f"copy them to {_path(move_to)}"
    elif ephemeral:
        step = (
            "no durable destination known: set sync.destinations (or checkpoints.roots on durable storage), as "
            "this node has no cluster or region storage mounted"
        )
    else:
        step = ""
    return {
        "protection": _s(protection) or "",
        "at_risk": at_risk,
        "going": " and ".join(parts) if parts else None,
        "move_to": _path(move_to) if move_to is not None else None,
        "next_step": _s(step) or "",
    }


def _run_owner(view: View, rv: RunView, pod: PodInfo | None) -> str | None:
    """Whose run it is, for the actions' budgets: the namespace of its pod, else the uid that owns its directory,
    else the user of the Slurm job that writes it (each as the kernel or the API server says, never a tenant's
    claim); None when nothing says."""
    if pod is not None and pod.namespace:
        return f"namespace:{pod.namespace}"
    if rv.run.uid is not None:
        return f"uid:{rv.run.uid}"
    writers = (c.writer_pid for c in reversed(rv.run.checkpoints) if c.writer_pid is not None)
    for pid in (*rv.writers, *rv.run.writing_pids, *writers):
        job = view.jobs.get(pid)
        if job is not None and job.uid is not None:
            return f"uid:{job.uid}"
    return None


def _gpu_entities(view: View) -> list[Entity]:
    from storwatch.analysis.pods import workload_name

    facts = view.gpus
    if facts is None:
        return []
    state = view.stalls
    settled: dict[str, float] = {}
    current: dict[str, tuple[str, str]] = {}
    if state is not None:
        for (gpu, _mp, _cause), seconds in state.totals.items():
            settled[gpu] = settled.get(gpu, 0.0) + seconds
        for stall in sorted(state.current, key=lambda s: s.end):
            current[stall.gpu] = (stall.cause, stall.mountpoint)
    out = []
    for g in facts.gpus:
        label = str(g.index)
        now_stall = current.get(label)
        fields: dict[str, FieldValue] = {
            "index": g.index,
            "uuid": _s(g.uuid),
            "name": _s(g.name),
            "up": g.up,
            "utilization_ratio": _double(g.utilization_ratio),
            "memory_used_bytes": g.memory_used_bytes,
            "memory_total_bytes": g.memory_total_bytes,
            "processes": len(g.processes),
            "workloads": _list(dict.fromkeys(workload_name(p.pid, view.pods, view.jobs) for p in g.processes)),
            "xid_errors": sum(g.xid_counts.values()),
            "stalling": None if state is None else now_stall is not None,
            "stall_cause": now_stall[0] if now_stall else None,
            "stall_mountpoint": _path(now_stall[1]) if now_stall else None,
            "stall_seconds_total": None if state is None else float(settled.get(label, 0.0)),
            "stall_share_10m": _double(state.share_10m.get(label)) if state is not None else None,
            "stall_now": (
                "stalls are not tracked"
                if state is None
                else "not stalled now"
                if now_stall is None
                else f"now: {words.CAUSE_WORDS.get(now_stall[0], now_stall[0])} on {_path(now_stall[1])}"
            ),
        }
        out.append(Entity("gpu", g.uuid or f"index:{g.index}", fields))
    return out


def _workload_entities(view: View) -> list[Entity]:
    from storwatch.analysis.pods import workload_name

    facts = view.access
    if facts is None:
        return []
    gpus_of: dict[int, list[str]] = {}
    if view.gpus is not None:
        for g in view.gpus.gpus:
            for p in g.processes:
                gpus_of.setdefault(p.pid, []).append(g.uuid or str(g.index))
    ephemeral = {mv.mount.mountpoint for mv in view.mounts if mv.verdict.durability.ephemeral}
    out = []
    for pid, w in sorted(facts.workloads.items()):
        pod = view.pods.get(pid)
        job = view.jobs.get(pid)
        fields: dict[str, FieldValue] = {
            "pid": pid,
            "workload": _s(workload_name(pid, view.pods, view.jobs)) or "",
            "comm": _s(w.comm),
            "namespace": _s(pod.namespace) if pod else None,
            "pod": _s(pod.name) if pod else None,
            "slurm_job": job.job_id if job else None,
            "gpus": _list(gpus_of.get(pid, ())),
            "read_bytes": w.io.read_bytes,
            "write_bytes": w.io.write_bytes,
            "mounts_read": _list(_path(m) for m in w.mounts_read),
            "mounts_written": _list(_path(m) for m in w.mounts_written),
            "writes_ephemeral": any(m in ephemeral for m in w.mounts_written),
            "processes": w.processes,
            "sampled": w.sampled,
        }
        owner = f"namespace:{pod.namespace}" if pod and pod.namespace else None
        if owner is None and job is not None and job.uid is not None:
            owner = f"uid:{job.uid}"
        out.append(Entity("workload", f"pid:{pid}", fields, owner=owner))
    return out


def _finding_entities(view: View, owners: Mapping[str, str | None]) -> list[Entity]:
    """``owners``: each run's owner, by its label (a finding is its run's)."""
    out = []
    for f in view.findings:
        fields: dict[str, FieldValue] = {
            "id": f.id,
            "kind": f.kind,
            "severity": f.severity,
            "severity_reason": _s(f.severity_reason) or "",
            "mountpoint": _path(f.mountpoint),
            "durability": f.durability,
            "pod_uid": _s(f.pod_uid),
            "run": _s(f.run) or "",
            "path": _path(f.path),
            "count": f.count,
            "bytes": f.bytes,
            "newest_age_seconds": _double(f.newest_age_seconds),
            "durable_age_seconds": _double(f.durable_age_seconds),
            "exposed_seconds": _double(f.exposed_seconds),
            "exposed_at_least": f.exposed_at_least,
            "move_to": _path(f.move_to) if f.move_to is not None else None,
            "sentence": _s(f.sentence) or "",
        }
        out.append(Entity("finding", f.id, fields, owner=owners.get(f.run) if f.kind != "dataset" else None))
    return out


def _node_entity(view: View) -> Entity:
    kube = view.kube
    on = kube is not None and kube.enabled
    node = kube.node if kube is not None and on else None
    gpus = view.gpus
    fields: dict[str, FieldValue] = {
        "platform": view.platform.name,
        "ready": view.ready,
        "kubernetes": on,
        "kube_api_up": kube.api_up if kube is not None and on else None,
        "node_name": _s(node.name) if node else None,
        "cordoned": node.cordoned if node else None,
        "draining": node.draining if node else None,
        "removal_taints": _list(node.removal_taints) if node else (),
        "terminating_pods": len(kube.terminating_pods(view.timestamp)) if kube is not None and on else None,
        "nvml_up": gpus.nvml_up if gpus is not None else None,
        "gpus": len(gpus.gpus) if gpus is not None else None,
        "stuck_mounts": sum(1 for mv in view.mounts if mv.stuck),
        "findings": len(view.findings) + view.left_out.findings,
        "critical_findings": sum(1 for f in view.findings if f.severity == "critical"),
        "runs": len(view.checkpoints) + view.left_out.runs,
        "collectors_failing": _list(c.name for c in view.collectors if c.enabled and not c.success),
    }
    return Entity("node", "node", fields)


def alert_subject(labels: Mapping[str, str], named: Mapping[EntityKind, Sequence[Entity]]) -> Entity | None:
    """The entity of this node an alert's labels name: the run its ``run`` label names (the run label of the
    storwatch_* series), else the mount of its ``mountpoint``, else the GPU of its ``uuid``, else of its ``gpu`` (the
    NVML index, as storwatch_gpu_* label it). The most specific label present decides: a run label naming no run
    here names nothing, rather than its mount. ``named``: the View's runs, mounts and GPUs."""
    if "run" in labels:
        return next((e for e in named.get("run", ()) if e.key == labels["run"]), None)
    if "mountpoint" in labels:
        return next((e for e in named.get("mount", ()) if e.fields.get("mountpoint") == labels["mountpoint"]), None)
    if "uuid" in labels:
        return next((e for e in named.get("gpu", ()) if e.fields.get("uuid") == labels["uuid"]), None)
    if "gpu" in labels:
        return next((e for e in named.get("gpu", ()) if str(e.fields.get("index")) == labels["gpu"]), None)
    return None


def _alert_entities(
    alerts: Iterable[Alert], now: float, named: Mapping[EntityKind, Sequence[Entity]] | None = None
) -> list[Entity]:
    out = []
    for a in alerts:
        subject = alert_subject(a.labels, named or {})
        checkpoint = subject.fields.get("checkpoint") if subject is not None and subject.kind == "run" else None
        fields: dict[str, FieldValue] = {
            "fingerprint": _s(a.fingerprint) or "",
            "status": a.status,
            "alertname": _s(a.labels.get("alertname")),
            "severity": _s(a.labels.get("severity")),
            "labels": _map(a.labels),
            "annotations": _map(a.annotations),
            "starts_at": float(a.starts_at),
            "ends_at": _double(a.ends_at),
            "age_seconds": max(0.0, float(now - a.starts_at)),
            "entity_kind": subject.kind if subject is not None else None,
            "entity_key": _s(subject.key) if subject is not None else None,
            "checkpoint": checkpoint if isinstance(checkpoint, str) else None,
        }
        # The actions of an alert's rules act on its subject, within its owner's budgets.
        out.append(Entity("alert", a.fingerprint, fields, owner=subject.owner if subject else None, subject=subject))
    return out


def entities(view: View, alerts: Sequence[Alert] = ()) -> dict[EntityKind, list[Entity]]:
    """Every entity of ``view`` and ``alerts``, by kind: views of the View's records, never joins of their own."""
    runs: dict[str, int] = {}
    for rv in view.checkpoints:
        if rv.mount is not None:
            runs[rv.mount.mount.mountpoint] = runs.get(rv.mount.mount.mountpoint, 0) + 1
    important: dict[str, int] = {}
    for (mp, _kind), size in view.important_bytes().items():
        important[mp] = important.get(mp, 0) + size
    mounts = [
        Entity(
            "mount",
            mv.mount.mountpoint,
            _mount_fields(mv, view, runs.get(mv.mount.mountpoint, 0), important.get(mv.mount.mountpoint, 0)),
        )
        for mv in view.mounts
    ]
    run_entities = _run_entities(view)
    gpus = _gpu_entities(view)
    return {
        "mount": mounts,
        "run": run_entities,
        "gpu": gpus,
        "workload": _workload_entities(view),
        "finding": _finding_entities(view, {e.key: e.owner for e in run_entities}),
        "node": [_node_entity(view)],
        "alert": _alert_entities(alerts, view.timestamp, {"run": run_entities, "mount": mounts, "gpu": gpus}),
    }


# -- docs/policy.md


def _actions_pace() -> list[str]:
    """docs/policy.md's section on how often actions run, from the runner's own limits."""
    from storwatch.actions.runner import DEFAULT_LIMITS, MAX_LANES, OTHER_LIMITS

    lines = [
        "## How often actions run",
        "",
        "Each request spends a token from three budgets, each a token bucket (so many at once, then so many a",
        "second): its action's, its rule's for that action, and its owner's for that action. The owner is who the",
        "entity belongs to as the kernel and the cluster say, never a name a tenant wrote: a run's pod's namespace,",
        "else the uid that owns the run's directory, else the user of the Slurm job the kernel shows writing it; a",
        "finding is its run's, a workload its pod's namespace or its job's user; mounts, GPUs and the node are",
        "no one's and spend only the first two. A token is taken from every budget or from none, so neither one",
        "rule nor one tenant's entities can use up what the others need.",
        "",
        "A request refused for its rate (`rate_limited`, counted once) is not dropped: the engine asks for it again",
        "at every View while its rule still fires for the entity, whatever its cooldown (0 included), until tokens",
        "return; an owed resolution likewise, until the entity fires again. A firing that never went out is never",
        "resolved. Within one View, entities whose age is known go first (a run whose newest checkpoint, or a",
        "finding whose newest file, is dated in the future goes last), then the runs with the most GPU-seconds at",
        "risk.",
        "",
        "Each action runs off the engine's thread on a lane of its own (a bounded queue and a worker held to the",
        f"action's time); webhooks have one lane per receiver (`scheme://host:port`, at most {MAX_LANES}: past",
        "that, while all are busy, the others share one more), so a receiver that never answers holds up only its",
        "own webhooks.",
        "",
        "| action | time | at once | a second | per rule: at once, a second | per owner: at once, a second |",
        "|---|---|---|---|---|---|",
    ]

    def budget(burst: int | None, rate: float) -> str:
        return "none" if burst is None else f"{burst}, {rate:g}"

    for name, lim in [*DEFAULT_LIMITS.items(), ("any other", OTHER_LIMITS)]:
        shown = f"`{name}`" if name in DEFAULT_LIMITS else name
        lines.append(
            f"| {shown} | {lim.timeout:g} s | {lim.burst} | {lim.per_second:g} | "
            f"{budget(lim.rule_burst, lim.rule_per_second)} | {budget(lim.owner_burst, lim.owner_per_second)} |"
        )
    return [*lines, ""]


def markdown() -> str:
    """docs/policy.md: the rule file's format, the language's bounds, and every kind's fields (generated; a test keeps
    the file current)."""
    from storwatch.policy.cel import CHARS_PER_UNIT, DEFAULT_BOUNDS, GLOBAL_FUNCTIONS, MEMBER_FUNCTIONS

    b = DEFAULT_BOUNDS
    lines = [
        "# Policy: rules over what the agent sees",
        "",
        "<!-- Generated from storwatch/policy/schema.py by `storwatch policy show`; tests/test_policy_schema.py "
        "keeps it current. -->",
        "",
        "A policy file (YAML) holds `rules`, and may hold `macros` and `lists` that rules use. Several files load in",
        "order; a later one may `override` a rule of an earlier one. `storwatch policy check FILE...` checks files,",
        "`storwatch policy test FILE...` runs test cases against them; `storwatch/policies/default.yaml` (package",
        "data, generated with the alert rules from `mixin/thresholds.py`) is the shipped set.",
        "",
        "```yaml",
        "lists:",
        "  scratch_fstypes: [tmpfs, overlay]",
        "macros:",
        "  at_risk: ephemeral == true && durable_checkpoint == false",
        "rules:",
        "  - name: checkpoints-only-on-ephemeral-storage",
        "    on: run                      # the entity kind: mount, run, gpu, workload, finding, node, alert",
        "    when: at_risk && complete > 0 # a CEL expression over the entity's fields (below)",
        "    for: 5m                      # true this long before it fires (default 0: at once)",
        "    keep_firing_for: 2m          # keeps firing this long after it stops being true (default 0)",
        '    severity: warning            # info, warning or critical; "{severity}": each entity\'s own (below)',
        "    labels: {team: ml-infra}",
        '    message: "run {run} has no checkpoint that survives losing the node"',
        "    actions:",
        "      - action: event",
        "        params: {}",
        "    cooldown: 1h                 # the actions run again while it keeps firing, at most this often",
        "    repeat_on: [checkpoint]      # and whenever one of these fields changes while it fires (a newer one)",
        "    enabled: true",
        "    dry_run: false               # actions say what they would do, and do nothing",
        "  # in a later file: change that rule (as Falco's override does)",
        "  - name: checkpoints-only-on-ephemeral-storage",
        "    override: {when: append, severity: replace}  # append: `when` and-ed, actions and labels added",
        "    when: gpus > 0",
        "    severity: critical",
        "```",
        "",
        "Durations are a number of seconds or a string such as `90s`, `5m`, `2h`, `1d`. A rule's state is kept per",
        "entity (rule, kind, key): pending from the first View its condition holds, firing once it has held for",
        "`for`, resolved once it has not held for `keep_firing_for`, as in Prometheus alerting rules. Actions run",
        "when it starts firing, again while it fires at most once per `cooldown` (never when the cooldown is 0) and",
        "whenever a field of `repeat_on` changes (whatever the cooldown: a sync rule with `repeat_on: [checkpoint]`",
        "copies every newer checkpoint), and when it resolves. A reload keeps the state of every rule whose name and",
        "definition did not change.",
        "",
        '`severity: "{severity}"` gives each entity the severity of its own `severity` field (runs, findings and',
        "alerts have one; a value that is no severity, as an alert without a severity label, counts as a warning),",
        "so a run shows one severity in its finding, in the policy's rules about it and in the alerts about it.",
        "",
        "A rule `on: alert` acts on what the alert names: its labels `run`, else `mountpoint`, else `uuid` or `gpu`",
        "name a run, mount or GPU of this node (`entity_kind`, `entity_key`), and its `sync` and",
        "`request_checkpoint` actions act on that run as a rule on the run would.",
        "",
        "`message` fills `{field}` with the entity's field (null as `null`); `{{` and `}}` are braces. Nothing else",
        "is read: no attribute, index or format spec.",
        "",
        "## The condition language",
        "",
        "`when` is a [CEL](https://github.com/google/cel-spec) expression over the entity's fields, each a variable",
        "of its own name, and the policy's `lists`, each a list variable; a macro's name stands for its expression",
        "in brackets. It must give a bool. A field that may be null must be tested before it is compared",
        "(`headroom_bytes != null && headroom_bytes < 0`): comparing null with a number is an error, counted in",
        "`storwatch_policy_rule_errors_total`, and the entity is taken as not matching. Integers compare with",
        "doubles, but arithmetic does not mix them (`double(bytes) / 1e9`).",
        "",
        "Bounds, checked when a policy is loaded (the CEL libraries have no cost limit of their own):",
        "",
        f"- at most {b.max_chars} characters, macros expanded, and {b.max_nodes} nodes;",
        f"- nested at most {b.max_depth} levels (brackets, calls and chains of operators alike);",
        f"- comprehensions (`all`, `exists`, `exists_one`, `map`, `filter`) at most {b.max_comprehension_nesting} "
        "deep: never one inside another, and no `+` inside one (it would copy strings or lists once per item);",
        f"- list and map literals of at most {b.max_list_items} items; every list field holds at most "
        f"{MAX_LIST_ITEMS}, and a list of `lists` at most {b.max_list_items};",
        "- what one evaluation can build, bounded before it runs (as Kubernetes estimates a CEL rule's cost): a list",
        "  literal holds its items, `a + b` both operands, a `map` or `filter` as many items as the list it runs over,",
        "  each as large as its body gives, so a chain of macros carries its bounds from link to link. Refused when it",
        f"  could hold more than {b.max_held_elements} elements of lists and maps at once (every item of a nested list "
        "counts), more than",
        f"  {b.max_held_chars} characters of strings, or when its estimated cost passes {b.max_cost}: a unit per node "
        "evaluated and per",
        f"  element built or compared, one per {CHARS_PER_UNIT} characters scanned or copied, a comprehension's body "
        "once per item, and a",
        "  regular expression's compilation, which the library repeats at every call (more for `\\w`, `\\p{..}` and "
        "`{n}`",
        "  repeats);",
        f"- functions: {', '.join(sorted(GLOBAL_FUNCTIONS))}, and as methods "
        f"{', '.join(sorted(MEMBER_FUNCTIONS))}; `matches` only with a string literal as its pattern.",
        "",
        "At evaluation, a rule whose evaluations over one View take longer than its time budget is disabled, with",
        "the reason, until the policy is reloaded.",
        "",
        *_actions_pace(),
        "## Fields",
        "",
        f"Strings hold at most {MAX_STRING_CHARS} characters; a null field is one the agent does not know.",
    ]
    for spec in SCHEMA.values():
        lines += ["", f"### `{spec.kind}`", "", f"{spec.doc} Key: {spec.key}.", "", "| field | type | meaning |"]
        lines.append("|---|---|---|")
        for f in spec.fields:
            typ = f"{f.type} or null" if f.nullable else f.type
            lines.append(f"| `{f.name}` | {typ} | {f.doc.replace('|', chr(92) + '|')} |")
    return "\n".join(lines) + "\n"


__all__ = [
    "MAX_STRING_CHARS",
    "SCHEMA",
    "SEVERITY_FIELDS",
    "Field",
    "FieldType",
    "Kind",
    "alert_subject",
    "entities",
    "field_size",
    "markdown",
    "problems",
    "run_severity",
    "type_problem",
]
