"""Parse /proc/diskstats (Documentation/admin-guide/iostats.rst, Documentation/block/stat.rst) and turn two samples
of one device into per-interval rates, latencies and utilisation.

A line is ``MAJOR MINOR NAME`` and then 11, 15 or 17 counters, by kernel age:

- 14 fields: the 11 classic counters (kernels before 4.18);
- 18 fields: + discards completed, merged, sectors, time (4.18+);
- 20 fields: + flush requests completed, time spent flushing (5.5+).

Any other field count is an error, including the 7-field partition lines of kernels before 2.6.25.
"""

from __future__ import annotations

import operator
import re
from typing import NamedTuple, cast

from storwatch.procfs import LineError

SECTOR_BYTES = 512
"""/proc/diskstats counts in 512-byte units whatever the device's logical or physical sector size."""

_LAYOUTS = (14, 18, 20)


class DiskStats(NamedTuple):
    """One line of /proc/diskstats: a whole disk or a partition, counters since the device was created.

    A NamedTuple, not a frozen dataclass: the source builds one per device every second, and a frozen dataclass of
    20 fields costs about 4 us to build (each field set through object.__setattr__), a NamedTuple a fifth of that.
    The fields are in the kernel's order, so a line's numbers map onto them directly."""

    major: int
    """Major device number."""
    minor: int
    """Minor device number."""
    name: str
    """Device name as in /dev and /sys/block (``nvme0n1``, ``nvme0n1p1``, ``dm-0``, ``md127``)."""
    reads_completed: int
    """Field 1: the total number of reads completed successfully."""
    reads_merged: int
    """Field 2: reads which are adjacent to each other and were merged for efficiency (two 4K reads may become one 8K
    read before it is handed to the disk, and so be counted as only one I/O)."""
    sectors_read: int
    """Field 3: the total number of sectors read successfully. Always 512-byte sectors, not the device's own sector
    size (see ``read_bytes``)."""
    read_time_ms: int
    """Field 4: the total number of milliseconds spent by all reads, measured from blk_mq_alloc_request() to
    __blk_mq_end_request(). Printed as a 32-bit value, so it wraps after about 49.7 days of summed read time."""
    writes_completed: int
    """Field 5: the total number of writes completed successfully."""
    writes_merged: int
    """Field 6: writes which are adjacent to each other and were merged for efficiency."""
    sectors_written: int
    """Field 7: the total number of sectors written successfully. Always 512-byte sectors (see ``written_bytes``)."""
    write_time_ms: int
    """Field 8: the total number of milliseconds spent by all writes, measured from blk_mq_alloc_request() to
    __blk_mq_end_request(). 32-bit, like ``read_time_ms``."""
    in_flight: int
    """Field 9: the number of I/Os currently in progress; the only field that should go to zero. Incremented as
    requests are given to the request queue and decremented as they finish. A gauge, not a counter."""
    io_time_ms: int
    """Field 10: milliseconds spent doing I/Os: the time during which the device had at least one request in flight
    (``io_ticks``). Its rate over wall time is the device's utilisation (iostat's %util)."""
    weighted_io_time_ms: int
    """Field 11: weighted milliseconds spent doing I/Os: incremented at each I/O start, I/O completion, I/O merge or
    read of these stats by the number of I/Os in progress times the milliseconds since the last update. Its rate
    over wall time is the average queue depth (iostat's aqu-sz)."""
    discards_completed: int | None
    """Field 12 (4.18+): the total number of discards completed successfully. None on older kernels."""
    discards_merged: int | None
    """Field 13 (4.18+): discards which were merged with adjacent ones. None on older kernels."""
    sectors_discarded: int | None
    """Field 14 (4.18+): the total number of sectors discarded successfully, in 512-byte sectors. None on older
    kernels."""
    discard_time_ms: int | None
    """Field 15 (4.18+): the total number of milliseconds spent by all discards. None on older kernels."""
    flushes_completed: int | None
    """Field 16 (5.5+): the total number of flush requests completed successfully. The block layer combines flush
    requests and executes at most one at a time, so this counts flushes sent to the device, not fsync() calls.
    Not tracked for partitions (always 0 there). None on older kernels."""
    flush_time_ms: int | None
    """Field 17 (5.5+): the total number of milliseconds spent by all flush requests. None on older kernels."""

    @property
    def read_bytes(self) -> int:
        """Bytes read: ``sectors_read`` times 512, whatever the device's sector size."""
        return self.sectors_read * SECTOR_BYTES

    @property
    def written_bytes(self) -> int:
        """Bytes written: ``sectors_written`` times 512, whatever the device's sector size."""
        return self.sectors_written * SECTOR_BYTES

    @property
    def discarded_bytes(self) -> int | None:
        """Bytes discarded: ``sectors_discarded`` times 512; None when the kernel does not report discards."""
        return None if self.sectors_discarded is None else self.sectors_discarded * SECTOR_BYTES

    @property
    def device_number(self) -> str:
        return f"{self.major}:{self.minor}"


