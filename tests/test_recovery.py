"""Recovery points: the age of a run's newest complete checkpoint, worked out once in analysis/recovery.py."""

from __future__ import annotations

import pytest

from storwatch.analysis.recovery import checkpoint_age_seconds, recovery_point_seconds
from storwatch.sources.checkpoints import Checkpoint, RunState

NOW = 1_800_000_000.0


def checkpoint(verdict: str, age: float) -> Checkpoint:
    return Checkpoint(
        path=f"/ckpt/run/step-{age:g}",
        format="torch-zip",
        verdict=verdict,
        reason=verdict,
        size_bytes=1 << 20,
        mtime=NOW - age,
        deep_checked=False,
        first_seen=NOW - age,
        write_seconds=None,
        write_bytes_per_second=None,
    )


@pytest.mark.parametrize(
    ("series", "expected"),
    [
        pytest.param([], None, id="no-checkpoints"),
        pytest.param([("incomplete", 10.0)], None, id="only-incomplete"),
        pytest.param([("corrupt", 600.0), ("unknown", 5.0)], None, id="nothing-complete"),
        pytest.param([("complete", 900.0)], 900.0, id="one-complete"),
        pytest.param([("complete", 1800.0), ("complete", 900.0)], 900.0, id="newest-complete-counts"),
        # A newer checkpoint being written, or broken, does not move the point a restart would come back to.
        pytest.param([("complete", 1800.0), ("incomplete", 30.0)], 1800.0, id="write-in-progress"),
        pytest.param([("complete", 1800.0), ("corrupt", 300.0)], 1800.0, id="newest-corrupt"),
        pytest.param([("complete", -5.0)], None, id="dated-in-the-future-age-unknown"),
        pytest.param([("complete", -1.0)], 0.0, id="within-the-clock-skew-is-now"),
    ],
)
def test_recovery_point_is_the_age_of_the_newest_complete(
    series: list[tuple[str, float]], expected: float | None
) -> None:
    run = RunState("/ckpt/run", "/ckpt", tuple(checkpoint(v, age) for v, age in series))
    assert recovery_point_seconds(run, NOW) == expected


def test_checkpoint_age() -> None:
    assert checkpoint_age_seconds(checkpoint("incomplete", 42.5), NOW) == 42.5
    assert checkpoint_age_seconds(checkpoint("complete", 0.0), NOW + 3.0) == 3.0
