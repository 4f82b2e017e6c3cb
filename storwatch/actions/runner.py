"""The action runner: takes the policy engine's ActionRequests and carries them out off the engine's thread, on
lanes (a bounded queue, a thread, and a worker waited for no longer than the action's time): one per action, and for
an action that says where a request goes (``lane(params)``: a webhook's receiver), one per destination, at most
``MAX_LANES`` of them. A webhook to a receiver that never answers delays neither the engine, nor any other action,
nor the webhooks to other receivers.

At submission a request is dropped, and counted, when the same (rule, action, params, entity kind and key,
transition, and the values of the rule's ``repeat_on`` fields) was accepted within the rule's cooldown (``skipped``:
idempotent however often it is submitted), or when its lane's queue is full (``skipped``). It is refused for its
rate (``rate_limited``) when any of its budgets is empty: its action's token bucket, its rule's for that action, and
its entity's owner's for that action (the Kubernetes namespace or the uid a run belongs to: ``Entity.owner``), so
that neither one rule nor one tenant's entities use up what the others need; a token is taken from all three or from
none. A request refused for its rate is not dropped: :meth:`ActionRunner.take_refused` hands it back to the engine,
which asks again, View after View, while its rule still fires (storwatch.policy.engine), until tokens return; a
request asked again so (``deferred``) and refused again is not counted again. A dry run is logged and counted
(``dry_run``) and does nothing. Every outcome is counted by (rule, action, outcome), for
``storwatch_policy_actions_total``, and the last results are kept for /status. A request that failed is forgotten by
the idempotency check, so the next submission tries again.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from storwatch.actions.base import Action, ActionRequest, ActionResult, EntityKind, Outcome
from storwatch.actions.log import describe
from storwatch.calls.deadline import DeadlineWorker
from storwatch.pace import Buckets, TokenBucket, take_all
from storwatch.printable import printable
from storwatch.threadname import name_this_thread

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass(frozen=True)
class Limits:
    """What bounds one action: its time per run, and its budgets, each a token bucket (``burst`` at once,
    ``per_second`` after): the action's own, each rule's, and each owner's (None: no budget of that kind)."""

    timeout: float
    burst: int
    per_second: float
    rule_burst: int | None = None
    rule_per_second: float = 0.0
    owner_burst: int | None = None
    owner_per_second: float = 0.0


DEFAULT_LIMITS: Mapping[str, Limits] = {
    "log": Limits(timeout=2.0, burst=50, per_second=5.0, rule_burst=25, rule_per_second=2.5, owner_burst=10,
                  owner_per_second=1.0),
    "event": Limits(timeout=40.0, burst=10, per_second=1.0, rule_burst=5, rule_per_second=0.5, owner_burst=3,
                    owner_per_second=0.3),
    "webhook": Limits(timeout=60.0, burst=10, per_second=1.0, rule_burst=5, rule_per_second=0.5, owner_burst=3,
                      owner_per_second=0.3),
    # One rule of the shipped set asks for checkpoints, in a drain, for every run of the node: it may take nearly all.
    "request_checkpoint": Limits(timeout=15.0, burst=5, per_second=0.2, rule_burst=4, rule_per_second=0.15,
                                 owner_burst=2, owner_per_second=0.1),
    # sync only queues a copy (the copy worker holds it to its own deadline): every run of a draining node at once.
    "sync": Limits(timeout=10.0, burst=20, per_second=2.0, rule_burst=15, rule_per_second=1.5, owner_burst=5,
                   owner_per_second=0.5),
}  # fmt: skip
OTHER_LIMITS = Limits(timeout=30.0, burst=5, per_second=0.5, rule_burst=3, rule_per_second=0.3, owner_burst=2,
                      owner_per_second=0.2)  # fmt: skip