class DiskStatsError(LineError):
    """A line that is not a valid /proc/diskstats record; ``lineno`` is 1-based."""


# The counters a layout lacks, as None: 14 fields lack discards and flushes, 18 lack flushes.
_MISSING: dict[int, tuple[None, ...]] = {14: (None,) * 6, 18: (None,) * 2, 20: ()}


def parse_line(line: str | bytes, lineno: int = 1) -> DiskStats:
    """Parse one /proc/diskstats line; raise DiskStatsError if it is not a 14, 18 or 20-field record."""
    text = line.decode("utf-8", "backslashreplace") if isinstance(line, bytes) else line
    # The kernel pads MAJOR and MINOR to fixed widths ("%4d %7d"), so split on runs of whitespace; names never hold
    # spaces.
    fields = text.split()
    missing = _MISSING.get(len(fields))
    if missing is None:
        raise DiskStatsError(lineno, f"expected 14, 18 or 20 fields, got {len(fields)}", text)
    name = fields.pop(2)
    if "\x00" in name:  # the kernel prints names as C strings: a NUL is a torn or forged line
        raise DiskStatsError(lineno, "device name holds a NUL byte", text)
    # One check for all numbers (split() gives no empty fields). int() alone would take "-1", "+1", "1_000" and
    # non-ASCII digits; the kernel prints none of those.
    digits = "".join(fields)
    if not (digits.isascii() and digits.isdigit()):
        raise DiskStatsError(lineno, "device number or counter is not a non-negative decimal integer", text)
    major, minor, *stats = map(int, fields)
    return DiskStats(major, minor, name, *stats, *missing)


def parse_diskstats(data: bytes | str) -> tuple[list[DiskStats], list[DiskStatsError]]:
    """Parse a whole /proc/diskstats. Bad lines are returned as errors; good lines are never lost to them."""
    text = data.decode("utf-8", "backslashreplace") if isinstance(data, bytes) else data
    disks: list[DiskStats] = []
    errors: list[DiskStatsError] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            disks.append(parse_line(line, lineno))
        except DiskStatsError as err:
            errors.append(err)
    return disks, errors


_NUMBER = "[0-9]+"
_KERNEL_LINE = (
    # "%4d %7d %s " then the counters, one space apart: 11, 15 or 17 of them (see the module's docstring). A name is
    # printable ASCII here; any other (a NUL, a space or a non-ASCII byte) takes the long way, parse_diskstats.
    rf" *{_NUMBER} +{_NUMBER} [!-~]+(?: {_NUMBER}){{11}}(?:(?: {_NUMBER}){{4}}(?:(?: {_NUMBER}){{2}})?)?\n"
)
_KERNEL_FILE = re.compile(f"(?:{_KERNEL_LINE})+")
_KERNEL_NAME = re.compile(rf"^ *{_NUMBER} +{_NUMBER} ([!-~]+) ", re.MULTILINE)


