"""The NVML library as the GPU source sees it: the only module that imports the NVML bindings (``pynvml``, from
``nvidia-ml-py``), lazily, and the one wrapper every NVML call goes through (after nvitop's ``libnvml.nvmlQuery``).

:meth:`NVML.call` answers the sentinel :data:`NA` for a value NVML cannot give: a function the driver or the bindings
do not have, or that answers NVML_ERROR_NOT_SUPPORTED, is logged once, not on every tick. An error that says a GPU is
gone (lost, unknown, reset required) raises :class:`GPUDown`; one that says NVML itself is gone (uninitialised,
driver not loaded, driver/library mismatch) raises :class:`NVMLDown`, and the caller releases NVML
(:meth:`NVML.lose`), which is initialised again with exponential backoff (:meth:`NVML.init`).

Not thread-safe: one thread makes every call (the GPU source's deadline worker). ``current`` alone is read from
another, to name a call that has not returned.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from storwatch.pace import Backoff
from storwatch.sources import OnceLog

log = logging.getLogger(__name__)

INIT_BACKOFF_FIRST_SECONDS = 1.0
"""The wait before the first retry of a failed nvmlInit; it doubles with each failure."""
INIT_BACKOFF_MAX_SECONDS = 300.0


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
ERROR_TIMEOUT = 10
"""NVML_ERROR_TIMEOUT: from nvmlEventSetWait, no event came (not a failure)."""
_NVML_ERROR_IRQ_ISSUE = 11
_NVML_ERROR_LIBRARY_NOT_FOUND = 12
_NVML_ERROR_FUNCTION_NOT_FOUND = 13
_NVML_ERROR_GPU_IS_LOST = 15
_NVML_ERROR_RESET_REQUIRED = 16
_NVML_ERROR_OPERATING_SYSTEM = 17
_NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
_NVML_ERROR_GPU_NOT_FOUND = 28
ERROR_UNKNOWN = 999

_UNSUPPORTED = frozenset({_NVML_ERROR_NOT_SUPPORTED, _NVML_ERROR_NO_PERMISSION})
_GPU_DOWN = frozenset(
    {
        _NVML_ERROR_GPU_IS_LOST,
        ERROR_UNKNOWN,
        _NVML_ERROR_RESET_REQUIRED,
        _NVML_ERROR_IRQ_ISSUE,
        ERROR_TIMEOUT,
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
NO_DATA = frozenset({0, _NVML_ERROR_NOT_FOUND})
"""Codes that mean "nothing new since the last read" where a call takes a ``no_data`` answer: NVML_ERROR_NOT_FOUND,
and 0, as pynvml raises NVMLError(0) when nvmlDeviceGetProcessUtilization's sizing call succeeds with nothing to
size."""

# Arguments and answers of the calls the sampler makes (nvml.h).
VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
"""nvmlValueType_t -> the member of nvmlValue_t that holds a sample."""
GPU_UTILIZATION_SAMPLES = 1
TEMPERATURE_GPU = 0
DEVICE_MIG_ENABLE = 1
EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
MEMORY_V2 = 0x02000028  # nvmlMemory_v2: version 2, sizeof(nvmlMemory_v2_t) 40

_INIT_HINTS = {
    _NVML_ERROR_LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 not found (no NVIDIA driver on this node?)",
    _NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
    _NVML_ERROR_LIB_RM_VERSION_MISMATCH: "NVML and the kernel driver differ in version (upgraded, not reloaded?)",
    _NVML_ERROR_NO_PERMISSION: "no permission to open the GPU device files",
}


class NVMLFailure(Exception):
    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class GPUDown(NVMLFailure):
    """An error that concerns one GPU: it is down until it answers again. From a call that names no GPU
    (nvmlDeviceGetCount), NVML as a whole counts as down."""


class NVMLDown(NVMLFailure):
    """An error that concerns NVML as a whole: release it and initialise again later."""


def handle_address(handle: Any) -> int | None:
    """Where a device handle points: how an event's device is matched with the GPU it came from."""
    value = ctypes.cast(handle, ctypes.c_void_p).value
    return int(value) if value is not None else None


def text(value: Any) -> str | None:
    """An NVML string (bytes from older bindings), or None for NA."""
    if value is NA or value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _code(err: BaseException) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


