"""The GPU area: NVML's state, each GPU's utilisation, memory, power, temperature, throttling and Xid errors, and the
GPU memory each pod's processes hold (storwatch_nvml_up, storwatch_gpu_*)."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter import catalog
from storwatch.exporter.area import ExportState
from storwatch.exporter.text import Family

# nvmlClocksEventReason* bits (nvml.h), by the reason label's value (catalog.GPU_CLOCK_THROTTLED lists them).
_THROTTLE_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clocks": 0x100,
}
_THROTTLE_REASONS = tuple((reason, _THROTTLE_BITS[reason]) for reason in catalog.GPU_CLOCK_THROTTLED.values("reason"))


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    if view is None or view.gpus is None:
        return
    facts = view.gpus
    nvml_up = catalog.NVML_UP.family()
    nvml_up.add((), 1 if facts.nvml_up else 0)
    yield nvml_up
    info = catalog.GPU_INFO.family()
    up = catalog.GPU_UP.family()
    utilization = catalog.GPU_UTILIZATION.family()
    memory_utilization = catalog.GPU_MEMORY_UTILIZATION.family()
    memory_used = catalog.GPU_MEMORY_USED.family()
    memory_total = catalog.GPU_MEMORY_TOTAL.family()
    power = catalog.GPU_POWER.family()
    temperature = catalog.GPU_TEMPERATURE.family()
    throttled = catalog.GPU_CLOCK_THROTTLED.family()
    xid = catalog.GPU_XID_ERRORS.family()
    processes = catalog.GPU_PROCESSES.family()
    pod_memory = catalog.GPU_POD_MEMORY.family()
    job_memory = catalog.GPU_JOB_MEMORY.family()
    pods, jobs = view.pods, view.jobs
    for g in facts.gpus:
        labels = (str(g.index), g.uuid or "")
        info.add((*labels, g.name or ""), 1)
        up.add(labels, 1 if g.up else 0)
        if not g.up:
            continue
        utilization.add(labels, g.utilization_ratio)
        memory_utilization.add(labels, g.memory_utilization_ratio)
        memory_used.add(labels, g.memory_used_bytes)
        memory_total.add(labels, g.memory_total_bytes)
        power.add(labels, g.power_watts)
        temperature.add(labels, g.temperature_celsius)
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
    gauges = (utilization, memory_utilization, memory_used, memory_total, power, temperature)
    yield from (info, up, *gauges, throttled, xid, processes, pod_memory)
    if job_memory.lines:
        yield job_memory
    if view.stalls is not None:
        stalls = catalog.GPU_STALL_SECONDS.family()
        uuids = {str(g.index): g.uuid or "" for g in facts.gpus}
        for (gpu, mountpoint, cause), seconds in sorted(view.stalls.totals.items()):
            stalls.add((gpu, uuids.get(gpu, ""), mountpoint, cause), seconds)
        yield stalls