def diskstats_lines(data: bytes) -> dict[str, str] | None:
    """Each device's line of a /proc/diskstats as the kernel writes it, by name, every one of which
    :func:`parse_line` parses without error (a later line of the same name wins, as it does in the source's table);
    None when the file is anything else (an empty one, a bad line, a last line without its newline, a line laid out
    in a way the kernel does not): parse_diskstats then reads it, errors and all.

    Checking the whole file against the kernel's layout and cutting it into lines takes a few calls, where parsing
    every line takes a few microseconds a line: a reader every second that needs the counters of only the devices
    under mounts parses those alone (``parse_line``), and the rest when a scrape asks."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return None
    if _KERNEL_FILE.fullmatch(text) is None:
        return None
    return dict(zip(_KERNEL_NAME.findall(text), text.splitlines(), strict=True))


class DiskStatsDelta(NamedTuple):
    """What one device did between two samples of /proc/diskstats (a NamedTuple for the reason DiskStats is one).

    Counts, bytes and times are for the interval; ``in_flight`` is the current value. Fields for discards and flushes
    are None when either sample's kernel layout lacks them.
    """

    name: str
    """Device name, as in ``DiskStats.name``."""
    seconds: float
    """Length of the interval, in seconds of wall time."""
    reads: int
    """Reads completed in the interval."""
    writes: int
    """Writes completed in the interval."""
    discards: int | None
    """Discards completed in the interval."""
    flushes: int | None
    """Flush requests completed in the interval."""
    reads_merged: int
    """Reads merged into adjacent ones in the interval."""
    writes_merged: int
    """Writes merged into adjacent ones in the interval."""
    read_bytes: int
    """Bytes read in the interval (512-byte sectors times 512)."""
    written_bytes: int
    """Bytes written in the interval (512-byte sectors times 512)."""
    discarded_bytes: int | None
    """Bytes discarded in the interval (512-byte sectors times 512)."""
    read_time_seconds: float
    """Time spent by all reads completed in the interval, summed over concurrent reads."""
    write_time_seconds: float
    """Time spent by all writes completed in the interval, summed over concurrent writes."""
    discard_time_seconds: float | None
    """Time spent by all discards completed in the interval."""
    flush_time_seconds: float | None
    """Time spent by all flush requests completed in the interval."""
    io_time_seconds: float
    """Time in the interval during which the device had at least one request in flight."""
    weighted_io_time_seconds: float
    """Request-seconds in flight during the interval (the weighted I/O time's increase)."""
    in_flight: int
    """I/Os in progress at the end of the interval (the current sample's value)."""
    utilisation: float
    """Fraction of the interval the device was busy (io_time / interval), clamped to 0..1. For devices that serve
    requests in parallel (NVMe, RAID, dm) 1.0 means "never idle", not "saturated"."""
    average_queue_depth: float
    """Average number of requests in flight over the interval (weighted io_time / interval)."""
    read_latency_seconds: float | None
    """Average time per read completed in the interval; None when no reads completed."""
    write_latency_seconds: float | None
    """Average time per write completed in the interval; None when no writes completed."""
    discard_latency_seconds: float | None
    """Average time per discard completed in the interval; None when no discards completed or not reported."""
    flush_latency_seconds: float | None
    """Average time per flush request completed in the interval; None when none completed or not reported."""
    reset_counters: tuple[str, ...]
    """Names of the ``DiskStats`` counters that went backwards and were treated as reset (see diskstats_delta)."""


_COUNTERS = (
    "reads_completed",
    "reads_merged",
    "sectors_read",
    "read_time_ms",
    "writes_completed",
    "writes_merged",
    "sectors_written",
    "write_time_ms",
    "io_time_ms",
    "weighted_io_time_ms",
    "discards_completed",
    "discards_merged",
    "sectors_discarded",
    "discard_time_ms",
    "flushes_completed",
    "flush_time_ms",
)


_counter_values = operator.itemgetter(*(DiskStats._fields.index(c) for c in _COUNTERS))


def _latency(time_ms: int | None, ops: int | None) -> float | None:
    if time_ms is None or not ops:
        return None
    return time_ms / ops / 1000.0


def _seconds(time_ms: int | None) -> float | None:
    return None if time_ms is None else time_ms / 1000.0


def diskstats_delta(prev: DiskStats, cur: DiskStats, seconds: float) -> DiskStatsDelta:
    """Rates, latencies and utilisation of one device between two samples taken ``seconds`` apart.

    A counter that went backwards is taken as reset to zero since ``prev`` and its delta is its current value. That
    happens when the device was removed and created again under the same name (a loop, dm, md, rbd or NVMe-oF
    device re-attached), and when a 32-bit counter wrapped: the time fields are printed as 32-bit milliseconds on
    every kernel, and older 32-bit kernels kept the counts in 32 bits too. For a wrap this undercounts that one
    interval rather than inventing a huge value; the fields so treated are named in ``reset_counters``.

    Raises ValueError if ``seconds`` is not positive or the two samples are of differently named devices.
    """
    if not seconds > 0:
        raise ValueError(f"interval must be positive, got {seconds!r} seconds")
    if prev.name != cur.name:
        raise ValueError(f"samples are of different devices: {prev.name!r} and {cur.name!r}")
    before, after = _counter_values(prev), _counter_values(cur)
    delta: list[int | None]
    reset: tuple[str, ...] = ()
    if None in before or None in after or not all(map(operator.le, before, after)):
        # An older layout (no discard or flush fields) or a counter that went backwards: field by field.
        pairs = list(zip(_COUNTERS, before, after, strict=True))
        delta = [None if b is None or a is None else a - b if a >= b else a for _, b, a in pairs]
        reset = tuple(c for c, b, a in pairs if b is not None and a is not None and a < b)
    else:
        delta = list(map(operator.sub, after, before))
    # The first ten are in every layout (parse_line fills them), the discard and flush ones only in newer ones.
    (reads, reads_merged, sectors_read, read_ms, writes, writes_merged, sectors_written, write_ms, io_ms,
     weighted_ms) = cast("list[int]", delta[:10])  # fmt: skip
    discards, _, sectors_discarded, discard_ms, flushes, flush_ms = delta[10:]
    interval_ms = seconds * 1000.0
    return DiskStatsDelta(
        name=cur.name,
        seconds=seconds,
        reads=reads,
        writes=writes,
        discards=discards,
        flushes=flushes,
        reads_merged=reads_merged,
        writes_merged=writes_merged,
        read_bytes=sectors_read * SECTOR_BYTES,
        written_bytes=sectors_written * SECTOR_BYTES,
        discarded_bytes=None if sectors_discarded is None else sectors_discarded * SECTOR_BYTES,
        read_time_seconds=read_ms / 1000.0,
        write_time_seconds=write_ms / 1000.0,
        discard_time_seconds=_seconds(discard_ms),
        flush_time_seconds=_seconds(flush_ms),
        io_time_seconds=io_ms / 1000.0,
        weighted_io_time_seconds=weighted_ms / 1000.0,
        in_flight=cur.in_flight,
        # io_ticks is sampled at jiffy granularity and updated lazily, so one interval can show a little more busy
        # time than wall time (and the next a little less).
        utilisation=min(1.0, max(0.0, io_ms / interval_ms)),
        average_queue_depth=weighted_ms / interval_ms,
        read_latency_seconds=_latency(read_ms, reads),
        write_latency_seconds=_latency(write_ms, writes),
        discard_latency_seconds=_latency(discard_ms, discards),
        flush_latency_seconds=_latency(flush_ms, flushes),
        reset_counters=reset,
    )
