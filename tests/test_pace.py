"""The agent's pace (storwatch/pace.py): full while GPUs work, the quiet pace on a node without a GPU process."""

from __future__ import annotations

from storwatch.pace import CpuBudget, Pace


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


def test_a_view_budget_keeps_view_seconds_until_a_view_costs_more_than_its_share() -> None:
    budget = CpuBudget(0.005, 15.0)
    assert budget.interval(1.0) == 1.0  # no View measured yet
    budget.spent(0.002)  # a small node's View: 0.2 % of a core at one a second
    assert budget.interval(1.0) == 1.0
    budget = CpuBudget(0.005, 15.0)
    budget.spent(0.025)  # a large node's: 25 ms, 2.5 % at one a second
    assert budget.interval(1.0) == 5.0  # 25 ms every 5 s is 0.5 %
    assert budget.interval(10.0) == 10.0  # a configured interval longer than the budget's stays
    budget.spent(10.0)
    assert budget.interval(1.0) == 15.0  # never past the longest


def test_a_view_budget_follows_the_cost_smoothed() -> None:
    budget = CpuBudget(0.01, 60.0)
    budget.spent(0.1)
    assert budget.interval(1.0) == 10.0
    budget.spent(0.0)  # one cheap View moves the figure by SMOOTHING of the difference, not all the way
    assert budget.cost is not None and abs(budget.cost - 0.1 * (1 - CpuBudget.SMOOTHING)) < 1e-12
    for _ in range(60):
        budget.spent(0.0)
    assert budget.interval(1.0) == 1.0
    budget.spent(-1.0)  # a clock that went back counts as nothing, not as a credit
    assert budget.cost is not None and budget.cost >= 0.0


def test_a_zero_share_turns_the_budget_off() -> None:
    budget = CpuBudget(0.0, 15.0)
    budget.spent(100.0)
    assert budget.interval(1.0) == 1.0
    budget.configure(0.005, 2.0)
    assert budget.interval(1.0) == 2.0


def test_a_budget_sums_its_parts_each_smoothed_on_its_own() -> None:
    budget = CpuBudget(0.002, 5.0)
    budget.spent(0.001, "tick")
    budget.spent(0.002, "nfs")
    assert budget.cost == 0.003 and budget.interval(1.0) == 1.5
    budget.spent(0.0, "nfs")  # nfs's figure moves, the tick's does not
    assert budget.cost is not None and abs(budget.cost - (0.001 + 0.002 * (1 - CpuBudget.SMOOTHING))) < 1e-12
    budget.forget()
    assert budget.cost is None and budget.interval(1.0) == 1.0


def test_the_seconds_work_over_its_share_stretches_ticks_and_the_paced_reads() -> None:
    """A tick and the paced reads that come every tick make one round of the second's work: over tick_cpu_share,
    they all wait longer, up to tick_max_seconds; slower sources keep their own interval and do not count, and the
    quiet pace still applies."""
    now = [0.0]
    pace = Pace(15.0, 60.0, monotonic=lambda: now[0], tick_seconds=1.0, budget=CpuBudget(0.002, 5.0))
    pace.spent("tick", 0.0005, 1.0)
    pace.spent("diskstats", 0.0005, 1.0)
    assert pace.stretch(1.0) == 1.0 and pace.stretch(0.5) == 0.5  # 0.1 % of a core: within the share
    assert pace.stretch(0.25, keeps_second=True) == 0.25
    pace.spent("nfs", 0.002, 1.0)
    assert pace.stretch(1.0) == 1.5  # 3 ms a round: every 1.5 s is 0.2 %
    # the access source's looks between passes: at most a tick apart however far the budget stretches the rest
    assert pace.stretch(0.25, keeps_second=True) == 1.0 and pace.stretch(2.0, keeps_second=True) == 2.0
    assert pace.stretch(0.5) == 1.5 and pace.stretch(5.0) == 5.0
    pace.spent("access", 1.0, 5.0)  # every 5 s: not the second's work
    assert pace.stretch(1.0) == 1.5
    for _ in range(30):
        pace.spent("nfs", 1.0, 1.0)
    assert pace.stretch(1.0) == 5.0  # never past tick_max_seconds
    assert pace.stretch(1.0, quiet=False) == 5.0  # the GPU source: the budget, never the quiet pace
    now[0] = 60.0
    assert pace.quiet and pace.stretch(1.0) == 15.0
    assert pace.stretch(0.25, keeps_second=True) == 15.0  # the quiet pace still applies
    assert pace.stretch(1.0, quiet=False) == 5.0
    pace.configure(15.0, 60.0, 1.0)  # a reload: full pace, the cost measured again
    assert pace.stretch(1.0) == 1.0


class _Looks:
    """A source as the access source paces itself: looks every 0.25 s, keeping that pace while told to."""

    name = "access"
    interval_seconds = 0.25

    def __init__(self) -> None:
        self.keeps_pace = False

    def collect(self) -> object:
        return object()

    def close(self) -> None:
        pass


def test_a_source_keeping_its_pace_is_not_stretched_by_the_seconds_budget() -> None:
    """The access source's looks, stretched to a tick by the second's budget on a busy node, come at their own pace
    while a save's file is open: its end and the sync that may follow last under a second (a look a second after the
    close missed a reopen-and-fsync of 0.7 s in a full run under mount churn)."""
    import threading
    from types import SimpleNamespace

    from storwatch.agent.collectors import Collectors, SourceState
    from storwatch.registry import SOURCES

    spec = next(s for s in SOURCES if s.name == "access")
    assert spec.paced and spec.keeps_second
    pace = Pace(15.0, 60.0, monotonic=lambda: 0.0, tick_seconds=1.0, budget=CpuBudget(0.002, 5.0))
    for _ in range(30):
        pace.spent("nfs", 1.0, 1.0)  # the second's work far over its share: ticks stretched to 5 s
    looks = _Looks()
    state = SourceState(looks, spec.facts, spec)  # type: ignore[arg-type]
    collectors = Collectors([state], SimpleNamespace(pace=pace), lambda: 0.0, threading.Event(), lambda: None)  # type: ignore[arg-type]
    assert 0.9 < collectors.collect_once(state) <= 1.0  # stretched to a tick, never past it
    looks.keeps_pace = True
    assert collectors.collect_once(state) <= 0.25  # a save's file open: its own pace
    looks.keeps_pace = False
    assert 0.9 < collectors.collect_once(state) <= 1.0
