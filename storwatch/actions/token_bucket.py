"""Token buckets: how often the actions may act. One bucket bounds one stream of requests (``burst`` at once, then
``per_second`` on average); :func:`take_all` takes a token from several at once or from none, and :class:`Buckets`
keeps one bucket per key (a rule, an owner), bounded in number. The Events writer and the action runner share them.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

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
