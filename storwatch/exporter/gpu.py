"""The GPU area: NVML's state, each GPU's utilisation, memory, power, temperature, throttling and Xid errors, and the
GPU memory each pod's processes hold (storwatch_nvml_up, storwatch_gpu_*)."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.stalls import CAUSES
from storwatch.analysis.view import View
from storwatch.exporter.area import ExportState
from storwatch.exporter.spec import GPU, Label, counter, gauge
from storwatch.exporter.text import Family

# -- the metrics this area writes (storwatch/exporter/catalog.py assembles them)

UUID = Label("uuid", "one per GPU on the node (its UUID; empty where NVML gives none)")

# -- gpu

NVML_UP = gauge("gpu", "storwatch_nvml_up", "1 when NVML is loaded and answering on this node.")
GPU_INFO = gauge(
    "gpu",
    "storwatch_gpu_info",
    "A GPU on this node (NVML index, UUID, model).",
    GPU,
    UUID,
    Label("name", "one per GPU: its model"),
)
GPU_UP = gauge("gpu", "storwatch_gpu_up", "1 when the GPU answers NVML; 0 when lost or stuck.", GPU, UUID)
GPU_UTILIZATION = gauge(
    "gpu",
    "storwatch_gpu_utilization_ratio",
    "Share of the last sample period in which a kernel ran on the GPU.",
    GPU,
    UUID,
)
GPU_MEMORY_UTILIZATION = gauge(
    "gpu",
    "storwatch_gpu_memory_utilization_ratio",
    "Share of the last sample period in which device memory was accessed.",
    GPU,
    UUID,
)
GPU_MEMORY_USED = gauge("gpu", "storwatch_gpu_memory_used_bytes", "Device memory allocated.", GPU, UUID)
GPU_MEMORY_TOTAL = gauge("gpu", "storwatch_gpu_memory_total_bytes", "Device memory in all.", GPU, UUID)
GPU_POWER = gauge("gpu", "storwatch_gpu_power_watts", "Board power draw.", GPU, UUID)
GPU_TEMPERATURE = gauge("gpu", "storwatch_gpu_temperature_celsius", "GPU core temperature.", GPU, UUID)
GPU_CLOCK_THROTTLED = gauge(
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
GPU_XID_ERRORS = counter(
    "gpu",
    "storwatch_gpu_xid_errors_total",
    "Xid critical errors since the agent started.",
    GPU,
    UUID,
    Label("xid", "one per Xid code the GPU reported since the agent started (NVIDIA documents about 150 codes)"),
)
GPU_PROCESSES = gauge("gpu", "storwatch_gpu_processes", "Compute processes on the GPU.", GPU, UUID)
GPU_POD_MEMORY = gauge(
    "gpu",
    "storwatch_gpu_pod_memory_used_bytes",
    "GPU memory held by a pod's processes (pod_uid empty: processes outside any pod).",
    GPU,
    UUID,
    Label("pod_uid", "one per pod with a process on the GPU, and empty for processes outside any pod"),
    Label("namespace", "the pod's namespace (empty when the Kubernetes source does not know the pod)"),
    Label("pod", "the pod's name (empty when the Kubernetes source does not know the pod)"),
)
GPU_JOB_MEMORY = gauge(
    "gpu",
    "storwatch_gpu_job_memory_used_bytes",
    "GPU memory held by a Slurm job's processes (written on nodes where GPU processes run in Slurm jobs).",
    GPU,
    UUID,
    Label("job", "one per Slurm job with a process on the GPU"),
)
GPU_STALL_SECONDS = counter(
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


# nvmlClocksEventReason* bits (nvml.h), by the reason label's value (GPU_CLOCK_THROTTLED lists them).
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
_THROTTLE_REASONS = tuple((reason, _THROTTLE_BITS[reason]) for reason in GPU_CLOCK_THROTTLED.values("reason"))


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    if view is None or view.gpus is None:
        return
    facts = view.gpus
    nvml_up = NVML_UP.family()
    nvml_up.add((), 1 if facts.nvml_up else 0)
    yield nvml_up
    info = GPU_INFO.family()
    up = GPU_UP.family()
    utilization = GPU_UTILIZATION.family()
    memory_utilization = GPU_MEMORY_UTILIZATION.family()
    memory_used = GPU_MEMORY_USED.family()
    memory_total = GPU_MEMORY_TOTAL.family()
    power = GPU_POWER.family()
    temperature = GPU_TEMPERATURE.family()
    throttled = GPU_CLOCK_THROTTLED.family()
    xid = GPU_XID_ERRORS.family()
    processes = GPU_PROCESSES.family()
    pod_memory = GPU_POD_MEMORY.family()
    job_memory = GPU_JOB_MEMORY.family()
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
        stalls = GPU_STALL_SECONDS.family()
        uuids = {str(g.index): g.uuid or "" for g in facts.gpus}
        for (gpu, mountpoint, cause), seconds in sorted(view.stalls.totals.items()):
            stalls.add((gpu, uuids.get(gpu, ""), mountpoint, cause), seconds)
        yield stalls
