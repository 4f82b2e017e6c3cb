"""The GPU source: per-GPU utilisation, memory, power, temperature, throttling, Xid errors, compute processes and MIG
devices from NVML. The only module that imports the NVML bindings (``pynvml``, from ``nvidia-ml-py``), lazily.

Every NVML call goes through one wrapper (:meth:`_Sampler.call`, after nvitop's ``nvmlQuery``): a function the driver
or the bindings do not have, or that answers NVML_ERROR_NOT_SUPPORTED, gives the sentinel :data:`NA` (the field
becomes None) and is logged once, not on every tick; an error that says a GPU is gone (lost, unknown, reset
required) marks only that GPU down; an error that says NVML itself is gone (uninitialised, driver not loaded,
driver/library mismatch) marks NVML down, releases it, and retries nvmlInit with exponential backoff.

NVML calls can hang (a GPU fallen off the bus, a wedged driver). So one tick's sampling runs on a worker thread and
:meth:`GPUSource.collect` waits for it at most ``call_timeout_seconds``; past that it returns facts that say the
sampling is stuck, with every GPU down and unknown, and starts no second sampling until the stuck one returns: at
most one NVML thread exists, whatever the driver does. A thread stuck inside the driver cannot be killed (Python
cannot interrupt a C call, and a thread blocked in an ioctl of the NVIDIA driver ignores signals); it is a daemon
thread, so it never keeps the agent from exiting, and nvmlShutdown is then skipped, because it would wait for the
stuck call or free NVML state under it.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from storwatch.sources import FactsKey, OnceLog

log = logging.getLogger(__name__)

INIT_BACKOFF_FIRST_SECONDS = 1.0
"""The wait before the first retry of a failed nvmlInit; it doubles with each failure."""
INIT_BACKOFF_MAX_SECONDS = 300.0
INIT_TIMEOUT_SECONDS = 30.0
"""How long nvmlInit may take before it counts as stuck: without persistence mode it wakes every GPU (seconds each)."""
MAX_EVENTS_PER_TICK = 256
"""Xid events drained per tick at most, so a GPU storming errors cannot keep one sampling going forever."""
MAX_MIG_DEVICES = 8
BUFFERED_READ_SECONDS = 5.0
"""How often the driver's sample buffers are read (nvmlDeviceGetSamples, nvmlDeviceGetProcessUtilization). Each read
costs 1.5-3 ms of CPU in the driver whatever it returns (H100, driver 580: scripts/gpu_node_check.py), against
microseconds for the polled readings, and the buffer holds about 14 s of samples (71 at 5 per second), so a read every
5 s loses none and costs a fifth."""
MIG_MODE_SECONDS = 60.0
"""How often MIG mode is read again (0.2-0.5 ms a call; it changes only with a GPU reset, which new handles catch)."""


class NAType(enum.Enum):
    NA = "N/A"

    def __repr__(self) -> str:
        return "NA"


NA: Final = NAType.NA
"""What the wrapper answers for a value NVML cannot give: a function this driver or these bindings do not have,
NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NO_PERMISSION, or another error that concerns only that one value."""

# NVML return codes (nvml.h, nvmlReturn_t); literal here so that classifying an error needs no bindings.
_NVML_ERROR_UNINITIALIZED = 1
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_NO_PERMISSION = 4
_NVML_ERROR_NOT_FOUND = 6
_NVML_ERROR_DRIVER_NOT_LOADED = 9
_NVML_ERROR_TIMEOUT = 10
_NVML_ERROR_IRQ_ISSUE = 11
_NVML_ERROR_LIBRARY_NOT_FOUND = 12
_NVML_ERROR_FUNCTION_NOT_FOUND = 13
_NVML_ERROR_GPU_IS_LOST = 15
_NVML_ERROR_RESET_REQUIRED = 16
_NVML_ERROR_OPERATING_SYSTEM = 17
_NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
_NVML_ERROR_GPU_NOT_FOUND = 28
_NVML_ERROR_UNKNOWN = 999

_UNSUPPORTED = frozenset({_NVML_ERROR_NOT_SUPPORTED, _NVML_ERROR_NO_PERMISSION})
_GPU_DOWN = frozenset(
    {
        _NVML_ERROR_GPU_IS_LOST,
        _NVML_ERROR_UNKNOWN,
        _NVML_ERROR_RESET_REQUIRED,
        _NVML_ERROR_IRQ_ISSUE,
        _NVML_ERROR_TIMEOUT,
        _NVML_ERROR_OPERATING_SYSTEM,
        _NVML_ERROR_GPU_NOT_FOUND,
    }
)
_NVML_DOWN = frozenset(
    {
        _NVML_ERROR_UNINITIALIZED,
        _NVML_ERROR_DRIVER_NOT_LOADED,
        _NVML_ERROR_LIBRARY_NOT_FOUND,
        _NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)
# pynvml raises NVMLError(0) when nvmlDeviceGetProcessUtilization's sizing call succeeds with nothing to size.
_NO_DATA = frozenset({0, _NVML_ERROR_NOT_FOUND})

_NVML_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
_NVML_GPU_UTILIZATION_SAMPLES = 1
_NVML_TEMPERATURE_GPU = 0
_NVML_DEVICE_MIG_ENABLE = 1
_NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
_NVML_MEMORY_V2 = 0x02000028  # nvmlMemory_v2: version 2, sizeof(nvmlMemory_v2_t) 40

_INIT_HINTS = {
    _NVML_ERROR_LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 not found (no NVIDIA driver on this node?)",
    _NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
    _NVML_ERROR_LIB_RM_VERSION_MISMATCH: "NVML and the kernel driver differ in version (upgraded, not reloaded?)",
    _NVML_ERROR_NO_PERMISSION: "no permission to open the GPU device files",
}


# -- facts


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
    """(wall-clock seconds, ratio) of each GPU utilisation sample the driver took since the previous read, oldest
    first (nvmlDeviceGetSamples); where that is not supported, the one polled utilization_ratio with this read's
    timestamp."""
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


# -- the NVML side: used only on the worker thread


GPUS: FactsKey[GPUFacts] = FactsKey("gpus")
"""The GPU source's facts in a Snapshot."""


