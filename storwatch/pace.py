"""The agent's pace: every second while GPUs work, at the scrape's pace on a quiet node.

The one-second tick and the one-second reads of diskstats, mountstats and the GPU processes exist to attribute GPU
time to storage stalls as they happen. On a node where no GPU process has run for ``quiet_after_seconds`` there is no
GPU time to attribute, and the agent slows to ``quiet_seconds`` (15 s, Prometheus's usual scrape interval): ticks,
Views, the policy's evaluations (it judges each View), and the sources the registry declares ``paced`` (those whose
facts only feed the Views). The first GPU process the GPU source reports ends it at once, as does a reload. The
sources that find what is new or stuck (mounts, checkpoints, probes) and the GPU source keep their own pace.

Quiet is worked out from the monotonic clock each time it is asked, so there is no state to keep in step between the
threads that ask (the ticker, the source workers): only the moment of the last sign of work.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Pace:
    """Whether the node is quiet now, and the interval a paced loop waits: its own, or ``quiet_seconds`` when
    longer and the node is quiet. ``quiet_seconds`` 0 turns quiet off."""

    def __init__(
        self,
        quiet_seconds: float = 0.0,
        quiet_after_seconds: float = 60.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.monotonic = monotonic
        self._last_work = monotonic()
        self.configure(quiet_seconds, quiet_after_seconds)

    def configure(self, quiet_seconds: float, quiet_after_seconds: float) -> None:
        """New settings (start-up, a reload); a reload also counts as work, so the new settings apply at full pace
        first."""
        self.quiet_seconds = quiet_seconds
        self.quiet_after_seconds = quiet_after_seconds
        self.work()

    def work(self) -> bool:
        """A sign of work (a GPU process seen, a reload): full pace for at least ``quiet_after_seconds`` from now.
        True when the node was quiet until now (the caller wakes the paced loops)."""
        was_quiet = self.quiet
        self._last_work = self.monotonic()
        return was_quiet

    @property
    def quiet(self) -> bool:
        return self.quiet_seconds > 0 and self.monotonic() - self._last_work >= self.quiet_after_seconds

    def stretch(self, seconds: float) -> float:
        """The interval a paced loop waits now: ``seconds``, or ``quiet_seconds`` while quiet, whichever is longer."""
        return max(seconds, self.quiet_seconds) if self.quiet else seconds


class ViewBudget:
    """How often a View comes: every ``view_seconds``, or less often on a node where making one and judging it with
    the policy costs more than ``share`` of a core over that interval.

    A View's cost grows with what the node holds (hundreds of runs, mounts and pods: bench/at_scale.py), and it is
    paid whether or not anyone reads the View. Its CPU seconds (the ticker's making and publishing, the policy
    worker's judging), smoothed over the last Views, set the interval: ``cost / share``, between ``view_seconds`` and
    ``longest`` (15 s by default, Prometheus's usual scrape interval). A small node's View costs a few milliseconds
    and keeps its one second. What must not wait (a reload, the node drained, a pod deleted) asks for a View at once
    all the same (the agent's ``_view_now``). ``share`` 0 turns the budget off."""

    SMOOTHING = 0.3
    """The weight of the newest View's cost in the running figure."""

    def __init__(self, share: float = 0.0, longest: float = 15.0) -> None:
        self.share = share
        self.longest = longest
        self.cost: float | None = None
        """CPU seconds a View takes, smoothed; None before the first."""

    def configure(self, share: float, longest: float) -> None:
        self.share = share
        self.longest = longest

    def spent(self, cpu_seconds: float) -> None:
        """One View's CPU seconds, making and judging it."""
        cpu_seconds = max(0.0, cpu_seconds)
        self.cost = cpu_seconds if self.cost is None else self.cost + self.SMOOTHING * (cpu_seconds - self.cost)

    def interval(self, seconds: float) -> float:
        """The interval between Views now, for the configured ``seconds``."""
        if self.share <= 0 or self.cost is None:
            return seconds
        return max(seconds, min(self.longest, self.cost / self.share))
