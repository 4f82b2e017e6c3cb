"""The View as plain data: the one shape behind /api/status, ``scan --json``, the status page and the scan table.

That data is JSON as RFC 8259 has it: a number that is not finite (an infinity or NaN, which Python's json would
write as the bare words ``Infinity`` and ``NaN`` that browsers and strict parsers refuse) is ``null``, and
``non_finite_values`` says where each was and what it held.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from storwatch import words
from storwatch.analysis.latency import WindowStats
from storwatch.analysis.pods import ProcessPod, workload_name
from storwatch.analysis.recovery import checkpoint_age_seconds, recovery_point_seconds
from storwatch.analysis.view import MountView, RunView, View
from storwatch.classify import is_pseudo_mount
from storwatch.printable import shown
from storwatch.procfs.cgroup import SlurmJob
from storwatch.sources.access import ACCESS
from storwatch.sources.checkpoint_key import HOW_TO_ADD
from storwatch.sources.kubevolumes import ClusterObjects, volume_ref
from storwatch.sources.mounts import display_path
from storwatch.vocabulary import FsUsage, Mount

GPU_OFF = "GPU source off"
"""The NVML error of a View without GPU facts (gpu.enabled: false)."""

PROBE_KEY = "probes.mountpoints"
"""The configuration key that gives a mount a latency source where nothing else measures it (a FUSE mount, say)."""
NO_LATENCY_SOURCE = f"no latency source \N{EM DASH} enable probes: {PROBE_KEY}"
"""What a mount with no latency source says instead of a figure, and how to get one."""

NON_FINITE = "non_finite_values"
"""The key of the list of the numbers of a report that were not finite and are null in it (:func:`finite_data`)."""


def finite_data(data: Any) -> tuple[Any, list[dict[str, str]]]:
    """``data`` (mappings, lists and tuples of plain values, as json.dumps takes them) with every float that is not
    finite replaced by None; and for each, where it was (a JSON Pointer, RFC 6901) and what it held (``inf``,
    ``-inf``, ``nan``), in the order found. Whatever reaches a report (a tenant's event line of ``"end": 1e999``, a
    division by a zero duration), what is written of it is then JSON. Every string (values and keys) holding a byte
    that is not UTF-8 (a name from disk) is :func:`printable.shown` in the same pass, so nothing written of it holds a
    lone surrogate. Containers holding nothing that changes are kept as they are, not copied."""
    found: list[dict[str, str]] = []

    def leaf(value: float, path: tuple[str, ...]) -> None:
        found.append({"pointer": "".join("/" + _pointer_token(p) for p in path), "value": repr(value)})

    def walk(value: Any, path: tuple[str, ...]) -> Any:
        # Only floats, strings that are not ASCII and containers are looked at, and a container is copied only once
        # something in it changes: a report without such a value is walked without building anything.
        mapping = isinstance(value, Mapping)
        items = value.items() if mapping else enumerate(value)
        copy: Any = None
        renamed: dict[Any, str] = {}
        for key, item in items:
            if mapping and type(key) is str and not key.isascii() and shown(key) != key:
                renamed[key] = shown(key)
            kind = type(item)
            if kind is float:
                if math.isfinite(item):
                    continue
                leaf(item, (*path, str(key)))
                new = None
            elif kind is str:
                if item.isascii():
                    continue
                new = shown(item)
                if new == item:
                    continue
            elif kind is dict or kind is list or kind is tuple or isinstance(item, Mapping):
                new = walk(item, (*path, str(key)))
                if new is item:
                    continue
            else:
                continue
            if copy is None:
                copy = dict(value) if mapping else list(value)
            copy[key] = new
        if renamed:
            copy = {renamed.get(k, k): v for k, v in (copy if copy is not None else value).items()}
        return value if copy is None else copy

    if isinstance(data, float):
        if math.isfinite(data):
            return data, found
        leaf(data, ())
        return None, found
    if isinstance(data, Mapping | list | tuple):
        return walk(data, ()), found
    if isinstance(data, str):
        return shown(data), found
    return data, found


def _pointer_token(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def strict_json(data: Any, indent: int | None = None) -> str:
    """``data`` as RFC 8259 JSON: a float that is not finite raises (ValueError) rather than being written as a bare
    ``Infinity`` or ``NaN``; pass the data through :func:`finite_data` first (view_to_dict does)."""
    return json.dumps(data, allow_nan=False, indent=indent)


def view_to_dict(view: View, sample_seconds: float | None = None) -> dict[str, Any]:
    """The View as plain data, every number in it finite or null (:func:`finite_data`; ``non_finite_values`` says
    which were not). ``sample_seconds``: the latency is that of one interval of this length (``scan --sample``),
    labelled ``sample`` rather than as the agent's minute and hour windows."""
    cluster = view.kube.cluster if view.kube is not None else ClusterObjects()
    mounts = []
    for mv in view.mounts:
        m = mv.mount
        u = m.usage
        mounts.append(
            {
                "mountpoint": display_path(m.mountpoint),
                "device": display_path(m.device),
                "fstype": m.fstype,
                "durability": mv.verdict.durability.value,
                "ephemeral": mv.verdict.durability.ephemeral,
                "pseudo": is_pseudo_mount(m.mountpoint),
                "reason": mv.verdict.reason,
                "evidence": [
                    {"source": e.source.label, "durability": e.durability.value, "reason": e.reason}
                    for e in mv.verdict.evidence
                ],
                "stuck": mv.stuck,
                "stuck_seconds": round(m.stuck_seconds, 3),
                "readonly": m.readonly,
                "size_bytes": u.size_bytes if u else None,
                "used_bytes": (u.size_bytes - u.free_bytes) if u else None,
                "avail_bytes": u.avail_bytes if u else None,
                "free_bytes": u.free_bytes if u else None,
                "reserved_bytes": (u.free_bytes - u.avail_bytes) if u else None,
                "used_ratio": used_ratio(u),
                "files": u.files if u else None,
                "files_free": u.files_free if u else None,
                "usage_error": m.usage_error,
                "root": display_path(m.root),
                "device_number": f"{m.major}:{m.minor}",
                "stuck_probe": bool(mv.io.probe and mv.io.probe.stuck),
                "io": _io_dict(mv, sample_seconds),
                "kube": _volume_dict(m, cluster),
            }
        )
    data = {
        "generated_at": view.timestamp,
        "latency_windows": ["sample"] if sample_seconds else ["1m", "1h"],
        "sample_seconds": sample_seconds or None,
        "gpus": _gpus_dict(view),
        "checkpoints": _checkpoints_dict(view),
        "findings": _findings_list(view),
        # The runs past the bound on runs: no row under checkpoints, their findings not listed, their bytes and
        # GPU-seconds at risk here, so that findings' bytes plus these are the node's whole.
        "left_out": {
            "runs": view.left_out.runs,
            "findings": view.left_out.findings,
            "important_bytes": [
                {"mountpoint": display_path(mp), "kind": kind, "bytes": size}
                for (mp, kind), size in sorted(view.left_out.important_bytes.items())
            ],
            "gpu_seconds_at_risk": view.left_out.gpu_seconds_at_risk,
        },
        "stalls": _stalls_dict(view),
        "timeline": _timeline_dict(view),
        "workloads": _workloads_list(view),
        "checkpoint_roots": None if view.checkpoint_roots is None else [display_path(r) for r in view.checkpoint_roots],
        "checkpoint_search": _search_dict(view),
        "kubernetes": _kube_dict(view),
        "nvml": nvml_status(view),
        "ready": view.ready,
        "platform": {"name": view.platform.name, "detected_by": view.platform.detected_by},
        "mounts": mounts,
        "collectors": [
            {
                "name": c.name,
                "state": c.state,
                "enabled": c.enabled,
                "success": c.success,
                "duration_seconds": round(c.duration_seconds, 6),
                "last_success_timestamp": c.last_success_timestamp,
                "error": c.error,
                "off_reason": c.off_reason,
                "parse_errors": c.parse_errors,
            }
            for c in view.collectors
        ],
    }
    plain, non_finite = finite_data(data)
    return {**plain, NON_FINITE: non_finite}


