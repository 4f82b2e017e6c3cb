"""The GPU source's facts: what NVML said of each GPU, its compute processes and MIG devices, at one tick.

Plain frozen records, with no NVML in them: every consumer (exporter, report, analysis) reads these without the
bindings installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from storwatch.sources import FactsKey


@dataclass(frozen=True)
class GPUProcess:
    pid: int
    """In the host's PID namespace, as NVML reports it."""
    used_memory_bytes: int | None
    """Device memory the process holds; None where NVML cannot tell (NVML_VALUE_NOT_AVAILABLE)."""
    sm_utilization: float | None
    """Ratio 0..1 of the time the GPU's SMs ran this process's kernels, from its newest sample since the last read;
    None when no sample came (idle process, or per-process accounting not supported)."""


@dataclass(frozen=True)
class MIGDevice:
    index: int
    """The MIG device's slot under its parent GPU (nvmlDeviceGetMigDeviceHandleByIndex)."""
    uuid: str | None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None


@dataclass(frozen=True)
class GPUState:
    index: int
    """NVML's index (the order of nvmlDeviceGetHandleByIndex, which follows PCI bus order, not CUDA_VISIBLE_DEVICES)."""
    uuid: str | None
    name: str | None
    up: bool
    """False when NVML said the GPU is lost or in an unknown state, or when sampling is stuck (then every value is
    unknown, None)."""
    error: str | None = None
    """Why the GPU is down."""
    utilization_ratio: float | None = None
    """Ratio 0..1 of the last sample period (1/6 s to 1 s by product) in which a kernel ran (nvmlUtilization_t.gpu)."""
    memory_utilization_ratio: float | None = None
    """Ratio 0..1 of that period in which device memory was read or written (nvmlUtilization_t.memory)."""
    utilization_samples: tuple[tuple[float, float], ...] = ()
    """(wall-clock seconds, ratio) of each GPU utilisation sample the driver took in the last 30 s (sampler.py's
    RECENT_SAMPLES_SECONDS), oldest first (nvmlDeviceGetSamples); where that is not supported, the polled
    utilization_ratio of each read, with its timestamp. The same samples come in many facts: a reader takes those newer
    than the newest it has."""
    memory_used_bytes: int | None = None
    """Device memory allocated (nvmlMemory_v2_t.used, which excludes the driver's reservation; v1's used with it)."""
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    """Board power draw (nvmlDeviceGetPowerUsage, milliwatts / 1000)."""
    temperature_celsius: float | None = None
    """GPU core temperature."""
    throttle_reasons: int | None = None
    """Bit mask of nvmlClocksEventReason* (nvmlClocksThrottleReason* in older drivers): why clocks are held down."""
    xid_counts: dict[int, int] = field(default_factory=dict)
    """Xid critical errors seen since the agent started, by Xid code (e.g. 79 fallen off the bus, 48 double-bit ECC)."""
    processes: tuple[GPUProcess, ...] = ()
    """Compute processes on the GPU, by PID."""
    mig_devices: tuple[MIGDevice, ...] = ()
    """MIG devices when MIG mode is on; empty otherwise, or when they cannot be read."""


@dataclass(frozen=True)
class GPUFacts:
    timestamp: float
    nvml_up: bool
    """NVML initialised and answering. False on a node without the library or driver and while sampling is stuck
    (both failures of the source: see ``failure``)."""
    driver_version: str | None
    error: str | None
    """Why NVML is not up, or why the sampling is stuck."""
    gpus: tuple[GPUState, ...]
    stuck: bool = False
    """An NVML call has not returned within call_timeout_seconds and is still in flight."""
    stuck_seconds: float = 0.0
    """How long that call has been in flight."""

    @property
    def failure(self) -> str | None:
        """What makes this collection a failure of the source (``storwatch_collector_success`` 0): NVML not up, for
        whatever reason (no library or bindings, no driver, nvmlInit failing or still running, NVML lost, a stuck
        call). Each leaves the source with no GPU to report, and a success would say the GPUs were seen. A node that
        has no GPUs on purpose sets ``gpu: {enabled: false}``, which turns the collector off instead."""
        return None if self.nvml_up else (self.error or "NVML is not up")


__all__ = ["GPUFacts", "GPUProcess", "GPUState", "MIGDevice"]


GPUS: FactsKey[GPUFacts] = FactsKey("gpus")
"""The GPU source's facts in a Snapshot."""
