"""The lines of a run's event log (storwatch.training.atomic_save), each checked against what the kernel says of the
file it names before any figure is taken from it.

Everything in an event log is a tenant's claim: the log sits in a directory the tenant writes. A line is taken only
when its numbers are finite and inside physical bounds, its span ends no later than now (give or take
``SKEW_SECONDS``), and the file it names was written within that span: the file's data last changed (its mtime)
between the span's start and end, it was created (its birth time, where the filesystem keeps one) when the span
began, it was renamed into place (its ctime) by the span's end, and it holds about the bytes the line says. A line
that fails is dropped and counted by its reason, never clamped into a plausible value. The PID a line names is a
claim of its own, corroborated by the checkpoint source against the processes' open files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from storwatch.labels import EVENT_REJECT_REASONS

SKEW_SECONDS = 10.0
"""How far the times of a line may stray from the kernel's times of its file (clock reads around the syscalls,
coarse timestamps of some filesystems)."""
MAX_SAVE_SECONDS = 86_400.0
"""The longest span taken where the file's birth time is unknown (a 280 GB checkpoint to object storage takes about
25 minutes; a day is beyond any real save)."""
BYTES_TOLERANCE = 0.1
"""A line's byte count may differ from the file's size by this share (and 4 KiB)."""
PID_MAX = 1 << 22
"""PID_MAX_LIMIT: no PID is this large."""
REJECT_REASONS = EVENT_REJECT_REASONS


@dataclass(frozen=True)
class FileTimes:
    """What the kernel says of the file a line names."""

    size_bytes: int
    mtime: float
    birth: float | None
    """Its creation time (statx btime), None where the filesystem keeps none."""
    ctime: float | None = None
    """When its inode last changed: the rename that finished the save, or later (a chmod); None when unknown."""


@dataclass(frozen=True)
class SaveRecord:
    """A line that passed every check."""

    start: float
    end: float
    bytes: int
    pid: int | None
    """The PID the line names (a claim: in the writer's PID namespace, and not yet corroborated)."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None  # an integer too large for a float
    return number if math.isfinite(number) else None


def judge(rec: dict[str, Any], file: FileTimes, now: float) -> SaveRecord | str:
    """The record a parsed line makes of ``file``, or the reason (one of REJECT_REASONS) it is dropped."""
    if not all(k in rec for k in ("start", "end", "bytes")):
        return "malformed"
    start, end, size = _number(rec["start"]), _number(rec["end"]), _number(rec["bytes"])
    if start is None or end is None or size is None:
        return "not_finite"
    if not 0 < start <= end:
        return "span"
    if end > now + SKEW_SECONDS:
        return "future"
    if file.birth is None and end - start > MAX_SAVE_SECONDS:
        return "span"
    if not start - SKEW_SECONDS <= file.mtime <= end + SKEW_SECONDS:
        return "file_life"
    if file.ctime is not None and end > file.ctime + SKEW_SECONDS:
        return "file_life"  # the save ends with its rename: a span that goes on past it is stretched
    if file.birth is not None and not start - SKEW_SECONDS <= file.birth <= end + SKEW_SECONDS:
        return "file_life"
    if file.birth is not None and file.birth - start > SKEW_SECONDS:
        return "file_life"
    if size < 0 or abs(size - file.size_bytes) > BYTES_TOLERANCE * file.size_bytes + 4096:
        return "bytes"
    pid = rec.get("pid")
    claimed = pid if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < PID_MAX else None
    return SaveRecord(start, end, int(size), claimed)


def parse_lines(
    lines: list[bytes],
    target: Callable[[str], str | None],
    file_times: Callable[[str], FileTimes | None],
    now: float,
) -> tuple[dict[str, SaveRecord], list[tuple[bytes, str]]]:
    """The last good record of each checkpoint the lines name, and the lines dropped with their reasons (a caller
    that reads the log again counts each line once).

    ``target`` maps a line's ``path`` to the checkpoint it may name (in the run's own directory only);
    ``file_times`` says what the kernel says of it, or None when it is no checkpoint of the run now."""
    records: dict[str, SaveRecord] = {}
    dropped: list[tuple[bytes, str]] = []
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            rec = None
        if not isinstance(rec, dict) or not isinstance(rec.get("path"), str):
            dropped.append((line, "malformed"))
            continue
        path = target(rec["path"])
        file = file_times(path) if path is not None else None
        if path is None or file is None:
            continue
        verdict = judge(rec, file, now)
        if isinstance(verdict, str):
            dropped.append((line, verdict))
        else:
            records[path] = verdict
    return records, dropped