class _NVMLFailure(Exception):
    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class _GPUDown(_NVMLFailure):
    """An error that concerns one GPU: it is down until it answers again. From a call that names no GPU
    (nvmlDeviceGetCount), NVML as a whole counts as down."""


class _NVMLDown(_NVMLFailure):
    """An error that concerns NVML as a whole: release it and initialise again later."""


@dataclass
class _Device:
    """What is kept of one GPU between ticks."""

    index: int
    handle: Any = None
    address: int | None = None
    uuid: str | None = None
    name: str | None = None
    last_sample_us: int = 0
    last_process_sample_us: int = 0
    xid_counts: dict[int, int] = field(default_factory=dict)
    next_buffered_read: float = 0.0
    """When (time.monotonic) the sample buffers are next read; 0: at the next tick."""
    samples_supported: bool = True
    """nvmlDeviceGetSamples answered the last time it was asked (else the polled utilisation stands in)."""
    process_sm: dict[int, float] = field(default_factory=dict)
    """Per-process SM utilisation from the last buffered read, kept for the ticks between reads."""
    next_mig_read: float = 0.0
    """When MIG mode is next read; 0: at the next tick (a new handle resets it)."""
    mig_enabled: bool = False


def next_backoff(seconds: float) -> float:
    """The wait before the next nvmlInit retry after one more failure (doubling, capped)."""
    return min(seconds * 2.0, INIT_BACKOFF_MAX_SECONDS)


def _address(handle: Any) -> int | None:
    value = ctypes.cast(handle, ctypes.c_void_p).value
    return int(value) if value is not None else None


