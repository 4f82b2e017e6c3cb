"""The bounds every checkpoint check runs within: bytes inflated, decompression ratio, sizes, nesting and values of
the metadata it parses, objects a pickle may build, wall time, the torch-load child's address space, CPU and deadline,
and the memory that the metadata parses of one process may hold at once (``PARSE_BUDGET``).

A check that reaches a bound stops there and says which one in its verdict's reason (see ``LimitReached``); the
defaults are safe for an agent in a 256 MiB memory limit reading hostile files.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from storwatch.config import CheckpointsConfig

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class DeepLimits:
    """Bounds of one check (cheap or deep). Every field has a default fit for a node agent."""

    wall_seconds: float = 300.0
    """Wall time of one check. Past it the verdict is ``unknown`` (an honest large checkpoint is not corrupt)."""
    max_inflate_ratio: float = 100.0
    """Output bytes per input byte while inflating a deflated ZIP entry; torch.save never compresses, so a ratio far
    above what real data reaches means a decompression bomb."""
    max_inflated_bytes: int = 8 * GIB
    """Absolute cap on the bytes inflated from deflated ZIP entries by one check."""
    max_inflated_factor: float = 4.0
    """Cap on the bytes inflated by one check, relative to the file's size (the smaller cap applies)."""
    max_json_bytes: int = 16 * MIB
    """Largest JSON document parsed (a safetensors header, an index); the safetensors library's own cap is 100 MB."""
    max_json_depth: int = 64
    """Deepest nesting of a JSON document, checked before parsing (a safetensors header is three levels deep)."""
    max_json_values: int = 2_000_000
    """Values (keys included) a JSON document may hold, bounded before parsing; a safetensors header's tensors too
    (the largest sharded index seen, DeepSeek-V3's, names about 92,000 tensors)."""
    parse_budget_bytes: int = 64 * MIB
    """Memory that the metadata parses of one process (the checkpoint helper's threads, one per root, together) may
    hold at once. A parse reserves what it may build before it starts and waits for room; one that could never fit is
    ``unknown``."""
    max_pickle_bytes: int = 64 * MIB
    """Largest pickle read (a DCP ``.metadata``, a torch.save ``data.pkl``)."""
    max_pickle_objects: int = 4_000_000
    """Objects (values and container slots) a pickle may build in the restricted reader."""
    max_yaml_bytes: int = 16 * MIB
    """Largest torchsnapshot ``.snapshot_metadata`` parsed."""
    torch_load: bool = True
    """Whether the deep check of a torch.save file also loads it with torch (``weights_only=True``, in a child)."""
    torch_address_space_bytes: int = 3 * GIB
    """RLIMIT_AS of the torch-load child, on top of the file's size (torch maps the file; importing torch alone
    reserves about 0.5 GiB of address space)."""
    torch_cpu_seconds: int = 120
    """RLIMIT_CPU of the torch-load child."""
    torch_wall_seconds: float = 180.0
    """The torch-load child is killed past this."""
    allowed_globals: tuple[str, ...] = field(default=())
    """Extra ``module.name`` globals a torch.save pickle may reference (as torch's add_safe_globals); ``module.*``
    allows a whole module. They are never imported or called: each stands for an inert record."""

    @classmethod
    def from_config(cls, section: CheckpointsConfig) -> DeepLimits:
        """The bounds the ``checkpoints:`` section of the configuration sets."""
        return cls(
            wall_seconds=section.deep_wall_seconds,
            max_inflate_ratio=section.deep_max_inflate_ratio,
            max_inflated_bytes=section.deep_max_inflated_bytes,
            max_inflated_factor=section.deep_max_inflated_factor,
            max_json_bytes=section.deep_max_json_bytes,
            max_json_depth=section.deep_max_json_depth,
            max_pickle_bytes=section.deep_max_pickle_bytes,
            max_pickle_objects=section.deep_max_pickle_objects,
            max_yaml_bytes=section.deep_max_yaml_bytes,
            torch_load=section.deep_torch_load,
            torch_address_space_bytes=section.deep_torch_address_space_bytes,
            torch_cpu_seconds=section.deep_torch_cpu_seconds,
            torch_wall_seconds=section.deep_torch_wall_seconds,
            allowed_globals=section.allowed_globals,
        )

    def deadline(self) -> Deadline:
        return Deadline(self.wall_seconds)


BUDGET_WAIT_SECONDS = 10.0
"""Longest a parse waits for room in the parse budget; past it the check is ``unknown`` and is made again at the next
scan (limit ``parse_budget_busy``), so a unit's walk is never held past the agent's deadline by other roots' parses."""
TRANSIENT_LIMITS = frozenset({"parse_budget_busy"})
"""Limits that say nothing about the file, only about this moment: a verdict they stopped is not kept."""


class ParseBudget:
    """Memory that the metadata parses of this process hold at once. Each parse says up front what it may build
    (an upper bound worked out from the bytes, before anything is built) and holds that much while it runs; the
    checkpoint helper's threads, one per root, share one budget, so no set of files in any number of roots takes the
    helper past it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.in_use = 0
        """Bytes held by the parses running now."""
        self.peak = 0
        """The most bytes held at once since the process started."""

    @contextlib.contextmanager
    def hold(self, nbytes: int, what: str, limits: DeepLimits, deadline: Deadline) -> Iterator[None]:
        capacity = limits.parse_budget_bytes
        if nbytes > capacity:
            raise LimitReached(
                "parse_budget_bytes",
                f"{what} could take up to {nbytes / MIB:,.1f} MiB to parse, more than the "
                f"{capacity / MIB:,.0f} MiB that metadata parses may hold at once: it was not parsed, which says "
                "nothing against the checkpoint",
            )
        give_up = min(deadline.end, time.monotonic() + BUDGET_WAIT_SECONDS)
        with self._cond:
            while self.in_use + nbytes > capacity:
                left = give_up - time.monotonic()
                if left <= 0:
                    raise LimitReached(
                        "parse_budget_busy",
                        f"{what} waited {BUDGET_WAIT_SECONDS:g} s for {nbytes / MIB:,.1f} MiB of the parse budget "
                        "while other checkpoints' metadata was being parsed: it is checked again at the next scan",
                    )
                self._cond.wait(left)
            self.in_use += nbytes
            self.peak = max(self.peak, self.in_use)
        try:
            yield
        finally:
            with self._cond:
                self.in_use -= nbytes
                self._cond.notify_all()


PARSE_BUDGET = ParseBudget()
"""This process's budget (the checkpoint helper's, or a ``storwatch verify``'s)."""


class LimitReached(Exception):
    """A bound stopped a check. ``limit`` names the config field; ``verdict`` is what the check then reports."""

    def __init__(self, limit: str, message: str, verdict: str = "unknown") -> None:
        super().__init__(message)
        self.limit = limit
        self.verdict = verdict


class Deadline:
    """A wall-time budget, checked by the loops of a check."""

    __slots__ = ("end", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise LimitReached(
                "wall_seconds",
                f"stopped at the wall-time limit ({self.seconds:g} s, checkpoints.deep_wall_seconds): the check did "
                "not finish, which says nothing against the checkpoint",
            )
