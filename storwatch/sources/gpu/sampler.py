"""One tick of the GPU source: each GPU's utilisation, memory, power, temperature, throttling, Xid errors, compute
processes and MIG devices, read through the NVML wrapper (:mod:`.nvml`) into :class:`~.facts.GPUFacts`.

A GPU that NVML says is gone is marked down alone (its handle is asked for again next tick: a GPU that was reset
comes back with a new one); NVML gone as a whole is released and initialised again with backoff. The driver's sample
buffers are read every ``buffered_read_seconds``, the polled values every tick.

Each GPU's facts carry its utilisation samples of the last RECENT_SAMPLES_SECONDS, not only the new ones: the agent's
tick takes the newest facts of each source, and on a busy node two samplings can come between two ticks (or a sampling
can return past its deadline, its facts dropped), so samples handed over only once would be lost to whoever reads
later. The reader takes the ones newer than those it has (analysis/stall_feed.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from storwatch.sources import OnceLog
from storwatch.sources.gpu.facts import GPUFacts, GPUProcess, GPUState, MIGDevice
from storwatch.sources.gpu.nvml import (
    DEVICE_MIG_ENABLE,
    ERROR_TIMEOUT,
    EVENT_TYPE_XID_CRITICAL_ERROR,
    GPU_UTILIZATION_SAMPLES,
    INIT_BACKOFF_FIRST_SECONDS,
    INIT_BACKOFF_MAX_SECONDS,
    MEMORY_V2,
    NA,
    NVML,
    TEMPERATURE_GPU,
    VALUE_FIELDS,
    GPUDown,
    NAType,
    NVMLDown,
    NVMLFailure,
    handle_address,
    text,
)

log = logging.getLogger(__name__)

MAX_EVENTS_PER_TICK = 256
"""Xid events drained per tick at most, so a GPU storming errors cannot keep one sampling going forever."""
MAX_MIG_DEVICES = 8
BUFFERED_READ_SECONDS = 5.0
"""How often the driver's sample buffers are read (nvmlDeviceGetSamples, nvmlDeviceGetProcessUtilization). Each read
costs milliseconds of CPU in the driver whatever it returns (BENCHMARKS.md, from scripts/gpu_node_check.py), far more
than the polled readings, and the buffer holds about 14 s of samples (71 at 5 per second), so a read every 5 s loses
none and costs a fifth."""
RECENT_SAMPLES_SECONDS = 30.0
"""Each GPU's utilisation samples are in its facts this long after the driver took them: far longer than two ticks come
apart on a busy node (the View a tick makes can take seconds), twice as long as the driver keeps them (about 14 s);
GPU time is settled once 40 s old (analysis/stalls.py), so samples older still would come too late for it anyway."""
RECENT_SAMPLES_MAX = 360
"""At most this many samples kept per GPU (30 s at the driver's rate of up to 6 a second, twice over)."""
RETRYING = f"nvmlInit retried with backoff (doubling up to {INIT_BACKOFF_MAX_SECONDS:.0f} s)"
MIG_MODE_SECONDS = 60.0
"""How often MIG mode is read again (it changes only with a GPU reset, which new handles catch)."""


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
    recent: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=RECENT_SAMPLES_MAX))
    """The utilisation samples of the last RECENT_SAMPLES_SECONDS, (wall-clock seconds, ratio), oldest first."""

    def remember(self, samples: Iterable[tuple[float, float]]) -> None:
        recent = self.recent
        recent.extend(samples)
        while recent and recent[0][0] < recent[-1][0] - RECENT_SAMPLES_SECONDS:
            recent.popleft()