def _search_dict(view: View) -> dict[str, Any] | None:
    """Where the checkpoint scan searched and why, the places it passed over and why not, and whether its walk
    stopped at a limit; None before it first reports (or for a scan given roots alone)."""
    facts = view.checkpoint_scan
    if facts is None or facts.plan is None:
        return None
    plan = facts.plan
    return {
        "searched": [{"path": display_path(r.path), "why": r.why} for r in plan.roots],
        "passed_over": [{"path": display_path(r.path), "why": r.why} for r in plan.passed_over],
        "default_roots": plan.defaults,
        "pending": plan.pending,
        "nowhere": None if plan.roots else plan.nowhere(),
        "stopped_at_limit": facts.truncated_reason if facts.truncated else None,
    }


def _volume_dict(mount: Mount, cluster: ClusterObjects) -> dict[str, Any] | None:
    ref = volume_ref(mount, cluster)
    if ref is None:
        return None
    return {
        "namespace": ref.namespace,
        "pod": ref.pod,
        "pod_uid": ref.pod_uid,
        "volume": ref.volume,
        "volume_kind": ref.volume_kind,
        "pvc": ref.pvc,
        "pv": ref.pv,
        "storage_class": ref.storage_class,
        "provisioner": ref.provisioner,
    }


def _gpus_dict(view: View) -> list[dict[str, Any]]:
    facts = view.gpus
    if facts is None:
        return []
    out = []
    for g in facts.gpus:
        procs = []
        for p in g.processes:
            ref = view.containers.get(p.pid)
            procs.append(
                {
                    "pid": p.pid,
                    "used_memory_bytes": p.used_memory_bytes,
                    "sm_utilization": p.sm_utilization,
                    "container_id": ref.container_id if ref else None,
                    "pod_uid": ref.pod_uid if ref else None,
                    "runtime": ref.runtime if ref else None,
                    **_pod_names(view.pods.get(p.pid)),
                    **_job(view.jobs.get(p.pid)),
                }
            )
        out.append(
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "up": g.up,
                "error": g.error,
                "utilization_ratio": g.utilization_ratio,
                "memory_utilization_ratio": g.memory_utilization_ratio,
                "memory_used_bytes": g.memory_used_bytes,
                "memory_total_bytes": g.memory_total_bytes,
                "power_watts": g.power_watts,
                "temperature_celsius": g.temperature_celsius,
                "throttle_reasons": g.throttle_reasons,
                "xid_counts": {str(k): v for k, v in g.xid_counts.items()},
                "processes": procs,
                "mig_devices": [
                    {"index": m.index, "uuid": m.uuid, "memory_used_bytes": m.memory_used_bytes} for m in g.mig_devices
                ],
            }
        )
    return out


