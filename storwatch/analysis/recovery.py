"""Recovery points: how much work a training run would redo if it restarted now from the checkpoints on disk.

Pure arithmetic on checkpoint records and a time (the View's), so every consumer (``/api/status``, ``scan``, the
status page, later the policy) gets the same figures. Whether that checkpoint would survive losing this node is its
mount's durability, which the caller joins (``RunView.mount``).
"""

from __future__ import annotations

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