class Sampler:
    """What is kept of the GPUs between ticks, touched only from the thread that samples; ``devices`` is read by the
    source to name the GPUs of a sampling that is stuck."""

    def __init__(
        self,
        clock: Callable[[], float],
        init_backoff_seconds: float = INIT_BACKOFF_FIRST_SECONDS,
        buffered_read_seconds: float = BUFFERED_READ_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.nvml = NVML(init_backoff_seconds, monotonic)
        self.devices: list[_Device] = []
        self.buffered_read_seconds = buffered_read_seconds
        self.registered: set[int] = set()
        """Handles (by address) registered with the event set: registering one twice would count its Xids twice."""
        self.once = OnceLog(log)
        self.closed = False

    # -- one tick

    def sample(self) -> GPUFacts:
        nvml = self.nvml
        if self.closed:
            return GPUFacts(self.clock(), False, None, "source closed", ())
        fresh = not nvml.initialised
        if not nvml.init():
            # The same words on every tick until nvmlInit fails otherwise: the collector logs a failure that goes
            # on with backoff, and a countdown here would make each tick's failure look new.
            return GPUFacts(self.clock(), False, None, f"{nvml.init_error}; {RETRYING}", ())
        if fresh:
            # A new NVML session: handles and event registrations of the last one are void.
            self._forget_devices()
        try:
            count = nvml.call("nvmlDeviceGetCount", c_name="nvmlDeviceGetCount_v2")
            if count is NA:
                raise NVMLDown("nvmlDeviceGetCount_v2 not available")
            if count != len(self.devices):
                kept = {d.index: d for d in self.devices}
                self.devices = [kept.get(i) or _Device(i) for i in range(int(count))]
            for d in self.devices:
                # Handles first, so a new GPU's Xid events are registered before the events are taken.
                with contextlib.suppress(GPUDown):
                    self._ensure_handle(d)
            self._drain_xid_events()
            gpus = tuple(self._sample_device(d) for d in self.devices)
        except NVMLFailure as err:
            self._forget_devices()
            nvml.lose(str(err))
            return GPUFacts(self.clock(), False, nvml.driver_version, str(err), ())
        nvml.answered()
        return GPUFacts(self.clock(), True, nvml.driver_version, None, gpus)

    def close(self) -> None:
        """Shut down for good: a sampling queued after this one finds the sampler closed and initialises nothing."""
        self.closed = True
        self._forget_devices()
        self.nvml.shutdown()

    def _forget_devices(self) -> None:
        self.devices = []
        self.registered.clear()

    def _ensure_handle(self, d: _Device) -> None:
        if d.handle is not None:
            return
        handle = self.nvml.call(
            "nvmlDeviceGetHandleByIndex", d.index, gpu=d.index, c_name="nvmlDeviceGetHandleByIndex_v2"
        )
        if handle is NA:
            raise GPUDown("nvmlDeviceGetHandleByIndex_v2 not available")
        d.handle, d.address = handle, handle_address(handle)
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
                d.uuid = text(self.nvml.call("nvmlDeviceGetUUID", h, gpu=i))
            if d.name is None:
                d.name = text(self.nvml.call("nvmlDeviceGetName", h, gpu=i))
            util = self.nvml.call("nvmlDeviceGetUtilizationRates", h, gpu=i)
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
            if got_samples is NA:
                if util_ratio is not None:
                    d.remember(((self.clock(), util_ratio),))
            else:
                d.remember(got_samples)
                if util_ratio is None and got_samples:
                    util_ratio = got_samples[-1][1]
            memory = self.nvml.call(
                "nvmlDeviceGetMemoryInfo",
                h,
                gpu=i,
                version=MEMORY_V2,
                c_name="nvmlDeviceGetMemoryInfo_v2",
                fallback=True,
            )
            if memory is NA:
                memory = self.nvml.call("nvmlDeviceGetMemoryInfo", h, gpu=i)
            power_mw = self.nvml.call("nvmlDeviceGetPowerUsage", h, gpu=i)
            temperature = self.nvml.call("nvmlDeviceGetTemperatureV", h, TEMPERATURE_GPU, gpu=i, fallback=True)
            if temperature is NA:
                temperature = self.nvml.call("nvmlDeviceGetTemperature", h, TEMPERATURE_GPU, gpu=i)
            throttle = self.nvml.call("nvmlDeviceGetCurrentClocksEventReasons", h, gpu=i, fallback=True)
            if throttle is NA:
                throttle = self.nvml.call("nvmlDeviceGetCurrentClocksThrottleReasons", h, gpu=i)
            processes = self._processes(d, buffered)
            mig = self._mig_devices(d, now)
        except GPUDown as err:
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
            utilization_samples=tuple(d.recent),
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
        got = self.nvml.call(
            "nvmlDeviceGetSamples", d.handle, GPU_UTILIZATION_SAMPLES, d.last_sample_us, gpu=d.index, no_data=()
        )
        if got is NA:
            return NAType.NA
        if got == ():
            return ()
        value_type, raw = got
        attr = VALUE_FIELDS.get(int(value_type), "uiVal")
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
        procs = self.nvml.call("nvmlDeviceGetComputeRunningProcesses_v3", h, gpu=i, fallback=True)
        if procs is NA:
            procs = self.nvml.call("nvmlDeviceGetComputeRunningProcesses_v2", h, gpu=i)
        if procs is NA or not procs:
            d.process_sm = {}
            return ()
        if buffered:
            sm: dict[int, tuple[int, float]] = {}
            samples = self.nvml.call("nvmlDeviceGetProcessUtilization", h, d.last_process_sample_us, gpu=i, no_data=())
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
                mode = self.nvml.call("nvmlDeviceGetMigMode", d.handle, gpu=d.index)
                d.mig_enabled = mode is not NA and int(mode[0]) == DEVICE_MIG_ENABLE
            if not d.mig_enabled:
                return ()
            count = self.nvml.call("nvmlDeviceGetMaxMigDeviceCount", d.handle, gpu=d.index)
            if count is NA:
                return ()
            out = []
            for slot in range(min(int(count), MAX_MIG_DEVICES)):
                mig = self.nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", d.handle, slot, gpu=d.index, no_data=None)
                if mig is NA or mig is None:
                    continue
                uuid = text(self.nvml.call("nvmlDeviceGetUUID", mig, gpu=d.index))
                memory = self.nvml.call("nvmlDeviceGetMemoryInfo", mig, gpu=d.index)
                out.append(
                    MIGDevice(
                        slot,
                        uuid,
                        None if memory is NA else int(memory.used),
                        None if memory is NA else int(memory.total),
                    )
                )
            return tuple(out)
        except (NVMLFailure, TypeError, ValueError, IndexError) as err:
            self.once.warning(f"mig {d.index}", "GPU %d: MIG devices not readable (%s); listing none", d.index, err)
            return ()

    # -- Xid events

    def _register_xid_events(self, d: _Device) -> None:
        if self.nvml.event_set is None:
            return
        self.nvml.call(
            "nvmlDeviceRegisterEvents", d.handle, EVENT_TYPE_XID_CRITICAL_ERROR, self.nvml.event_set, gpu=d.index
        )

    def _drain_xid_events(self) -> None:
        """Take every Xid event waiting (timeout 0: never block) and count it on its GPU."""
        if self.nvml.event_set is None:
            return
        by_address = {d.address: d for d in self.devices if d.address is not None}
        try:
            for _ in range(MAX_EVENTS_PER_TICK):
                data = self.nvml.call(
                    "nvmlEventSetWait_v2",
                    self.nvml.event_set,
                    0,
                    no_data=None,
                    no_data_codes=frozenset({ERROR_TIMEOUT}),
                )
                if data is NA or data is None:
                    return
                if int(data.eventType) != EVENT_TYPE_XID_CRITICAL_ERROR:
                    continue
                address = handle_address(data.device)
                d = by_address.get(address) if address is not None else None
                if d is None:
                    self.once.warning("xid unknown device", "Xid %d event from an unknown device", int(data.eventData))
                    continue
                xid = int(data.eventData)
                d.xid_counts[xid] = d.xid_counts.get(xid, 0) + 1
                self.once.warning(
                    f"xid {d.index} {xid}", "GPU %d (%s): Xid %d (logged once per GPU and code)", d.index, d.uuid, xid
                )
        except GPUDown as err:
            # A lost GPU in the set makes the wait answer GPU_IS_LOST without saying which GPU: the per-GPU calls
            # that follow decide which one is down.
            self.once.warning(f"xid wait {err.code}", "waiting for Xid events: %s", err)


__all__ = ["BUFFERED_READ_SECONDS", "MAX_EVENTS_PER_TICK", "MAX_MIG_DEVICES", "MIG_MODE_SECONDS", "Sampler"]