class NVML:
    """The bindings, imported at the first :meth:`init`; an NVML session from nvmlInit to nvmlShutdown, with the
    driver version and an event set for Xid events; the functions found missing in it."""

    def __init__(
        self,
        init_backoff_seconds: float = INIT_BACKOFF_FIRST_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``monotonic``: the clock the nvmlInit backoff is timed by (injected by tests)."""
        self.nv: Any = None
        """The ``pynvml`` module, once imported."""
        self.initialised = False
        self.init_error: str | None = "not initialised yet"
        self.backoff = Backoff(init_backoff_seconds, INIT_BACKOFF_MAX_SECONDS)
        self.monotonic = monotonic
        self.next_init = 0.0
        """When (``monotonic``) nvmlInit may be tried again."""
        self.init_attempts = 0
        """nvmlInit calls made (a retry not yet due makes none)."""
        self.driver_version: str | None = None
        self.event_set: Any = None
        """The session's nvmlEventSet_t, or None where events are not supported."""
        self.missing: set[str] = set()
        """Functions this driver or these bindings lack: never called again in this session."""
        self.current: tuple[str, int | None, float] | None = None
        """The NVML call in flight: (function, GPU index or None, time.monotonic() when it started)."""
        self.once = OnceLog(log)
        self.last_loss: str | None = None

    # -- the one wrapper

    def call(
        self,
        fn: str,
        *args: Any,
        gpu: int | None = None,
        c_name: str | None = None,
        fallback: bool = False,
        no_data: Any = NA,
        no_data_codes: frozenset[int] = NO_DATA,
        **kwargs: Any,
    ) -> Any:
        """``pynvml.<fn>(*args, **kwargs)``, or NA when the value is not available.

        ``c_name`` names the C function where it differs from the binding (for the log and the cache of missing
        functions); ``fallback`` says another function is tried after this one, so its absence is not worth a
        warning; ``no_data``, when given, is returned for the codes ``no_data_codes`` (by default
        NVML_ERROR_NOT_FOUND: nothing new since the last read). ``gpu`` names the GPU in the log. Raises GPUDown
        for an error that says a GPU is gone and NVMLDown for one that says NVML is.
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
                raise NVMLDown(f"{name}: {err}", code) from err
            if code in _GPU_DOWN:
                raise GPUDown(f"{name}: {err}", code) from err
            self.once.warning(f"{name} {code}", "NVML %s failed (%s); its value is left out", name, err)
            return NA
        except AttributeError as err:
            # Bindings newer than the library, on paths that do not turn a missing symbol into FunctionNotFound.
            self.missing.add(name)
            self._unsupported(name, gpu, f"missing ({err})", fallback)
            return NA
        except UnicodeDecodeError as err:
            # A garbled string from the driver: as nvitop does, an unknown error of that GPU.
            raise GPUDown(f"{name}: undecodable answer", ERROR_UNKNOWN) from err
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
        now = self.monotonic()
        if now < self.next_init:
            return False
        self.init_attempts += 1
        error = self._try_init()
        if error is None:
            # The backoff is reset only by a whole tick sampled (:meth:`answered`): an NVML that initialises and
            # then fails at once must not be initialised again every second.
            self.init_error = None
            log.info("NVML initialised (driver %s)", self.driver_version or "unknown")
            return True
        if error != self.init_error:
            log.warning("NVML unavailable: %s; retrying with backoff up to %.0f s", error, INIT_BACKOFF_MAX_SECONDS)
        self.init_error = error
        self.next_init = self.monotonic() + self.backoff.failed()
        return False

    def retry_in(self) -> float:
        """Seconds until nvmlInit may be tried again."""
        return max(0.0, self.next_init - self.monotonic())

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
        try:
            version = self.call("nvmlSystemGetDriverVersion")
            self.driver_version = None if version is NA else str(version)
            event_set = self.call("nvmlEventSetCreate")
            self.event_set = None if event_set is NA else event_set
        except NVMLFailure as err:
            self.shutdown()
            return str(err)
        return None

    def answered(self) -> None:
        """A whole tick was sampled: the next failure backs off from the first wait again."""
        self.backoff.reset()

    def lose(self, error: str) -> None:
        """NVML stopped answering: release it, and initialise again after the backoff."""
        level = logging.WARNING if error != self.last_loss else logging.DEBUG
        log.log(level, "NVML stopped answering: %s; releasing it, next nvmlInit in %.0f s", error, self.backoff.wait)
        self.last_loss = error
        self.shutdown()
        self.init_error = error
        self.next_init = self.monotonic() + self.backoff.failed()

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
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as err:
            log.info("nvmlShutdown: %s", err)
        self.initialised = False


__all__ = [
    "DEVICE_MIG_ENABLE",
    "ERROR_TIMEOUT",
    "ERROR_UNKNOWN",
    "EVENT_TYPE_XID_CRITICAL_ERROR",
    "GPU_UTILIZATION_SAMPLES",
    "INIT_BACKOFF_FIRST_SECONDS",
    "INIT_BACKOFF_MAX_SECONDS",
    "MEMORY_V2",
    "NA",
    "NO_DATA",
    "NVML",
    "TEMPERATURE_GPU",
    "VALUE_FIELDS",
    "GPUDown",
    "NAType",
    "NVMLDown",
    "NVMLFailure",
    "handle_address",
    "text",
]
