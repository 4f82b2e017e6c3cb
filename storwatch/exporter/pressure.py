"""The I/O pressure area: how long the node's tasks waited for storage (sources/pressure.py), as two counters.

It reads its source's facts from the View by the source's name, against a Protocol of the fields it reads: an area
never imports a source (the contract in pyproject.toml), and the registry's one line ties the two.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, cast

from storwatch.analysis.view import View
from storwatch.exporter.area import ExportState
from storwatch.exporter.spec import counter
from storwatch.exporter.text import Family

# -- the metrics this area writes (storwatch/exporter/catalog.py assembles them)

IO_PRESSURE_WAITING = counter(
    "pressure",
    "storwatch_io_pressure_waiting_seconds_total",
    "Time at least one task on the node waited for I/O, since boot (the kernel's pressure stall information, "
    "/proc/pressure/io 'some'): its rate is the share of time storage kept some work waiting.",
)
IO_PRESSURE_STALLED = counter(
    "pressure",
    "storwatch_io_pressure_stalled_seconds_total",
    "Time every non-idle task on the node waited for I/O at once, since boot (/proc/pressure/io 'full'): its rate is "
    "the share of time the node did nothing but wait for storage. Absent where the kernel writes no 'full' line.",
)


class _Pressure(Protocol):
    """What this area reads of the source's facts (sources/pressure.py PressureFacts)."""

    @property
    def waiting_seconds(self) -> float | None: ...

    @property
    def stalled_seconds(self) -> float | None: ...


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    facts = cast("_Pressure | None", view.facts_of("pressure")) if view is not None else None
    if facts is None or facts.waiting_seconds is None:
        return
    waiting = IO_PRESSURE_WAITING.family()
    waiting.add((), facts.waiting_seconds)
    yield waiting
    if facts.stalled_seconds is not None:
        stalled = IO_PRESSURE_STALLED.family()
        stalled.add((), facts.stalled_seconds)
        yield stalled