def _job(job: SlurmJob | None) -> dict[str, Any]:
    if job is None:
        return {"slurm_job": None, "slurm_step": None}
    return {"slurm_job": job.job_id, "slurm_step": job.step}


def _pod_names(pod: ProcessPod | None) -> dict[str, Any]:
    if pod is None:
        return {"namespace": None, "pod": None, "owner": None}
    return {"namespace": pod.namespace, "pod": pod.name, "owner": pod.owner}


def _kube_dict(view: View) -> dict[str, Any]:
    kube = view.kube
    if kube is None:
        return {"enabled": False, "api_up": False}
    node = kube.node
    return {
        "enabled": kube.enabled,
        "api_up": kube.api_up,
        "last_error": kube.last_error,
        "node": None
        if node is None
        else {
            "name": node.name,
            "cordoned": node.cordoned,
            "draining": node.draining,
            "removal_taints": list(node.removal_taints),
        },
        "terminating_pods": [
            {"namespace": p.namespace, "pod": p.name, "seconds_left": left}
            for p, left in kube.terminating_pods(view.timestamp)
        ],
    }


def _stalls_dict(view: View) -> dict[str, Any] | None:
    """GPU time lost to storage: settled totals, and the stalls of the last settle window (null where not tracked)."""
    state = view.stalls
    if state is None:
        return None
    return {
        "settle_seconds": state.settle_seconds,
        "totals": [
            {"gpu": gpu, "mountpoint": mp, "cause": cause, "seconds": round(seconds, 3)}
            for (gpu, mp, cause), seconds in sorted(state.totals.items())
        ],
        "current": [
            {"gpu": s.gpu, "mountpoint": s.mountpoint, "cause": s.cause, "run": s.run, "start": s.start, "end": s.end}
            for s in state.current
        ],
    }


