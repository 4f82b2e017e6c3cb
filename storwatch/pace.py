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
