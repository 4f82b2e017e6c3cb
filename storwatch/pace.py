"""The agent's pace: every second while GPUs work, at the scrape's pace on a quiet node.

The one-second tick and the one-second reads of diskstats, mountstats and the GPU processes exist to attribute GPU
time to storage stalls as they happen. On a node where no GPU process has run for ``quiet_after_seconds`` there is no
GPU time to attribute, and the agent slows to ``quiet_seconds`` (15 s, Prometheus's usual scrape interval): ticks,
Views, the policy's evaluations (it judges each View), and the sources the registry declares ``paced`` (those whose
facts only feed the Views). The first GPU process the GPU source reports ends it at once, as does a reload. The
sources that find what is new or stuck (mounts, checkpoints, probes) and the GPU source keep their own pace.

At full pace the second-by-second work has a budget (``tick_cpu_share`` of a core): on a node where one round of it
(a tick, and the reads that come every tick: the paced sources' and the GPU source's) costs more, ticks and those
reads come that much less often, at most ``tick_max_seconds`` apart (:class:`CpuBudget`). Stalls are then accounted,
and latency windows fed, over those longer intervals; a node of ordinary size keeps its second.

Quiet is worked out from the monotonic clock each time it is asked, so there is no state to keep in step between the
threads that ask (the ticker, the source workers): only the moment of the last sign of work.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar


class Pace:
    """Whether the node is quiet now, and the interval a paced loop waits: its own, or ``quiet_seconds`` when
    longer and the node is quiet. ``quiet_seconds`` 0 turns quiet off."""

    def __init__(
        self,
        quiet_seconds: float = 0.0,
        quiet_after_seconds: float = 60.0,
        monotonic: Callable[[], float] = time.monotonic,
        *,
        tick_seconds: float = 1.0,
        budget: CpuBudget | None = None,
    ) -> None:
        self.monotonic = monotonic
        self._last_work = monotonic()
        self.budget = budget if budget is not None else CpuBudget()
        """The second-by-second work's budget: what a tick and each paced source's read at most a tick apart cost."""
        self.configure(quiet_seconds, quiet_after_seconds, tick_seconds)

    def configure(self, quiet_seconds: float, quiet_after_seconds: float, tick_seconds: float = 1.0) -> None:
        """New settings (start-up, a reload); a reload also counts as work, so the new settings apply at full pace
        first, and the work's cost is measured again."""
        self.quiet_seconds = quiet_seconds
        self.quiet_after_seconds = quiet_after_seconds
        self.tick_seconds = tick_seconds
        self.budget.forget()
        self.work()

    def spent(self, part: str, cpu_seconds: float, interval: float) -> None:
        """One round of a paced part (``tick``, or a source) took ``cpu_seconds``; it counts in the budget when it
        comes every tick (``interval``, its own, at most ``tick_seconds``): slower sources are not the second's work."""
        if interval <= self.tick_seconds:
            self.budget.spent(cpu_seconds, part)

    def work(self) -> bool:
        """A sign of work (a GPU process seen, a reload): full pace for at least ``quiet_after_seconds`` from now.
        True when the node was quiet until now (the caller wakes the paced loops)."""
        was_quiet = self.quiet
        self._last_work = self.monotonic()
        return was_quiet

    @property
    def quiet(self) -> bool:
        return self.quiet_seconds > 0 and self.monotonic() - self._last_work >= self.quiet_after_seconds

    def stretch(self, seconds: float, quiet: bool = True, keeps_second: bool = False) -> float:
        """The interval a paced loop waits now: ``seconds``, or, whichever is longer, ``quiet_seconds`` while quiet
        (unless ``quiet`` is False: a loop that must see the work that ends quiet), else the tick as the budget
        stretches it where the second-by-second work costs more than its share (``keeps_second``: never past
        ``tick_seconds``)."""
        if quiet and self.quiet:
            return max(seconds, self.quiet_seconds)
        tick = self.budget.interval(self.tick_seconds)
        if tick <= self.tick_seconds:
            return seconds
        return max(seconds, self.tick_seconds if keeps_second else tick)


