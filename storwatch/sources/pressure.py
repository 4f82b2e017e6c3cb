"""The I/O pressure source: how long the node's tasks were kept waiting for storage, as the kernel counts it (pressure
stall information, ``<procfs>/pressure/io``, Linux 4.20 and later).

``some``: the time at least one task waited for I/O; ``full``: the time every non-idle task waited at once, so the
node did nothing but wait. Both are counters in microseconds since boot; the parser is procfs/pressure.py. A node
whose kernel gives no pressure information (built without CONFIG_PSI, or booted with ``psi=0``) has the source off,
with the reason, never a failure. Reading the file never touches a mount.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from storwatch.config import number
from storwatch.paths import HostPaths
from storwatch.procfs.pressure import parse_pressure
from storwatch.sources import Context, FactsKey, OnceLog, UnusableInput, read_bounded

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 4096
"""Bytes read of the file at most (the kernel writes two lines of about 70 bytes)."""


@dataclass(frozen=True)
class PressureConfig:
    enabled: bool = True
    interval_seconds: float = number(5.0, 0.1, 3600)


@dataclass(frozen=True)
class PressureFacts:
    timestamp: float
    waiting_seconds: float | None
    """``some``: seconds since boot during which at least one task waited for I/O; None while the source is off."""
    stalled_seconds: float | None
    """``full``: seconds since boot during which every non-idle task waited for I/O at once; None where the kernel
    writes no such line."""


PRESSURE: FactsKey[PressureFacts] = FactsKey("pressure")
"""The I/O pressure source's facts in a Snapshot."""

NO_PSI = (
    "this kernel gives no pressure stall information ({path}: {why}): it needs CONFIG_PSI, and psi=1 on the kernel "
    "command line where the kernel leaves it off by default"
)


class PressureSource:
    name = "pressure"

    def __init__(self, paths: HostPaths, config: PressureConfig, clock: Callable[[], float] = time.time) -> None:
        self.path = paths.proc("pressure", "io")
        self.clock = clock
        self.parse_errors = 0
        self.off_reason: str | None = None
        """Set while the kernel gives no pressure information: the collector is off, with the reason."""
        self._bad = OnceLog(log)
        self.configure(config)

    def configure(self, config: PressureConfig) -> None:
        self.interval_seconds = config.interval_seconds

    def collect(self) -> PressureFacts:
        now = self.clock()
        try:
            data = read_bounded(self.path, MAX_FILE_BYTES)
        except OSError as err:
            # Missing (no CONFIG_PSI) or refused (EOPNOTSUPP: built in, switched off at boot): nothing to report.
            if err.errno in (errno.ENOENT, errno.EOPNOTSUPP, errno.ENOTSUP):
                self.off_reason = NO_PSI.format(path=self.path, why=err.strerror or err)
                return PressureFacts(now, None, None)
            raise
        self.off_reason = None
        pressure, bad = parse_pressure(data)
        self.parse_errors += len(bad)
        for e in bad:
            self._bad.warning(str(e), "pressure: skipping malformed line of %s: %s", self.path, e)
        if pressure is None or pressure.some is None:
            raise UnusableInput(f"{self.path}: no 'some' line could be parsed" + (f" ({bad[0]})" if bad else ""))
        full = pressure.full.total_us / 1e6 if pressure.full is not None else None
        return PressureFacts(now, pressure.some.total_us / 1e6, full)

    def close(self) -> None:
        pass


def make(ctx: Context, section: PressureConfig) -> PressureSource:
    return PressureSource(ctx.paths, section, ctx.clock)