def _workloads_list(view: View) -> list[dict[str, Any]]:
    """Each GPU process's storage profile (sources/access.py): its tree's I/O counters (``io``, /proc/<pid>/io's
    fields, summed) and the mounts it has files open on. Per PID, as /metrics never is: rates are Prometheus's."""
    facts = view.snapshot.get(ACCESS)
    if facts is None:
        return []
    return [
        {
            "pid": pid,
            "workload": workload_name(pid, view.pods, view.jobs),
            "comm": w.comm,
            "within": w.within,
            "processes": w.processes,
            "io": dataclasses.asdict(w.io),
            "mounts_read": [display_path(m) for m in w.mounts_read],
            "mounts_written": [display_path(m) for m in w.mounts_written],
            "sampled": w.sampled,
        }
        for pid, w in sorted(facts.workloads.items())
    ]


def _timeline_dict(view: View) -> dict[str, Any] | None:
    """Each GPU's last hour (10 s buckets: utilisation's mean and its lowest and highest sample), for the picture on
    /status."""
    t = view.timeline
    if t is None:
        return None

    def points(rows: tuple[tuple[float, float], ...]) -> list[list[float]]:
        return [[start, round(value, 6)] for start, value in rows]

    mounts = {mv.mount.mountpoint: mv for mv in view.mounts}

    return {
        "start": t.start,
        "end": t.end,
        "gpus": [
            {
                "gpu": g.gpu,
                "utilization": points(g.utilization),
                # [start, lowest, highest] of each bucket: the swings the mean smooths away
                "utilization_range": [
                    [start, round(low, 6), round(high, 6)] for start, low, high in g.utilization_range
                ],
                "memory": points(g.memory),
                "stalls": [
                    {"start": s.start, "end": s.end, "cause": s.label, "mountpoint": s.detail} for s in g.stalls
                ],
                "writes": [{"start": w.start, "end": w.end, "run": w.label} for w in g.writes],
                "latency_mountpoint": display_path(g.latency_mount) if g.latency_mount is not None else None,
                # what measures that mount's latency (latency_sources): none, and "latency" is unknown, not empty
                "latency_sources": latency_sources(mounts[g.latency_mount]) if g.latency_mount in mounts else None,
                "latency": points(g.latency),
            }
            for g in t.gpus
        ],
    }


def _findings_list(view: View) -> list[dict[str, Any]]:
    return [
        {
            "id": f.id,
            "kind": f.kind,
            "severity": f.severity,
            "mountpoint": display_path(f.mountpoint),
            "durability": f.durability,
            "pod_uid": f.pod_uid,
            "run": f.run,
            "path": display_path(f.path),
            "count": f.count,
            "bytes": f.bytes,
            "newest_age_seconds": f.newest_age_seconds,
            "durable_age_seconds": f.durable_age_seconds,
            "move_to": None if f.move_to is None else display_path(f.move_to),
            "sentence": f.sentence,
            # training only this node's storage holds (a lower bound where exposed_at_least), and why the severity
            "exposed_seconds": f.exposed_seconds,
            "exposed_at_least": f.exposed_at_least,
            "severity_reason": f.severity_reason,
        }
        for f in view.findings
    ]


