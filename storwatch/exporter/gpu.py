"""The GPU area: NVML's state, each GPU's utilisation, memory, power, temperature, throttling and Xid errors, and the
GPU memory each pod's processes hold (storwatch_nvml_up, storwatch_gpu_*)."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter.area import ExportState
from storwatch.exporter.text import Family

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


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    if view is None or view.gpus is None:
        return
    facts = view.gpus
    nvml_up = Family("storwatch_nvml_up", "1 when NVML is loaded and answering on this node.")
    nvml_up.add((), 1 if facts.nvml_up else 0)
    yield nvml_up
    gpu_labels = ("gpu", "uuid")
    info = Family("storwatch_gpu_info", "A GPU on this node (NVML index, UUID, model).", labels=("gpu", "uuid", "name"))
    up = Family("storwatch_gpu_up", "1 when the GPU answers NVML; 0 when lost or stuck.", labels=gpu_labels)
    gauges = {name: Family(name, help_, labels=gpu_labels) for name, help_ in _GPU_GAUGES}
    throttled = Family(
        "storwatch_gpu_clock_throttled",
        "1 while clocks are held down for this reason.",
        labels=(*gpu_labels, "reason"),
    )
    xid = Family(
        "storwatch_gpu_xid_errors_total",
        "Xid critical errors since the agent started.",
        "counter",
        labels=(*gpu_labels, "xid"),
    )
    processes = Family("storwatch_gpu_processes", "Compute processes on the GPU.", labels=gpu_labels)
    pod_memory = Family(
        "storwatch_gpu_pod_memory_used_bytes",
        "GPU memory held by a pod's processes (pod_uid empty: processes outside any pod).",
        labels=(*gpu_labels, "pod_uid", "namespace", "pod"),
    )
    job_memory = Family(
        "storwatch_gpu_job_memory_used_bytes",
        "GPU memory held by a Slurm job's processes (written on nodes where GPU processes run in Slurm jobs).",
        labels=(*gpu_labels, "job"),
    )
    pods, jobs = view.pods, view.jobs
    for g in facts.gpus:
        labels = (str(g.index), g.uuid or "")
        info.add((*labels, g.name or ""), 1)
        up.add(labels, 1 if g.up else 0)
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
            gauges[name].add(labels, value)
        if g.throttle_reasons is not None:
            for reason, bit in _THROTTLE_REASONS:
                throttled.add((*labels, reason), 1 if g.throttle_reasons & bit else 0)
        for code, count in sorted(g.xid_counts.items()):
            xid.add((*labels, str(code)), count)
        processes.add(labels, len(g.processes))
        by_pod: dict[str, int] = {}
        names: dict[str, tuple[str, str]] = {}
        for proc in g.processes:
            pod = pods.get(proc.pid)
            uid = (pod.pod_uid or "") if pod is not None else ""
            by_pod[uid] = by_pod.get(uid, 0) + (proc.used_memory_bytes or 0)
            if pod is not None and pod.namespace is not None and pod.name is not None:
                names[uid] = (pod.namespace, pod.name)
        for pod_uid, used in sorted(by_pod.items()):
            namespace, name = names.get(pod_uid, ("", "")) if pod_uid else ("", "")
            pod_memory.add((*labels, pod_uid, namespace, name), used)
        by_job: dict[int, int] = {}
        for proc in g.processes:
            job = jobs.get(proc.pid)
            if job is not None:
                by_job[job.job_id] = by_job.get(job.job_id, 0) + (proc.used_memory_bytes or 0)
        for job_id, used in sorted(by_job.items()):
            job_memory.add((*labels, str(job_id)), used)
    yield from (info, up, *gauges.values(), throttled, xid, processes, pod_memory)
    if job_memory.lines:
        yield job_memory
    if view.stalls is not None:
        stalls = Family(
            "storwatch_gpu_stall_seconds_total",
            "GPU time spent waiting on storage (utilisation low while its process holds memory), by the mount and "
            "cause that explain it: checkpoint_write, data_read or io_contention; counted once settled, about a "
            "checkpoint scan interval after it happened.",
            "counter",
            labels=("gpu", "uuid", "mountpoint", "cause"),
        )
        uuids = {str(g.index): g.uuid or "" for g in facts.gpus}
        for (gpu, mountpoint, cause), seconds in sorted(view.stalls.totals.items()):
            stalls.add((gpu, uuids.get(gpu, ""), mountpoint, cause), seconds)
        yield stalls