"""For an action that DEFAULT_LIMITS does not name."""
QUEUE_SIZE = 64
"""Requests waiting per lane: past it a request is dropped (``skipped``), never waited for by the engine."""
MAX_LANES = 8
"""Lanes of one action kept per destination (webhook receivers). Past it an idle one is ended to make room; while
all are busy, the requests for other destinations share one more lane."""
SHARED_LANE = "*"
"""The key of that shared lane."""
HISTORY = 100
"""Results kept for /status."""
MAX_REMEMBERED = 4096
"""Accepted requests remembered for the idempotency check (the oldest forgotten first past it)."""
MAX_REFUSED = 4096
"""Requests refused for their rate held for :meth:`ActionRunner.take_refused` (the engine takes them every View)."""
GRACE_SECONDS = 1.0
"""Waited past an action's own time before it is called hung: every action bounds its own time, this is the floor."""


@dataclass(frozen=True)
class ActionRecord:
    """One request's result, for /status."""

    at: float
    rule: str
    action: str
    entity_kind: EntityKind
    entity_key: str
    outcome: Outcome
    detail: str


def idempotency_key(request: ActionRequest) -> tuple[str, ...]:
    """What makes two requests the same: rule, action, its params (two webhooks of one rule are two actions),
    entity, transition, and what the rule's ``repeat_on`` fields held (a newer checkpoint is a new request)."""
    params = json.dumps(request.params, sort_keys=True, default=repr)
    digest = hashlib.sha256(params.encode()).hexdigest()[:16]
    entity = request.entity
    return (request.rule, request.action, digest, entity.kind, entity.key, request.transition, request.revision)


class _Lane:
    """One lane: its queue, thread and worker."""

    def __init__(self, action: str, key: str, queue_size: int) -> None:
        self.key = key
        self.queue: queue.Queue[tuple[ActionRequest, tuple[str, ...], float] | None] = queue.Queue(queue_size)
        self.worker = DeadlineWorker(f"action-{action}" + (f" {printable(key)[:60]}" if key else ""))
        self.thread: threading.Thread | None = None
        self.pending = 0
        """Requests queued or running on it (changed under the runner's lock)."""


class _Slot:
    """One action: its budgets and its lanes."""

    def __init__(self, action: Action, limits: Limits, clock: Clock) -> None:
        self.action = action
        self.limits = limits
        self.bucket = TokenBucket(limits.burst, limits.per_second, clock)
        self.rules: Buckets[str] | None = None
        if limits.rule_burst is not None:
            self.rules = Buckets(limits.rule_burst, limits.rule_per_second, clock)
        self.owners: Buckets[str] | None = None
        if limits.owner_burst is not None:
            self.owners = Buckets(limits.owner_burst, limits.owner_per_second, clock)
        lane_of = getattr(action, "lane", None)
        self.lane_of: Callable[[Mapping[str, object]], str] | None = lane_of if callable(lane_of) else None
        self.lanes: dict[str, _Lane] = {}

    def budgets(self, request: ActionRequest) -> list[tuple[TokenBucket, str]]:
        """The buckets a request takes a token from, each with what it bounds in words."""
        lim = self.limits
        out = [(self.bucket, f"{request.action} is limited to {lim.burst} at once, {lim.per_second:g} a second after")]
        if self.rules is not None:
            out.append(
                (
                    self.rules.get(request.rule),
                    f"rule {request.rule} may ask {request.action} {lim.rule_burst} times at once, "
                    f"{lim.rule_per_second:g} a second after",
                )
            )
        owner = request.entity.owner
        if self.owners is not None and owner is not None:
            out.append(
                (
                    self.owners.get(owner),
                    f"the entities of {printable(owner)} may have {request.action} {lim.owner_burst} times at once, "
                    f"{lim.owner_per_second:g} a second after",
                )
            )
        return out