class CpuBudget:
    """How often a piece of periodic work comes: every ``seconds`` it is asked for, or less often where one round of
    it costs more than ``share`` of a core over that interval.

    The work's cost grows with what the node holds (hundreds of runs, mounts and pods: bench/at_scale.py), and it is
    paid whether or not anyone reads what it makes. The CPU seconds of one round (each ``part`` smoothed over its last
    rounds, then summed) set the interval: ``cost / share``, between ``seconds`` and ``longest``. Two budgets use it:
    the View's (its making by the ticker and its judging by the policy worker), and the second-by-second work's (the
    tick's feeding of the latency windows and the stall tracker, and the one-second reads of the paced sources: see
    :class:`Pace`). A small node's round costs a few milliseconds and keeps its pace. ``share`` 0 turns the budget
    off."""

    SMOOTHING = 0.3
    """The weight of the newest round's cost in each part's running figure."""

    def __init__(self, share: float = 0.0, longest: float = 15.0) -> None:
        self.share = share
        self.longest = longest
        self._parts: dict[str, float] = {}
        self._lock = threading.Lock()  # parts are spent from the ticker and the source workers

    def configure(self, share: float, longest: float) -> None:
        self.share = share
        self.longest = longest

    def spent(self, cpu_seconds: float, part: str = "") -> None:
        """The CPU seconds one round of ``part`` took."""
        cpu_seconds = max(0.0, cpu_seconds)
        with self._lock:
            before = self._parts.get(part)
            self._parts[part] = cpu_seconds if before is None else before + self.SMOOTHING * (cpu_seconds - before)

    def forget(self) -> None:
        """Start the figures again (a reload: the parts and their costs may have changed)."""
        with self._lock:
            self._parts = {}

    @property
    def cost(self) -> float | None:
        """CPU seconds one round takes, its parts smoothed and summed; None before the first."""
        with self._lock:
            return sum(self._parts.values()) if self._parts else None

    def interval(self, seconds: float) -> float:
        """The interval between rounds now, for the configured ``seconds``."""
        cost = self.cost
        if self.share <= 0 or cost is None:
            return seconds
        return max(seconds, min(self.longest, cost / self.share))


class Backoff:
    """The one backoff: a wait that doubles after each failure, up to ``cap``, and starts again at ``first`` after a
    success. nvmlInit's retries, the Kubernetes watches' reconnects, a failing collector's log lines and a webhook's
    retries all wait by it."""

    def __init__(self, first: float, cap: float = math.inf) -> None:
        self.first = first
        self.cap = cap
        self.wait = first
        """The wait the next failure gets."""

    def failed(self) -> float:
        """One more failure: the wait before the next try (then doubled, capped, for the one after)."""
        wait = self.wait
        self.wait = min(self.wait * 2.0, self.cap)
        return wait

    def reset(self) -> None:
        """A success: the next failure waits ``first`` again."""
        self.wait = self.first


# -- token buckets: how often the actions may act. One bucket bounds one stream of requests (``burst`` at once, then
# ``per_second`` on average); take_all takes a token from several at once or from none, and Buckets keeps one bucket per
# key (a rule, an owner), bounded in number. The Events writer and the action runner share them.

Clock = Callable[[], float]
K = TypeVar("K", bound=Hashable)

MAX_KEYED_BUCKETS = 1024
"""Buckets kept per :class:`Buckets` by default: past it, full ones are forgotten first (a new bucket starts full,
so forgetting a full one changes nothing), then the least recently used."""


class TokenBucket:
    """``burst`` requests at once, then ``per_second`` on average."""

    def __init__(self, burst: int, per_second: float, clock: Clock) -> None:
        self.capacity = float(burst)
        self.rate = per_second
        self.tokens = float(burst)
        self.clock = clock
        self.at = clock()

    def refill(self) -> float:
        """The tokens it holds now (what came back since it was last looked at added, up to its capacity)."""
        now = self.clock()
        if now > self.at:  # a clock stepped back gives nothing back, and takes nothing away
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        return self.tokens

    @property
    def full(self) -> bool:
        """Holds its whole burst: the same as a bucket made now."""
        return self.refill() >= self.capacity

    def take(self) -> bool:
        """Take a token: False (and nothing taken) while it holds less than one."""
        if self.refill() >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def seconds_to_token(self) -> float:
        """How long until it holds a token again (0 while it holds one; infinity when it never refills)."""
        missing = 1.0 - self.refill()
        if missing <= 0:
            return 0.0
        return missing / self.rate if self.rate > 0 else float("inf")


def take_all(buckets: Sequence[TokenBucket]) -> TokenBucket | None:
    """Take one token from every bucket, or from none: None when taken, else the first bucket that holds less than
    one (so a request refused by one budget spends nothing of the others)."""
    for bucket in buckets:
        if bucket.refill() < 1.0:
            return bucket
    for bucket in buckets:
        bucket.tokens -= 1.0
    return None


class Buckets(Generic[K]):
    """One bucket per key, each ``burst`` at once then ``per_second``, made on first use; at most ``max_keys`` kept
    (full buckets forgotten first, then the least recently used: forgetting one that is not full gives its key a full
    bucket again, which the bound on keys bounds)."""

    def __init__(self, burst: int, per_second: float, clock: Clock, max_keys: int = MAX_KEYED_BUCKETS) -> None:
        self.burst = burst
        self.per_second = per_second
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: collections.OrderedDict[K, TokenBucket] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def get(self, key: K) -> TokenBucket:
        bucket = self._buckets.get(key)
        if bucket is not None:
            self._buckets.move_to_end(key)
            return bucket
        if len(self._buckets) >= self.max_keys:
            for old in [k for k, b in self._buckets.items() if b.full]:
                del self._buckets[old]
            while len(self._buckets) >= self.max_keys:
                self._buckets.popitem(last=False)
        bucket = self._buckets[key] = TokenBucket(self.burst, self.per_second, self.clock)
        return bucket


__all__ = ["MAX_KEYED_BUCKETS", "Buckets", "TokenBucket", "take_all"]
