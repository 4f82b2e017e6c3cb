"""The GPU source: one tick of NVML sampling (:mod:`.sampler`) run on a deadline worker, so that ``collect()``
returns within ``call_timeout_seconds`` whatever the driver does.

NVML calls can hang (a GPU fallen off the bus, a wedged driver). Past the deadline, ``collect()`` returns facts that
say the sampling is stuck, with every GPU down and unknown, and starts no second sampling until the stuck one
returns: at most one NVML thread exists (:class:`storwatch.calls.deadline.DeadlineWorker`). nvmlShutdown is then
skipped at close, because it would wait for the stuck call or free NVML state under it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from storwatch.calls.deadline import DeadlineWorker
from storwatch.sources.gpu.facts import GPUFacts, GPUState
from storwatch.sources.gpu.nvml import INIT_BACKOFF_FIRST_SECONDS
from storwatch.sources.gpu.sampler import BUFFERED_READ_SECONDS, Sampler

log = logging.getLogger(__name__)

INIT_TIMEOUT_SECONDS = 30.0
"""How long nvmlInit may take before it counts as stuck: without persistence mode it wakes every GPU (seconds each)."""


RETRY_MARGIN_SECONDS = 0.05
"""While nvmlInit fails, the worker wakes this long after the retry is due, never before it."""


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
        init_backoff_seconds: float = INIT_BACKOFF_FIRST_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``init_backoff_seconds``: the wait before the first retry of a failed nvmlInit (it doubles up to
        INIT_BACKOFF_MAX_SECONDS), timed by ``monotonic``."""
        self._interval = interval_seconds
        self.call_timeout_seconds = call_timeout_seconds
        self.clock = clock
        self._sampler = Sampler(clock, init_backoff_seconds, samples_interval_seconds, monotonic)
        self._monotonic = monotonic
        self._started: float | None = None
        """When the last collect() began, by ``monotonic`` (the clock of nvmlInit's backoff)."""
        self._worker = DeadlineWorker("gpu-nvml")
        self._closed = False
        self._stuck_logged = False

    def configure(self, settings: GPUSettings) -> None:
        """Take a reloaded configuration (the agent calls this on SIGHUP); effective from the next collect()."""
        self._interval = settings.interval_seconds
        self.call_timeout_seconds = settings.call_timeout_seconds
        self._sampler.buffered_read_seconds = settings.samples_interval_seconds

    @property
    def interval_seconds(self) -> float:
        """The configured interval; while nvmlInit fails, the wait until its retry is due, if that is longer.

        Before the retry is due a collection could only repeat the last failure (no driver, no GPU to sample), so the
        worker sleeps until then: on a node without GPUs the source wakes at the backoff's pace (doubling to 300 s),
        not every second. A driver that loads is found at the same retry either way."""
        nvml = self._sampler.nvml
        if nvml.initialised or nvml.init_error is None or self._started is None:
            return self._interval
        # From the start of the last collection, as the worker counts it: the retry_in() of now would wake the worker
        # early by the collection's length, for one more run that finds the retry not due (a failure counted twice).
        # RETRY_MARGIN_SECONDS: the worker's own start is a hair before this one, so it would wake a hair early.
        return max(self._interval, nvml.next_init - self._started + RETRY_MARGIN_SECONDS)

    @interval_seconds.setter
    def interval_seconds(self, seconds: float) -> None:
        self._interval = seconds

    def collect(self) -> GPUFacts:
        """One tick's facts, within call_timeout_seconds whatever NVML does; never raises for NVML's sake."""
        if self._closed:
            return GPUFacts(self.clock(), False, None, "source closed", ())
        self._started = self._monotonic()
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
        current = self._sampler.nvml.current
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
        return GPUFacts(self.clock(), False, self._sampler.nvml.driver_version, error, gpus, True, seconds)

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


__all__ = ["INIT_TIMEOUT_SECONDS", "RETRY_MARGIN_SECONDS", "GPUSettings", "GPUSource"]
