"""Recovery points: how much work a training run would redo if it restarted now from the checkpoints on disk.

Pure arithmetic on checkpoint records and a time (the View's), so every consumer (``/api/status``, ``scan``, the
status page, later the policy) gets the same figures. Whether that checkpoint would survive losing this node is its
mount's durability, which the caller joins (``RunView.mount``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


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


def checkpoint_age_seconds(checkpoint: Written, now: float) -> float:
    """Seconds since the checkpoint was last written, at ``now`` (negative for a clock behind the file's)."""
    return now - checkpoint.mtime


def recovery_point_seconds(run: Series, now: float) -> float | None:
    """The age of the run's newest complete checkpoint at ``now``: the work a restart from disk would redo. None
    when the run has no complete checkpoint (a restart would start over)."""
    newest = run.newest_complete
    return None if newest is None else checkpoint_age_seconds(newest, now)


__all__ = ["Series", "Written", "checkpoint_age_seconds", "recovery_point_seconds"]


@dataclass(frozen=True)
class RunRecovery:
    """One run's recovery figures at the View's time."""

    label: str
    recovery_point_seconds: float
    """Age of the newest complete checkpoint that survives losing this node; ``inf`` when the run has none."""
    newest_age_seconds: float | None
    """Age of the newest complete checkpoint anywhere (node-local included); None without any."""
    write_cost_seconds: float | None
    """How long its newest timed complete checkpoint took to write; None when none was timed."""
    overhead_ratio: float | None
    """Write cost over the current interval; None without both."""
    recommended_interval_seconds: float | None
    """Daly's interval for the write cost and the MTBF; None without a write cost."""
    headroom_bytes: int | None = None
    """Space left on the run's mount once its next checkpoint is written: available bytes less HEADROOM_MARGIN times
    the newest complete checkpoint's size (negative: it will not fit). None without both."""
    gpus: int = 0
    """GPUs on this node held by the pod the run writes into (its checkpoints are on one of the pod's volumes)."""
    workload: str | None = None
    """Who writes the run: its pod (``namespace/name`` or ``pod:<uid>``), Slurm job (``job:<id>``) or process
    (``pid:<pid>``); None when nothing says (analysis.pods.workload_name)."""
    tier_write_seconds: Mapping[str, float] = field(default_factory=dict)
    """How long its newest complete checkpoint would take to write on each durability tier of this node, at the
    median rate that checkpoints timed on that tier were written here."""

    @property
    def gpu_seconds_at_risk(self) -> float | None:
        """GPU time lost if this node died now: the recovery point times the run's GPUs here (None without any)."""
        return self.recovery_point_seconds * self.gpus if self.gpus else None