def _checkpoints_dict(view: View) -> list[dict[str, Any]]:
    out = []
    recovery = {r.run: r for r in view.recovery}
    for rv in view.checkpoints:
        run = rv.run
        newest = run.newest_complete
        rec = recovery.get(rv.id)
        out.append(
            {
                "run": rv.label,
                "path": display_path(run.path),
                "directory": display_path(rv.directory),  # as the host names it (path: under --path.rootfs)
                "mountpoint": display_path(rv.mount.mount.mountpoint) if rv.mount else None,
                "durability": rv.mount.verdict.durability.value if rv.mount else None,
                "newest_complete": None if newest is None else display_path(newest.path),
                "newest_complete_age_seconds": recovery_point_seconds(run, view.timestamp),
                "newest_complete_size_bytes": None if newest is None else newest.size_bytes,
                "interval_seconds": run.interval_seconds,
                # null: no complete checkpoint survives losing this node (+Inf in storwatch_recovery_point_seconds),
                # or its age is unknown (recovery_point_unknown_reason says why)
                "recovery_point_seconds": None
                if rec is None or rec.recovery_point_seconds is None or math.isinf(rec.recovery_point_seconds)
                else rec.recovery_point_seconds,
                "recovery_point_unknown_reason": None if rec is None else rec.unknown_reason,
                "write_cost_seconds": None if rec is None else rec.write_cost_seconds,
                "recommended_interval_seconds": None if rec is None else rec.recommended_interval_seconds,
                "workload": None if rec is None else rec.workload,
                # null: nothing ties the run to a process (no pod's volume holds it, no writer was seen): unknown
                "gpus": None if rec is None else rec.gpus,
                # null without a GPU here, or while the recovery point is unbounded (+Inf in
                # storwatch_gpu_seconds_at_risk; with "gpus" above 0)
                "gpu_seconds_at_risk": None
                if rec is None or rec.gpu_seconds_at_risk is None or math.isinf(rec.gpu_seconds_at_risk)
                else rec.gpu_seconds_at_risk,
                "write_seconds_by_tier": {} if rec is None else dict(rec.tier_write_seconds),
                "kept": len(run.complete),
                "incomplete": run.incomplete,
                "abandoned": run.abandoned,
                "corrupt": run.corrupt,
                "unsafe": run.unsafe,
                "write_in_progress": rv.writing,
                # the copy that protects its newest save on durable storage (analysis/copies.py); null: none known
                "durable_copy": _copy_dict(rv, view.timestamp),
                "writers": list(rv.writers),
                "writing_incomplete": run.writing_incomplete,
                "orphaned_temps": run.orphaned_temps,
                "orphaned_temp_bytes": run.orphaned_temp_bytes,
                "orphaned_temp_paths": [display_path(p) for p in run.orphaned_temp_paths],
                "checkpoints": [
                    {
                        "path": display_path(c.path),
                        "format": c.format,
                        "verdict": c.verdict,
                        "reason": c.reason,
                        "size_bytes": c.size_bytes,
                        "mtime": c.mtime,
                        "age_seconds": checkpoint_age_seconds(c, view.timestamp),
                        "deep_checked": c.deep_checked,
                        "write_seconds": c.write_seconds,
                        "write_timed_by": c.write_timed_by,
                        "write_untimed_reason": c.write_untimed_reason,
                        "write_bytes_per_second": c.write_bytes_per_second,
                    }
                    for c in run.checkpoints
                ],
            }
        )
    return out


def _copy_dict(rv: RunView, now: float) -> dict[str, Any] | None:
    copy = rv.newest_copy
    if copy is None:
        return None
    return {
        "where": display_path(copy.where),
        "how": copy.how,
        "checkpoint": display_path(copy.checkpoint),
        "covers": copy.covers,
        "covers_age_seconds": checkpoint_age_seconds(copy, now),
        "made_at": copy.made,
    }


def human_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def nvml_status(view: View) -> dict[str, Any]:
    facts = view.gpus
    if facts is None:
        return {"nvml_up": False, "error": GPU_OFF, "driver_version": None}
    return {"nvml_up": facts.nvml_up, "error": facts.error, "driver_version": facts.driver_version}


def _window(stats: WindowStats) -> dict[str, Any]:
    return {
        "samples": stats.samples,
        "ops": stats.ops,
        "p50_seconds": stats.p50_seconds,
        "p95_seconds": stats.p95_seconds,
        "max_seconds": stats.max_seconds,
        "mean_seconds": stats.mean_seconds,
    }


