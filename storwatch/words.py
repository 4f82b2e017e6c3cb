"""Figures in words, for the sentences a person reads (findings, policy messages, the status page): a length of time
("12 min", "3 h"), a size ("1.5 GiB"), a share ("25%"). One formatter each, so a figure reads the same in a finding,
a log line and an Event. An unknown is said to be unknown, and an unbounded figure (a recovery point with no durable
checkpoint) is said to be so: a sentence never holds ``None``, ``null``, ``inf`` or ``nan``.
"""

from __future__ import annotations

import math

UNKNOWN = "unknown"
CAUSE_WORDS = {
    "checkpoint_write": "waiting on its checkpoint write",
    "data_read": "waiting on dataset reads",
    "io_contention": "waiting on a contended mount",
}
"""A stall's cause (analysis/stalls.py) as a sentence says it."""
UNBOUNDED = "unbounded"


def span(seconds: float | None) -> str:
    """A length of time in words: seconds below 90 s, minutes below 90 min, hours below two days, else days."""
    if seconds is None or math.isnan(seconds):
        return UNKNOWN
    if math.isinf(seconds):
        return UNBOUNDED if seconds > 0 else f"-{UNBOUNDED}"
    if seconds < 0:
        return "-" + span(-seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def size(n: float | None) -> str:
    """A number of bytes in binary units: "512 B", "1.5 GiB"."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return UNKNOWN
    if isinstance(n, float) and math.isinf(n):
        return UNBOUNDED if n > 0 else f"-{UNBOUNDED}"
    if n < 0:
        return "-" + size(-n)
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"


def share(ratio: float | None) -> str:
    """A share 0..1 as a percentage: "25%"."""
    if ratio is None or math.isnan(ratio):
        return UNKNOWN
    if math.isinf(ratio):
        return UNBOUNDED
    return f"{ratio * 100:.0f}%"


def number(value: float) -> str:
    """Any other figure: an integer as one, else its shortest form; unbounded and unknown in words."""
    if math.isnan(value):
        return UNKNOWN
    if math.isinf(value):
        return UNBOUNDED if value > 0 else f"-{UNBOUNDED}"
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:g}"