class ActionRunner:
    """Runs ``actions`` (by name, as :func:`storwatch.actions.registry.registry` makes them)."""

    def __init__(
        self,
        actions: Mapping[str, Action],
        *,
        clock: Clock = time.time,
        limits: Mapping[str, Limits] | None = None,
        queue_size: int = QUEUE_SIZE,
        history: int = HISTORY,
        max_lanes: int = MAX_LANES,
    ) -> None:
        self.clock = clock
        chosen = {**DEFAULT_LIMITS, **(limits or {})}
        self._slots = {name: _Slot(action, chosen.get(name, OTHER_LIMITS), clock) for name, action in actions.items()}
        self._queue_size = queue_size
        self._max_lanes = max_lanes
        self._lock = threading.Condition()
        self._counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._recent: collections.deque[ActionRecord] = collections.deque(maxlen=history)
        self._accepted: dict[tuple[str, ...], tuple[float, float]] = {}
        """Idempotency: each key accepted, (when, until when it is a repeat)."""
        self._refused: collections.deque[ActionRequest] = collections.deque(maxlen=MAX_REFUSED)
        self._pending = 0
        self._closed = False

    # -- what the engine calls

    def submit(self, request: ActionRequest) -> Outcome | None:
        """Queue ``request``; never blocks. None when queued, else the outcome decided now (and recorded, except a
        ``deferred`` request refused for its rate again)."""
        slot = self._slots.get(request.action)
        if slot is None:
            return self._record(request, ActionResult("failed", f"no action named {printable(request.action)}"))
        lane_key = ""
        if slot.lane_of is not None:
            try:
                lane_key = slot.lane_of(request.params)
            except Exception as err:  # a bug in an action's lane(): its own lane for all, and the request still runs
                log.warning("action %s: lane(): %s", request.action, err)
        now = self.clock()
        key = idempotency_key(request)
        with self._lock:
            if self._closed:
                return self._record_locked(request, ActionResult("skipped", "the runner is shut down"), now)
            self._forget(now)
            done = self._accepted.get(key)
            if done is not None and now < done[1]:
                return self._record_locked(
                    request,
                    ActionResult("skipped", f"the same request was taken {now - done[0]:.0f} s ago, within the rule's "
                                 f"cooldown of {request.cooldown:g} s"),
                    now,
                )  # fmt: skip
            budgets = slot.budgets(request)
            empty = take_all([bucket for bucket, _ in budgets])
            if empty is not None:
                self._refused.append(request)
                if request.deferred:
                    return "rate_limited"  # counted when first refused; still owed
                why = next(text for bucket, text in budgets if bucket is empty)
                return self._record_locked(
                    request, ActionResult("rate_limited", f"{why}: asked again when tokens return"), now
                )
            lane = self._lane(slot, request.action, lane_key)
            try:
                lane.queue.put_nowait((request, key, now))
            except queue.Full:
                return self._record_locked(
                    request, ActionResult("skipped", f"{lane.queue.maxsize} {request.action} requests waiting"), now
                )
            if request.cooldown > 0:
                if len(self._accepted) >= MAX_REMEMBERED:
                    self._accepted.pop(next(iter(self._accepted)))
                self._accepted.pop(key, None)  # re-inserted last: the dict stays in order of acceptance
                self._accepted[key] = (now, now + request.cooldown)
            self._pending += 1
            lane.pending += 1
            if lane.thread is None:
                lane.thread = threading.Thread(
                    target=self._serve, args=(slot, lane), name=f"actions-{request.action}", daemon=True
                )
                lane.thread.start()
        return None

    def take_refused(self) -> list[ActionRequest]:
        """The requests refused for their rate since the last call (at submission, or by the action itself), oldest
        first: the engine asks for each again while its rule still fires."""
        with self._lock:
            out = list(self._refused)
            self._refused.clear()
            return out

    def counts(self) -> Mapping[tuple[str, str, str], int]:
        """Requests by (rule, action, outcome) since the start: ``storwatch_policy_actions_total``."""
        with self._lock:
            return dict(self._counts)

    def recent(self) -> list[ActionRecord]:
        """The last results, oldest first."""
        with self._lock:
            return list(self._recent)

    def lanes(self) -> dict[str, list[str]]:
        """Each action's lanes now, by key ("" for an action's single lane)."""
        with self._lock:
            return {name: list(slot.lanes) for name, slot in self._slots.items() if slot.lanes}

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every queued request has its result (a hung one's is its timeout); False if not by then."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True

    def close(self) -> None:
        """Take no more requests, drop those waiting, end the lanes' threads (a hung action's is left to return), and
        close the actions that hold resources (``close()``: the request_checkpoint helper process)."""
        with self._lock:
            self._closed = True
            lanes = [lane for slot in self._slots.values() for lane in slot.lanes.values()]
        for lane in lanes:
            while True:
                try:
                    item = lane.queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    self._finish(lane, item[0], item[1], ActionResult("skipped", "the runner shut down"))
            self._end(lane)
        for slot in self._slots.values():
            close = getattr(slot.action, "close", None)
            if callable(close):
                close()

    # -- the lanes

    def _lane(self, slot: _Slot, action: str, key: str) -> _Lane:
        """The lane for ``key`` (made, bounded, under the lock)."""
        lane = slot.lanes.get(key)
        if lane is not None:
            return lane
        keyed = [k for k in slot.lanes if k not in ("", SHARED_LANE)]
        if key and len(keyed) >= self._max_lanes:
            # An idle lane makes room (not one whose worker is still held by a run past its time).
            idle = next((k for k in keyed if slot.lanes[k].pending == 0 and not slot.lanes[k].worker.busy), None)
            if idle is None:
                key = SHARED_LANE
                lane = slot.lanes.get(key)
                if lane is not None:
                    return lane
            else:
                self._end(slot.lanes.pop(idle))
        lane = slot.lanes[key] = _Lane(action, key, self._queue_size)
        return lane

    @staticmethod
    def _end(lane: _Lane) -> None:
        with contextlib.suppress(queue.Full):
            lane.queue.put_nowait(None)
        lane.worker.stop()

    def _serve(self, slot: _Slot, lane: _Lane) -> None:
        name_this_thread()
        while True:
            item = lane.queue.get()
            if item is None:
                return
            request, key, _ = item
            self._finish(lane, request, key, self._run(slot, lane, request))

    def _run(self, slot: _Slot, lane: _Lane, request: ActionRequest) -> ActionResult:
        if request.dry_run:
            log.info("dry run, %s not run: %s", request.action, describe(request))
            return ActionResult("dry_run", "dry run: logged, nothing done")
        timeout = slot.limits.timeout
        if lane.worker.busy:
            return ActionResult("failed", f"an earlier {request.action} run on its lane has not returned: not started")
        outcome = lane.worker.run(lambda: slot.action.run(request, timeout), timeout + GRACE_SECONDS)
        if outcome is None:
            return ActionResult(
                "failed",
                f"did not finish within {timeout:g} s: left running, no other {request.action} runs on its lane "
                "until it returns",
            )
        value, error = outcome
        if error is not None:
            return ActionResult("failed", f"{type(error).__name__}: {printable(str(error))}")
        if not isinstance(value, ActionResult):
            return ActionResult("failed", f"the action answered {type(value).__name__}, not a result")
        return value

    def _finish(self, lane: _Lane, request: ActionRequest, key: tuple[str, ...], result: ActionResult) -> None:
        with self._lock:
            if result.outcome in ("failed", "rate_limited"):
                self._accepted.pop(key, None)  # not done: the next one tries again
            if result.outcome == "rate_limited":
                self._refused.append(request)  # refused by the action's own bucket (the Events writer's)
            self._pending -= 1
            lane.pending -= 1
            if not (result.outcome == "rate_limited" and request.deferred):  # counted when first refused
                self._record_locked(request, result, self.clock())
            self._lock.notify_all()

    # -- bookkeeping

    def _forget(self, now: float) -> None:
        for key, (_, until) in list(self._accepted.items()):
            if until <= now:
                del self._accepted[key]

    def _record(self, request: ActionRequest, result: ActionResult) -> Outcome:
        with self._lock:
            return self._record_locked(request, result, self.clock())

    def _record_locked(self, request: ActionRequest, result: ActionResult, now: float) -> Outcome:
        entity = request.entity
        self._counts[(request.rule, request.action, result.outcome)] += 1
        self._recent.append(
            ActionRecord(now, request.rule, request.action, entity.kind, entity.key, result.outcome, result.detail)
        )
        level = logging.WARNING if result.outcome == "failed" else logging.DEBUG
        log.log(level, "action %s for rule %s on %s %s: %s %s", request.action, request.rule, entity.kind,
                entity.key, result.outcome, result.detail)  # fmt: skip
        return result.outcome