def _io_dict(mv: MountView, sample_seconds: float | None) -> dict[str, Any]:
    io = mv.io
    block = mv.mount.block
    probe = io.probe
    if sample_seconds:
        latency = {op: {"sample": _window(s.minute)} for op, s in sorted(io.latency.items())}
    else:
        latency = {op: {"1m": _window(s.minute), "1h": _window(s.hour)} for op, s in sorted(io.latency.items())}
    return {
        "device": io.device,
        "latency_sources": latency_sources(mv),
        "physical_devices": list(block.physical) if block else [],
        "backing_file": display_path(block.backing_file) if block and block.backing_file else None,
        "nfs": io.nfs is not None,
        "latency": latency,
        "probe": None
        if probe is None
        else {
            "timestamp": probe.timestamp,
            "seconds": probe.seconds,
            "stuck": probe.stuck,
            "error": probe.error,
        },
    }


def latency_sources(mv: MountView) -> list[str]:
    """What measures the mount's I/O latency: ``diskstats`` (the block device under it), ``nfs`` (its mountstats),
    ``probe`` (an active probe chosen by the configuration). Empty where nothing does (a FUSE or overlay mount with
    no probe): its latency is unknown, never zero."""
    io = mv.io
    return [
        name
        for name, present in (("diskstats", io.device is not None), ("nfs", io.nfs is not None), ("probe", io.probe))
        if present
    ]


def latency_cell(mount: dict[str, Any], op: str, window: str = "1m") -> str:
    """``p50/p95/max`` in milliseconds for one operation, or ``-`` when the mount did none in the window; for the one
    interval of a ``sample``, its average."""
    w = mount["io"]["latency"].get(op, {}).get(window)
    if not w or not w["samples"]:
        return "-"
    if window == "sample":
        return _ms(w["mean_seconds"])
    return "/".join(_ms(w[k]) for k in ("p50_seconds", "p95_seconds", "max_seconds"))


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1000
    return f"{ms:.2f}" if ms < 10 else f"{ms:.0f}"


def human_bytes(n: int | None) -> str:
    """A size in a table: "-" where unknown (storwatch.words says it in sentences)."""
    return "-" if n is None else words.size(n)


def used_ratio(usage: FsUsage | None) -> float | None:
    """The share of the space a user can write to that is used, as df(1) counts it: used / (used + avail).

    Space reserved for root (ext4 keeps 5% by default) is neither: it is free but not available, and counting it in
    the size made / look a third as full as df says."""
    if usage is None:
        return None
    used = usage.size_bytes - usage.free_bytes
    total = used + usage.avail_bytes
    return used / total if total > 0 else None


def usage_percent(mount: dict[str, Any]) -> str:
    """Used space as df(1) prints it: used / (used + avail), rounded up to a whole percent."""
    used, avail = mount.get("used_bytes"), mount.get("avail_bytes")
    if used is None or avail is None or used + avail <= 0:
        return "-"
    return f"{-(-100 * used // (used + avail))}%"


def kube_cell(kube: dict[str, Any] | None) -> str:
    """A mount's Kubernetes objects in a line: pod, volume, PVC -> PV, StorageClass (provisioner)."""
    if kube is None:
        return "-"
    if kube["pod"] is not None:
        parts = [f"{kube['namespace']}/{kube['pod']}"]
    else:
        parts = [f"pod {kube['pod_uid']} (not known to the API)"]
    if kube["volume"] is not None:
        parts.append(f"{kube['volume_kind'] or 'volume'} {kube['volume']}")
    if kube["pvc"] is not None or kube["pv"] is not None:
        parts.append(f"PVC {kube['pvc'] or '?'} -> PV {kube['pv'] or '?'}")
    if kube["storage_class"] is not None or kube["provisioner"] is not None:
        sc = f"StorageClass {kube['storage_class']}" if kube["storage_class"] else "no StorageClass"
        parts.append(sc + (f" ({kube['provisioner']})" if kube["provisioner"] else ""))
    return ", ".join(parts)


