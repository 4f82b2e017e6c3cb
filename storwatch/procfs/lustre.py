"""Parser of a Lustre client's per-mount statistics (llite ``stats``).

One file per client mount (``llite/<fsname>-<instance>/stats``, in procfs on older clients, in debugfs on newer
ones; ``lctl get_param llite.*.stats`` prints the same text). Each line is a counter::

    snapshot_time             1783960164.279418700 secs.nsecs
    start_time                1783705564.331211471 secs.nsecs
    elapsed_time              254599.948207229 secs.nsecs
    read_bytes                10 samples [bytes] 4096 1048576 5242880 123456
    open                      6 samples [usecs] 5 300 469 92121
    ioctl                     1 samples [reqs]

``name N samples [unit]`` and, for counters that keep them, min, max, sum and (on most) the sum of squares. The
header lines give times as ``secs.nsecs`` (start_time and elapsed_time only on Lustre 2.14 and later). Older clients
time operations in ``[usec]`` or count them in ``[regs]``/``[reqs]``; the unit is kept as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from storwatch.procfs import LineError

MAX_LINES = 1024
"""Lines read from one file at most: a client has about 60 counters; past this the file is not llite stats."""

_TIMES = ("snapshot_time", "start_time", "elapsed_time")


class LliteLineError(LineError):
    """A line of an llite stats file that could not be parsed."""


@dataclass(frozen=True)
class LliteCounter:
    """One counter of a client mount since it was mounted (or its stats were cleared)."""

    name: str
    samples: int
    unit: str
    """As the client wrote it, without the brackets: ``bytes``, ``usecs``, ``reqs``..."""
    minimum: int | None = None
    maximum: int | None = None
    total: int | None = None
    """The sum of the samples: bytes for ``read_bytes``, microseconds for an operation timed in ``usecs``."""


@dataclass(frozen=True)
class LliteStats:
    """The counters of one client mount."""

    snapshot_time: float | None
    """When the client wrote the file (UNIX seconds), if it said."""
    elapsed_seconds: float | None
    """Seconds the counters have been counting (Lustre 2.14 and later)."""
    counters: Mapping[str, LliteCounter]

    def samples(self, name: str) -> int:
        """The counter's sample count, 0 for a counter the client has not written (it omits idle ones)."""
        counter = self.counters.get(name)
        return counter.samples if counter is not None else 0

    def total(self, name: str) -> int:
        """The counter's sum (0 when absent or when it keeps no sum)."""
        counter = self.counters.get(name)
        return (counter.total or 0) if counter is not None else 0


def _seconds(field: str) -> float:
    secs, _, nsecs = field.partition(".")
    if not secs.isdigit() or (nsecs and not nsecs.isdigit()):
        raise ValueError(f"not secs.nsecs: {field!r}")
    return int(secs) + (int(nsecs) / 10 ** len(nsecs) if nsecs else 0.0)


def _counter(fields: list[str]) -> LliteCounter:
    # name N samples [unit] [min max sum [sumsq]]
    if len(fields) < 4 or fields[2] != "samples":
        raise ValueError("expected 'NAME N samples [UNIT] ...'")
    unit = fields[3]
    if len(unit) < 3 or unit[0] != "[" or unit[-1] != "]":
        raise ValueError(f"unit not in brackets: {unit!r}")
    numbers = fields[4:]
    if len(numbers) not in (0, 3, 4):
        raise ValueError(f"{len(numbers)} figures after the unit (expected 0, 3 or 4)")
    values = []
    for text in [fields[1], *numbers]:
        # Counters are unsigned in the kernel, but a client that has wrapped one prints it as signed.
        if not text.lstrip("-").isdigit():
            raise ValueError(f"not a number: {text!r}")
        values.append(int(text))
    if values[0] < 0:
        raise ValueError(f"negative sample count: {values[0]}")
    rest: list[int | None] = [*values[1:4]] if numbers else [None, None, None]
    return LliteCounter(fields[0], values[0], unit[1:-1], rest[0], rest[1], rest[2])


def parse_llite_stats(data: bytes) -> tuple[LliteStats, list[LliteLineError]]:
    """Parse one llite ``stats`` file. A bad line is returned as an error and skipped; the rest still count."""
    errors: list[LliteLineError] = []
    counters: dict[str, LliteCounter] = {}
    times: dict[str, float] = {}
    for lineno, raw in enumerate(data.splitlines()[:MAX_LINES], 1):
        line = raw.decode("ascii", "replace")
        fields = line.split()
        if not fields:
            continue
        try:
            if fields[0] in _TIMES:
                if len(fields) != 3 or fields[2] != "secs.nsecs":
                    raise ValueError("expected 'NAME SECONDS secs.nsecs'")
                times[fields[0]] = _seconds(fields[1])
                continue
            counter = _counter(fields)
            if counter.name in counters:
                raise ValueError(f"{counter.name} given twice")
            counters[counter.name] = counter
        except ValueError as e:
            errors.append(LliteLineError(lineno, str(e), line))
    return LliteStats(times.get("snapshot_time"), times.get("elapsed_time"), counters), errors


def fsname_of_instance(instance: str) -> str | None:
    """The filesystem name in a client instance's directory name (``scratch-ffff9bc043537800`` -> ``scratch``):
    the part before the last dash, when what follows it is hexadecimal."""
    fsname, dash, tail = instance.rpartition("-")
    if not dash or not fsname or not tail:
        return None
    try:
        int(tail, 16)
    except ValueError:
        return None
    return fsname


def fsname_of_source(source: str) -> str | None:
    """The filesystem name in a Lustre mount's source (``10.0.0.1@tcp:/scratch``, ``mgs1@o2ib:mgs2@o2ib:/scratch/
    sub``, ``fs-0abc.fsx.us-east-1.amazonaws.com@tcp:/x7ab2bmv``): the first path component after ``:/``."""
    _, sep, path = source.rpartition(":/")
    if not sep:
        return None
    name = path.split("/", 1)[0]
    return name or None
