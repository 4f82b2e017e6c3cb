"""Recovery points: how much work a training run would redo if it restarted now from the checkpoints on disk.

Pure arithmetic on checkpoint records and a time (the View's), so every consumer (``/api/status``, ``scan``, the
status page, later the policy) gets the same figures. Whether that checkpoint would survive losing this node is its
mount's durability, which the caller joins (``RunView.mount``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from storwatch.checkpoints.record import RunId


class Written(Protocol):
    """A checkpoint as far as its age goes."""

    @property
    def mtime(self) -> float:
        """When anything in it was last written (UNIX seconds)."""
        ...


class Series(Protocol):
    """A run's series of checkpoints as far as its recovery point goes."""

    @property
    def newest_complete(self) -> Written | None: ...


CLOCK_SKEW_SECONDS = 2.0
"""How far in the future a file's time may be and still be read as now: filesystems stamp times from a coarse clock,
and the View's time was read before the scan finished."""


def checkpoint_age_seconds(checkpoint: Written, now: float) -> float | None:
    """Seconds since the checkpoint was last written, at ``now``; None when it is dated in the future (past
    CLOCK_SKEW_SECONDS): a clock stepped back, or a date a tenant set. Its age is then unknown, neither fresh nor
    stale: never a negative number."""
    age = now - checkpoint.mtime
    return None if age < -CLOCK_SKEW_SECONDS else max(0.0, age)


def future_dated_reason(checkpoint: Written, now: float) -> str | None:
    """Why the checkpoint's age is unknown (it is dated in the future), or None when it is known."""
    ahead = checkpoint.mtime - now
    if ahead <= CLOCK_SKEW_SECONDS:
        return None
    return (
        f"its newest complete checkpoint is dated {ahead:.0f} s in the future (a clock stepped, or a date set by hand)"
    )


def recovery_point_seconds(run: Series, now: float) -> float | None:
    """The age of the run's newest complete checkpoint at ``now``: the work a restart from disk would redo. None
    when the run has no complete checkpoint (a restart would start over), or when that checkpoint is dated in the
    future (its age is unknown)."""
    newest = run.newest_complete
    return None if newest is None else checkpoint_age_seconds(newest, now)


__all__ = ["Series", "Written", "checkpoint_age_seconds", "future_dated_reason", "recovery_point_seconds"]


@dataclass(frozen=True)
class RunRecovery:
    """One run's recovery figures at the View's time."""

    label: str
    recovery_point_seconds: float | None
    """Age of the newest complete checkpoint that survives losing this node; ``inf`` when the run has none; None when
    it is dated in the future (``unknown_reason`` says so)."""
    newest_age_seconds: float | None
    """Age of the newest complete checkpoint anywhere (node-local included); None without any, or when it is dated in
    the future."""
    write_cost_seconds: float | None
    """How long its newest timed complete checkpoint took to write; None when none was timed."""
    overhead_ratio: float | None
    """Write cost over the current interval; None without both."""
    recommended_interval_seconds: float | None
    """Daly's interval for the write cost and the MTBF; None without a write cost."""
    headroom_bytes: int | None = None
    """Space left on the run's mount once its next checkpoint is written: available bytes less HEADROOM_MARGIN times
    the newest complete checkpoint's size (negative: it will not fit). None without both."""
    gpus: int | None = 0
    """GPUs on this node held by the pod the run writes into (its checkpoints are on one of the pod's volumes), or by
    the processes the kernel shows writing it; None when nothing ties the run to a process: unknown, never 0."""
    workload: str | None = None
    """Who writes the run: its pod (``namespace/name`` or ``pod:<uid>``), Slurm job (``job:<id>``) or process
    (``pid:<pid>``); None when nothing says (analysis.pods.workload_name)."""
    tier_write_seconds: Mapping[str, float] = field(default_factory=dict)
    """How long its newest complete checkpoint would take to write on each durability tier of this node, at the
    median rate that checkpoints timed on that tier were written here."""
    unknown_reason: str | None = None
    """Why the recovery point is unknown (None while it is known)."""
    run: RunId | None = None
    """The run these figures are of: the key to join them with the View's runs."""

    @property
    def gpu_seconds_at_risk(self) -> float | None:
        """GPU time lost if this node died now: the recovery point times the run's GPUs here (None without any GPU,
        while its GPUs are unknown, or while the recovery point is unknown)."""
        point = self.recovery_point_seconds
        return point * self.gpus if self.gpus and point is not None else None