def no_gpus_line(data: dict[str, Any]) -> str:
    """What an empty GPU table means."""
    nvml = data["nvml"]
    if nvml["nvml_up"]:
        return "no GPUs: NVML answers but lists none"
    return f"no GPUs: NVML not available ({nvml['error'] or 'no reason given'})"


@dataclass(frozen=True)
class SearchSummary:
    """What the checkpoint scan says of where it looked, in sentences for a page or a terminal."""

    places: str | None
    """"/home (home directories, node-local on together-k8s: ...); ...": where it searched, or None where nowhere."""
    unsearched: str | None
    """Why no place was searched and how to have one searched, or that the scan has not reported: where
    ``searched`` is None."""
    caveats: tuple[str, ...] = ()
    """What the search could not see: a walk stopped at a limit, a failed collection, places passed over."""
    partial: bool = False
    """Some of what was searched was not seen (a walk stopped at a limit, a failed collection)."""

    @property
    def searched(self) -> str | None:
        """ "Searched /home (...); ...", or None where no place was searched."""
        return None if self.places is None else f"Searched {self.places}"


def _places(entries: list[dict[str, Any]]) -> str:
    return "; ".join(f"{e['path']} ({e['why']})" for e in entries)


def search_summary(data: dict[str, Any]) -> SearchSummary:
    """Where the checkpoint scan looked, from the report's ``checkpoint_search`` (or, where the scan has no facts,
    its collector's state): never "nothing found" for a place it did not look."""
    search = data.get("checkpoint_search")
    status = next((c for c in data.get("collectors") or () if c["name"] == "checkpoints"), None)
    error = status["error"] if status is not None and status["state"] == "failed" else None
    if search is None:
        roots = data.get("checkpoint_roots")
        if roots:  # a scan given its roots alone, without a plan that says why each
            return SearchSummary("; ".join(roots), None, partial=bool(error))
        if status is not None and status["state"] == "off":
            return SearchSummary(None, _sentence(status["off_reason"] or "the checkpoint scan is off"))
        if error:
            return SearchSummary(
                None, _sentence(f"the checkpoint scan failed ({error}): nothing is known of what this node would lose")
            )
        if roots is not None:
            return SearchSummary(None, _sentence(f"no place searched for checkpoints; {HOW_TO_ADD}"))
        return SearchSummary(
            None, "The checkpoint scan has not reported yet: nothing is known yet of what this node would lose."
        )
    caveats = [_sentence(f"the checkpoint scan failed: {error}")] if error else []
    if not search["searched"]:
        return SearchSummary(None, _sentence(search["nowhere"]), tuple(caveats))
    if search["stopped_at_limit"]:
        caveats.append(f"The walk stopped at a limit ({search['stopped_at_limit']}): what lies past it was not seen.")
    partial = bool(error or search["stopped_at_limit"])
    if search["pending"]:
        caveats.append(_sentence(f"the default places could not be chosen ({search['pending']})"))
    if search["passed_over"]:
        caveats.append(f"Not searched: {_places(search['passed_over'])}.")
    return SearchSummary(_places(search["searched"]), None, tuple(caveats), partial)


def _sentence(text: str) -> str:
    return (text[:1].upper() + text[1:]).rstrip(".") + "."


def no_checkpoints_line(data: dict[str, Any]) -> str:
    """What an empty checkpoint table means: where the scan looked, or why it looked nowhere."""
    summary = search_summary(data)
    if summary.places is None:
        said = summary.unsearched or ""
        return " ".join(("no checkpoints: " + said[:1].lower() + said[1:], *summary.caveats))
    return " ".join((f"no checkpoints under {summary.places}.", *summary.caveats))


def mount_state(mount: dict[str, Any]) -> str:
    if mount["stuck"]:
        seconds = mount["stuck_seconds"]
        return "STUCK" if seconds is None else f"STUCK {seconds:.0f}s"
    if mount.get("usage_error"):
        return str(mount["usage_error"])
    return "ro" if mount["readonly"] else "ok"
