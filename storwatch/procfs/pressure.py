"""Parser for a pressure stall information file (PSI, ``<procfs>/pressure/cpu``, ``io``, ``memory``): how much of the
time tasks were kept waiting for the resource.

Each line is ``some`` or ``full`` followed by ``avg10=``, ``avg60=``, ``avg300=`` (percentages of the last 10, 60
and 300 seconds) and ``total=`` (microseconds stalled since boot, a counter). ``some``: at least one runnable task
waited; ``full``: every non-idle task waited at once (for the CPU at the system level the kernel writes zeros, or,
before 5.13, no such line). Pure functions over bytes; a malformed line is a LineError and the other still counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from storwatch.procfs import LineError

_MAX_COUNTER = 1 << 64


@dataclass(frozen=True)
class PressureLine:
    avg10: float
    """Percent of the last 10 seconds that tasks were stalled (0-100)."""
    avg60: float
    avg300: float
    total_us: int
    """Microseconds stalled since boot: subtract two readings for the stall over an interval."""


@dataclass(frozen=True)
class Pressure:
    some: PressureLine | None
    """At least one task waited for the resource."""
    full: PressureLine | None
    """Every non-idle task waited at once; None where the file has no such line."""


def parse_pressure(data: bytes) -> tuple[Pressure | None, list[LineError]]:
    """The ``some`` and ``full`` lines of a PSI file; None when neither parsed."""
    found: dict[str, PressureLine] = {}
    errors: list[LineError] = []
    for n, raw in enumerate(data.splitlines(), start=1):
        line = raw.decode("ascii", "replace").strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        if kind not in ("some", "full"):
            errors.append(LineError(n, "expected 'some' or 'full'", line[:200]))
            continue
        values = dict(word.partition("=")[::2] for word in rest.split())
        try:
            avgs = [float(values[k]) for k in ("avg10", "avg60", "avg300")]
            total = int(values["total"])
        except (KeyError, ValueError):
            errors.append(LineError(n, "expected avg10=, avg60=, avg300= and total=", line[:200]))
            continue
        if not all(math.isfinite(a) and 0 <= a <= 100 for a in avgs) or not 0 <= total < _MAX_COUNTER:
            errors.append(LineError(n, "a value out of range", line[:200]))
            continue
        found[kind] = PressureLine(avgs[0], avgs[1], avgs[2], total)
    if not found:
        return None, errors
    return Pressure(found.get("some"), found.get("full")), errors