def _code(err: BaseException) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


class _Sampler:
    """All NVML state, touched only from the worker thread; ``current`` and ``devices`` are read by collect()."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.nv: Any = None
        self.initialised = False
        self.init_error: str | None = "not initialised yet"
        self.backoff = INIT_BACKOFF_FIRST_SECONDS
        self.next_init = 0.0
        self.driver_version: str | None = None
        self.event_set: Any = None
        self.devices: list[_Device] = []
        self.buffered_read_seconds = BUFFERED_READ_SECONDS
        self.registered: set[int] = set()
        """Handles (by address) registered with the event set: registering one twice would count its Xids twice."""
        self.missing: set[str] = set()
        self.current: tuple[str, int | None, float] | None = None
        """The NVML call in flight: (function, GPU index or None, time.monotonic() when it started)."""
        self.once = OnceLog(log)
        self.last_loss: str | None = None
        self.closed = False

    # -- the one wrapper

    def call(
        self,
        fn: str,
        *args: Any,
        gpu: int | None = None,
        c_name: str | None = None,
        fallback: bool = False,
        no_data: Any = NA,
        no_data_codes: frozenset[int] = _NO_DATA,
        **kwargs: Any,
    ) -> Any:
        """``pynvml.<fn>(*args, **kwargs)``, or NA when the value is not available.

        ``c_name`` names the C function where it differs from the binding (for the log and the cache of missing
        functions); ``fallback`` says another function is tried after this one, so its absence is not worth a
        warning; ``no_data``, when given, is returned for the codes ``no_data_codes`` (by default
        NVML_ERROR_NOT_FOUND: nothing new since the last read). ``gpu`` names the GPU in the log. Raises _GPUDown
        for an error that says a GPU is gone and _NVMLDown for one that says NVML is.
        """
        name = c_name or fn
        if name in self.missing:
            return NA
        func = getattr(self.nv, fn, None)
        if func is None:
            # Bindings older than this code.
            self.missing.add(name)
            self._unsupported(name, gpu, "not in the installed nvidia-ml-py", fallback)
            return NA
        self.current = (name, gpu, time.monotonic())
        try:
            return func(*args, **kwargs)
        except self.nv.NVMLError as err:
            code = _code(err)
            if code == _NVML_ERROR_FUNCTION_NOT_FOUND:
                self.missing.add(name)
                self._unsupported(name, gpu, "not in this driver's libnvidia-ml", fallback)
                return NA
            if code in _UNSUPPORTED:
                self._unsupported(name, gpu, str(err), fallback)
                return NA
            if no_data is not NA and code in no_data_codes:
                return no_data
            if code in _NVML_DOWN:
                raise _NVMLDown(f"{name}: {err}", code) from err
            if code in _GPU_DOWN:
                raise _GPUDown(f"{name}: {err}", code) from err
            self.once.warning(f"{name} {code}", "NVML %s failed (%s); its value is left out", name, err)
            return NA
        except AttributeError as err:
            # Bindings newer than the library, on paths that do not turn a missing symbol into FunctionNotFound.
            self.missing.add(name)
            self._unsupported(name, gpu, f"missing ({err})", fallback)
            return NA
        except UnicodeDecodeError as err:
            # A garbled string from the driver: as nvitop does, an unknown error of that GPU.
            raise _GPUDown(f"{name}: undecodable answer", _NVML_ERROR_UNKNOWN) from err
        finally:
            self.current = None

    def _unsupported(self, name: str, gpu: int | None, why: str, fallback: bool) -> None:
        if fallback:
            log.debug("NVML %s unavailable (%s); trying an older function", name, why)
            return
        where = "" if gpu is None else f" on GPU {gpu}"
        self.once.warning(f"unsupported {name}", "NVML %s unavailable%s: %s; reported as unknown", name, where, why)

    # -- init and shutdown

    def init(self) -> bool:
        """nvmlInit, unless a retry is not due yet; on failure, schedule the next try (doubling backoff)."""
        if self.initialised:
            return True
        now = time.monotonic()
        if now < self.next_init:
            return False
        error = self._try_init()
        if error is None:
            # The backoff is reset only by a whole tick sampled: an NVML that initialises and then fails at once
            # must not be initialised again every second.
            self.init_error = None
            log.info("NVML initialised (driver %s)", self.driver_version or "unknown")
            return True
        if error != self.init_error:
            log.warning("NVML unavailable: %s; retrying with backoff up to %.0f s", error, INIT_BACKOFF_MAX_SECONDS)
        self.init_error = error
        self.next_init = time.monotonic() + self.backoff
        self.backoff = next_backoff(self.backoff)
        return False

    def _try_init(self) -> str | None:
        if self.nv is None:
            try:
                import pynvml
            except ImportError as err:
                return f"the NVML bindings are not installed (pip install nvidia-ml-py): {err}"
            self.nv = pynvml
        nv = self.nv
        self.current = ("nvmlInit", None, time.monotonic())
        try:
            nv.nvmlInit()
        except nv.NVMLError as err:
            code = _code(err)
            hint = _INIT_HINTS.get(code) if code is not None else None
            return f"nvmlInit: {err}" + (f" ({hint})" if hint else "")
        except (AttributeError, OSError) as err:
            return f"nvmlInit: {type(err).__name__}: {err}"
        finally:
            self.current = None
        self.initialised = True
        self.missing.clear()
        self.devices = []
        try:
            version = self.call("nvmlSystemGetDriverVersion")
            self.driver_version = None if version is NA else str(version)
            event_set = self.call("nvmlEventSetCreate")
            self.event_set = None if event_set is NA else event_set
        except _NVMLFailure as err:
            self.shutdown()
            return str(err)
        return None

    def shutdown(self) -> None:
        """Free the event set and nvmlShutdown, so the driver is no longer held (for a driver upgrade)."""
        if not self.initialised:
            return
        nv = self.nv
        if self.event_set is not None:
            try:
                nv.nvmlEventSetFree(self.event_set)
            except nv.NVMLError as err:
                log.debug("nvmlEventSetFree: %s", err)
            self.event_set = None
        self.registered.clear()
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as err:
            log.info("nvmlShutdown: %s", err)
        self.initialised = False
        self.devices = []

    def close(self) -> None:
        """Shut down for good: a sampling queued after this one finds the source closed and initialises nothing."""
        self.closed = True
        self.shutdown()

    def _lose_nvml(self, error: str) -> None:
        level = logging.WARNING if error != self.last_loss else logging.DEBUG
        log.log(level, "NVML stopped answering: %s; releasing it, next nvmlInit in %.0f s", error, self.backoff)
        self.last_loss = error
        self.shutdown()
        self.init_error = error
        self.next_init = time.monotonic() + self.backoff
        self.backoff = next_backoff(self.backoff)

    # -- one tick

    def sample(self) -> GPUFacts:
        if self.closed:
            return GPUFacts(self.clock(), False, None, "source closed", ())
        if not self.init():
            retry = max(0.0, self.next_init - time.monotonic())
            return GPUFacts(self.clock(), False, None, f"{self.init_error}; next try in {retry:.0f} s", ())
        try:
            count = self.call("nvmlDeviceGetCount", c_name="nvmlDeviceGetCount_v2")
            if count is NA:
                raise _NVMLDown("nvmlDeviceGetCount_v2 not available")
            if count != len(self.devices):
                kept = {d.index: d for d in self.devices}
                self.devices = [kept.get(i) or _Device(i) for i in range(int(count))]
            for d in self.devices:
                # Handles first, so a new GPU's Xid events are registered before the events are taken.
                with contextlib.suppress(_GPUDown):
                    self._ensure_handle(d)
            self._drain_xid_events()
            gpus = tuple(self._sample_device(d) for d in self.devices)
        except _NVMLFailure as err:
            self._lose_nvml(str(err))
            return GPUFacts(self.clock(), False, self.driver_version, str(err), ())
        self.backoff = INIT_BACKOFF_FIRST_SECONDS
        return GPUFacts(self.clock(), True, self.driver_version, None, gpus)

    def _ensure_handle(self, d: _Device) -> None:
        if d.handle is not None:
            return
        handle = self.call("nvmlDeviceGetHandleByIndex", d.index, gpu=d.index, c_name="nvmlDeviceGetHandleByIndex_v2")
        if handle is NA:
            raise _GPUDown("nvmlDeviceGetHandleByIndex_v2 not available")
        d.handle, d.address = handle, _address(handle)
        d.next_mig_read = 0.0
        if d.address not in self.registered:
            self._register_xid_events(d)
            if d.address is not None:
                self.registered.add(d.address)

    def _sample_device(self, d: _Device) -> GPUState:
        i = d.index
        try:
            self._ensure_handle(d)
            h = d.handle
            if d.uuid is None:
                d.uuid = _text(self.call("nvmlDeviceGetUUID", h, gpu=i))
            if d.name is None:
                d.name = _text(self.call("nvmlDeviceGetName", h, gpu=i))
            util = self.call("nvmlDeviceGetUtilizationRates", h, gpu=i)
            util_ratio = None if util is NA else util.gpu / 100.0
            mem_util_ratio = None if util is NA else util.memory / 100.0
            now = time.monotonic()
            buffered = now >= d.next_buffered_read
            if buffered:
                d.next_buffered_read = now + self.buffered_read_seconds
                got_samples = self._utilization_samples(d)
                d.samples_supported = got_samples is not NA
            else:
                # Between buffered reads: nothing new yet (the driver keeps the samples for the next read).
                got_samples = () if d.samples_supported else NA
            samples: tuple[tuple[float, float], ...]
            if got_samples is NA:
                samples = () if util_ratio is None else ((self.clock(), util_ratio),)
            else:
                samples = got_samples
                if util_ratio is None and samples:
                    util_ratio = samples[-1][1]
            memory = self.call(
                "nvmlDeviceGetMemoryInfo",
                h,
                gpu=i,
                version=_NVML_MEMORY_V2,
                c_name="nvmlDeviceGetMemoryInfo_v2",
                fallback=True,
            )
            if memory is NA:
                memory = self.call("nvmlDeviceGetMemoryInfo", h, gpu=i)
            power_mw = self.call("nvmlDeviceGetPowerUsage", h, gpu=i)
            temperature = self.call("nvmlDeviceGetTemperatureV", h, _NVML_TEMPERATURE_GPU, gpu=i, fallback=True)
            if temperature is NA:
                temperature = self.call("nvmlDeviceGetTemperature", h, _NVML_TEMPERATURE_GPU, gpu=i)
            throttle = self.call("nvmlDeviceGetCurrentClocksEventReasons", h, gpu=i, fallback=True)
            if throttle is NA:
                throttle = self.call("nvmlDeviceGetCurrentClocksThrottleReasons", h, gpu=i)
            processes = self._processes(d, buffered)
            mig = self._mig_devices(d, now)
        except _GPUDown as err:
            # Ask for the handle again next tick: a GPU that was reset comes back with a new one.
            d.handle = None
            return GPUState(i, d.uuid, d.name, False, str(err), xid_counts=dict(d.xid_counts))
        return GPUState(
            index=i,
            uuid=d.uuid,
            name=d.name,
            up=True,
            utilization_ratio=util_ratio,
            memory_utilization_ratio=mem_util_ratio,
            utilization_samples=samples,
            memory_used_bytes=None if memory is NA else int(memory.used),
            memory_total_bytes=None if memory is NA else int(memory.total),
            power_watts=None if power_mw is NA else power_mw / 1000.0,
            temperature_celsius=None if temperature is NA else float(temperature),
            throttle_reasons=None if throttle is NA else int(throttle),
            xid_counts=dict(d.xid_counts),
            processes=processes,
            mig_devices=mig,
        )

    def _utilization_samples(self, d: _Device) -> tuple[tuple[float, float], ...] | NAType:
        got = self.call(
            "nvmlDeviceGetSamples", d.handle, _NVML_GPU_UTILIZATION_SAMPLES, d.last_sample_us, gpu=d.index, no_data=()
        )
        if got is NA:
            return NAType.NA
        if got == ():
            return ()
        value_type, raw = got
        attr = _NVML_VALUE_FIELDS.get(int(value_type), "uiVal")
        out: list[tuple[int, float]] = []
        for s in raw:
            # The driver answers samples newer than the timestamp given; its buffer is a ring, so sort anyway.
            ts = int(s.timeStamp)
            if ts > d.last_sample_us:
                out.append((ts, float(getattr(s.sampleValue, attr)) / 100.0))
        out.sort()
        if out:
            d.last_sample_us = out[-1][0]
        return tuple((ts / 1e6, ratio) for ts, ratio in out)

    def _processes(self, d: _Device, buffered: bool) -> tuple[GPUProcess, ...]:
        """Compute processes with their memory (every tick) and SM utilisation: the newest sample of each process in
        the last buffered read, held until the next one (None when that read had none for it)."""
        h, i = d.handle, d.index
        procs = self.call("nvmlDeviceGetComputeRunningProcesses_v3", h, gpu=i, fallback=True)
        if procs is NA:
            procs = self.call("nvmlDeviceGetComputeRunningProcesses_v2", h, gpu=i)
        if procs is NA or not procs:
            d.process_sm = {}
            return ()
        if buffered:
            sm: dict[int, tuple[int, float]] = {}
            samples = self.call("nvmlDeviceGetProcessUtilization", h, d.last_process_sample_us, gpu=i, no_data=())
            if samples is not NA:
                for s in samples:
                    ts = int(s.timeStamp)
                    pid = int(s.pid)
                    if ts > sm.get(pid, (-1, 0.0))[0]:
                        sm[pid] = (ts, min(int(s.smUtil), 100) / 100.0)
                    d.last_process_sample_us = max(d.last_process_sample_us, ts)
            d.process_sm = {pid: ratio for pid, (_, ratio) in sm.items()}
        by_pid: dict[int, GPUProcess] = {}
        for p in procs:
            pid = int(p.pid)
            used = p.usedGpuMemory
            by_pid[pid] = GPUProcess(pid, None if used is None else int(used), d.process_sm.get(pid))
        return tuple(by_pid[pid] for pid in sorted(by_pid))

    def _mig_devices(self, d: _Device, now: float) -> tuple[MIGDevice, ...]:
        """MIG devices (their memory every tick, the mode every MIG_MODE_SECONDS); anything MIG does wrong (old
        drivers, odd states, a GPU going mid-way) leaves them empty."""
        try:
            if now >= d.next_mig_read:
                d.next_mig_read = now + MIG_MODE_SECONDS
                mode = self.call("nvmlDeviceGetMigMode", d.handle, gpu=d.index)
                d.mig_enabled = mode is not NA and int(mode[0]) == _NVML_DEVICE_MIG_ENABLE
            if not d.mig_enabled:
                return ()
            count = self.call("nvmlDeviceGetMaxMigDeviceCount", d.handle, gpu=d.index)
            if count is NA:
                return ()
            out = []
            for slot in range(min(int(count), MAX_MIG_DEVICES)):
                mig = self.call("nvmlDeviceGetMigDeviceHandleByIndex", d.handle, slot, gpu=d.index, no_data=None)
                if mig is NA or mig is None:
                    continue
                uuid = _text(self.call("nvmlDeviceGetUUID", mig, gpu=d.index))
                memory = self.call("nvmlDeviceGetMemoryInfo", mig, gpu=d.index)
                out.append(
                    MIGDevice(
                        slot,
                        uuid,
                        None if memory is NA else int(memory.used),
                        None if memory is NA else int(memory.total),
                    )
                )
            return tuple(out)
        except (_NVMLFailure, TypeError, ValueError, IndexError) as err:
            self.once.warning(f"mig {d.index}", "GPU %d: MIG devices not readable (%s); listing none", d.index, err)
            return ()

    # -- Xid events

    def _register_xid_events(self, d: _Device) -> None:
        if self.event_set is None:
            return
        self.call(
            "nvmlDeviceRegisterEvents", d.handle, _NVML_EVENT_TYPE_XID_CRITICAL_ERROR, self.event_set, gpu=d.index
        )

    def _drain_xid_events(self) -> None:
        """Take every Xid event waiting (timeout 0: never block) and count it on its GPU."""
        if self.event_set is None:
            return
        by_address = {d.address: d for d in self.devices if d.address is not None}
        try:
            for _ in range(MAX_EVENTS_PER_TICK):
                data = self.call(
                    "nvmlEventSetWait_v2",
                    self.event_set,
                    0,
                    no_data=None,
                    no_data_codes=frozenset({_NVML_ERROR_TIMEOUT}),
                )
                if data is NA or data is None:
                    return
                if int(data.eventType) != _NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                    continue
                address = _address(data.device)
                d = by_address.get(address) if address is not None else None
                if d is None:
                    self.once.warning("xid unknown device", "Xid %d event from an unknown device", int(data.eventData))
                    continue
                xid = int(data.eventData)
                d.xid_counts[xid] = d.xid_counts.get(xid, 0) + 1
                self.once.warning(
                    f"xid {d.index} {xid}", "GPU %d (%s): Xid %d (logged once per GPU and code)", d.index, d.uuid, xid
                )
        except _GPUDown as err:
            # A lost GPU in the set makes the wait answer GPU_IS_LOST without saying which GPU: the per-GPU calls
            # that follow decide which one is down.
            self.once.warning(f"xid wait {err.code}", "waiting for Xid events: %s", err)


def _text(value: Any) -> str | None:
    if value is NA or value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


# -- the worker thread


class _Worker:
    """One daemon thread that runs one job at a time; a job stuck in a C call strands it, and no other job starts
    until that one returns, so there is never more than this one thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._job: Callable[[], Any] | None = None
        self._busy = False
        self._outcome: tuple[Any, BaseException | None] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    def run(
        self, job: Callable[[], Any], timeout: float, wait_idle: bool = False
    ) -> tuple[Any, BaseException | None] | None:
        """Run ``job`` and wait at most ``timeout`` seconds: its (value, exception), or None when it has not
        returned, or when an earlier job has not (then ``job`` is not started; with ``wait_idle``, only after
        waiting for that one within the same ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while wait_idle and self._busy and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._busy or self._stopping:
                return None
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            self._job, self._busy, self._outcome = job, True, None
            self._cond.notify_all()
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self._outcome

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._busy

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._stopping:
                    self._cond.wait()
                if self._job is None:
                    return
                job, self._job = self._job, None
            try:
                outcome: tuple[Any, BaseException | None] = (job(), None)
            except Exception as err:
                outcome = (None, err)
            with self._cond:
                self._outcome, self._busy = outcome, False
                self._cond.notify_all()


# -- the source


class GPUSettings(Protocol):
    """What :meth:`GPUSource.configure` reads from a configuration section (a frozen dataclass will do)."""

    @property
    def interval_seconds(self) -> float: ...

    @property
    def call_timeout_seconds(self) -> float: ...

    @property
    def samples_interval_seconds(self) -> float: ...


class GPUSource:
    """The Source for NVML: ``collect()`` returns :class:`GPUFacts` within ``call_timeout_seconds`` and raises only
    for a bug of its own, never for a missing library, a missing driver, an unsupported function, a lost GPU or a
    hung call (all of which are in the facts)."""

    name = "gpu"

    def __init__(
        self,
        interval_seconds: float = 1.0,
        call_timeout_seconds: float = 2.0,
        clock: Callable[[], float] = time.time,
        samples_interval_seconds: float = BUFFERED_READ_SECONDS,
    ) -> None:
        self.interval_seconds = interval_seconds
        self.call_timeout_seconds = call_timeout_seconds
        self.clock = clock
        self._sampler = _Sampler(clock)
        self._sampler.buffered_read_seconds = samples_interval_seconds
        self._worker = _Worker("gpu-nvml")
        self._closed = False
        self._stuck_logged = False

    def configure(self, settings: GPUSettings) -> None:
        """Take a reloaded configuration (the agent calls this on SIGHUP); effective from the next collect()."""
        self.interval_seconds = settings.interval_seconds
        self.call_timeout_seconds = settings.call_timeout_seconds
        self._sampler.buffered_read_seconds = settings.samples_interval_seconds

    def collect(self) -> GPUFacts:
        """One tick's facts, within call_timeout_seconds whatever NVML does; never raises for NVML's sake."""
        if self._closed:
            return GPUFacts(self.clock(), False, None, "source closed", ())
        outcome = self._worker.run(self._sampler.sample, self.call_timeout_seconds)
        if outcome is None:
            return self._stuck_facts()
        value, err = outcome
        if err is not None:
            raise err
        if self._stuck_logged:
            log.info("NVML answers again")
            self._stuck_logged = False
        assert isinstance(value, GPUFacts)
        return value

    def _stuck_facts(self) -> GPUFacts:
        current = self._sampler.current
        if current is None:
            # Between two calls, or already returned: report it as stuck in NVML all the same.
            what, gpu, seconds = "NVML sampling", None, float(self.call_timeout_seconds)
        else:
            what, gpu, seconds = current[0], current[1], time.monotonic() - current[2]
        devices = list(self._sampler.devices)
        if what == "nvmlInit" and seconds < INIT_TIMEOUT_SECONDS:
            return GPUFacts(self.clock(), False, None, f"nvmlInit in progress for {seconds:.1f} s", ())
        on = f" on GPU {gpu}" if gpu is not None and gpu >= 0 else ""
        error = f"{what}{on} has not returned after {seconds:.1f} s; no new sampling until it does"
        if not self._stuck_logged:
            log.warning("NVML stuck: %s", error)
            self._stuck_logged = True
        gpus = tuple(
            GPUState(d.index, d.uuid, d.name, False, "unknown: NVML sampling stuck", xid_counts=dict(d.xid_counts))
            for d in devices
        )
        return GPUFacts(self.clock(), False, self._sampler.driver_version, error, gpus, True, seconds)

    def close(self) -> None:
        """nvmlShutdown, so the driver is released (a driver upgrade can unload the kernel module), unless a call is
        stuck: then the shutdown would wait on it or free NVML under it, and the driver stays held until exit."""
        if self._closed:
            return
        self._closed = True
        # A collect() on the agent's source thread may have a sampling in flight: let it end first.
        outcome = self._worker.run(self._sampler.close, self.call_timeout_seconds, wait_idle=True)
        if outcome is None:
            log.warning("NVML call stuck; not calling nvmlShutdown (the driver is released when the process exits)")
        elif outcome[1] is not None:
            log.warning("nvmlShutdown failed: %s", outcome[1])
        self._worker.stop()


__all__ = [
    "INIT_BACKOFF_FIRST_SECONDS",
    "INIT_BACKOFF_MAX_SECONDS",
    "NA",
    "GPUFacts",
    "GPUProcess",
    "GPUSettings",
    "GPUSource",
    "GPUState",
    "MIGDevice",
    "NAType",
    "next_backoff",
]
