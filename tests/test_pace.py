"""The agent's pace (storwatch/pace.py): full while GPUs work, the quiet pace on a node without a GPU process."""

from __future__ import annotations

from storwatch.pace import Pace


def test_quiet_only_after_quiet_after_seconds_without_work() -> None:
    now = [100.0]
    pace = Pace(15.0, 60.0, monotonic=lambda: now[0])
    assert not pace.quiet and pace.stretch(1.0) == 1.0  # the start counts as work
    now[0] = 159.9
    assert not pace.quiet
    now[0] = 160.0
    assert pace.quiet
    assert pace.stretch(1.0) == 15.0
    assert pace.stretch(30.0) == 30.0  # a loop slower than the quiet pace keeps its own


def test_work_ends_quiet_and_says_whether_it_was() -> None:
    now = [0.0]
    pace = Pace(15.0, 60.0, monotonic=lambda: now[0])
    now[0] = 30.0
    assert pace.work() is False  # not quiet yet: nobody needs waking
    now[0] = 89.0
    assert not pace.quiet  # counted from the work at 30 s
    now[0] = 90.0
    assert pace.quiet
    assert pace.work() is True
    assert not pace.quiet and pace.stretch(1.0) == 1.0


def test_zero_quiet_seconds_is_never_quiet() -> None:
    now = [0.0]
    pace = Pace(0.0, 60.0, monotonic=lambda: now[0])
    now[0] = 1e9
    assert not pace.quiet and pace.stretch(1.0) == 1.0


def test_configure_is_work_and_takes_the_new_settings() -> None:
    now = [0.0]
    pace = Pace(15.0, 60.0, monotonic=lambda: now[0])
    now[0] = 100.0
    assert pace.quiet
    pace.configure(5.0, 10.0)
    assert not pace.quiet
    now[0] = 110.0
    assert pace.quiet and pace.stretch(1.0) == 5.0


def test_the_default_pace_of_a_source_context_is_never_quiet() -> None:
    """`storwatch scan` and tools build a SourceContext without the agent's pace: its sources read at their own."""
    from storwatch.paths import HostPaths
    from storwatch.registry import SourceContext

    ctx = SourceContext(HostPaths(), lambda: 0.0, lambda key: None, lambda consumer: None)
    assert ctx.pace.quiet_seconds == 0 and not ctx.pace.quiet
