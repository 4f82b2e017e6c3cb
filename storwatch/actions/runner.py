"""The action runner: takes the policy engine's ActionRequests and carries them out off the engine's thread, each
action on its own lane (a bounded queue, a thread, and a worker waited for no longer than the action's time), so a
webhook to a receiver that never answers delays neither the engine nor any other action.

At submission a request is dropped, and counted, when the same (rule, action, params, entity kind and key,
transition) was accepted within the rule's cooldown (``skipped``: idempotent however often it is submitted), when its
action's token bucket is empty (``rate_limited``), or when its lane's queue is full (``skipped``). A dry run is logged
and counted (``dry_run``) and does nothing. Every outcome is counted by (rule, action, outcome), for
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
from storwatch.actions.kube_events import TokenBucket
from storwatch.actions.log import describe
from storwatch.deadline_worker import DeadlineWorker
from storwatch.printable import printable

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass(frozen=True)
class Limits:
    """What bounds one action: its time per run, and its token bucket (``burst`` at once, ``per_second`` after)."""

    timeout: float
    burst: int
    per_second: float


DEFAULT_LIMITS: Mapping[str, Limits] = {
    "log": Limits(timeout=2.0, burst=50, per_second=5.0),
    "event": Limits(timeout=40.0, burst=10, per_second=1.0),
    "webhook": Limits(timeout=60.0, burst=10, per_second=1.0),
    "request_checkpoint": Limits(timeout=15.0, burst=5, per_second=0.2),
    # sync only queues a copy (the copy worker holds it to its own deadline): every run of a draining node at once.
    "sync": Limits(timeout=10.0, burst=20, per_second=2.0),
}
OTHER_LIMITS = Limits(timeout=30.0, burst=5, per_second=0.5)
"""For an action that DEFAULT_LIMITS does not name."""
QUEUE_SIZE = 64
"""Requests waiting per action: past it a request is dropped (``skipped``), never waited for by the engine."""
HISTORY = 100
"""Results kept for /status."""
MAX_REMEMBERED = 4096
"""Accepted requests remembered for the idempotency check (the oldest forgotten first past it)."""
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
    entity and transition."""
    params = json.dumps(request.params, sort_keys=True, default=repr)
    digest = hashlib.sha256(params.encode()).hexdigest()[:16]
    entity = request.entity
    return (request.rule, request.action, digest, entity.kind, entity.key, request.transition)


class _Lane:
    """One action's queue, thread and worker."""

    def __init__(self, action: Action, limits: Limits, clock: Clock, queue_size: int) -> None:
        self.action = action
        self.limits = limits
        self.bucket = TokenBucket(limits.burst, limits.per_second, clock)
        self.queue: queue.Queue[tuple[ActionRequest, tuple[str, ...], float] | None] = queue.Queue(queue_size)
        self.worker = DeadlineWorker(f"action-{action.name}")
        self.thread: threading.Thread | None = None


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
    ) -> None:
        self.clock = clock
        chosen = {**DEFAULT_LIMITS, **(limits or {})}
        self._lanes = {
            name: _Lane(action, chosen.get(name, OTHER_LIMITS), clock, queue_size) for name, action in actions.items()
        }
        self._lock = threading.Condition()
        self._counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._recent: collections.deque[ActionRecord] = collections.deque(maxlen=history)
        self._accepted: dict[tuple[str, ...], tuple[float, float]] = {}
        """Idempotency: each key accepted, (when, until when it is a repeat)."""
        self._pending = 0
        self._closed = False

    # -- what the engine calls

    def submit(self, request: ActionRequest) -> Outcome | None:
        """Queue ``request``; never blocks. None when queued, else the outcome decided now (and recorded)."""
        lane = self._lanes.get(request.action)
        if lane is None:
            return self._record(request, ActionResult("failed", f"no action named {printable(request.action)}"))
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
            if not lane.bucket.take():
                return self._record_locked(
                    request,
                    ActionResult("rate_limited", f"{request.action} is limited to {lane.limits.burst} at once, "
                                 f"{lane.limits.per_second:g} a second after"),
                    now,
                )  # fmt: skip
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
            if lane.thread is None:
                lane.thread = threading.Thread(
                    target=self._serve, args=(lane,), name=f"actions-{request.action}", daemon=True
                )
                lane.thread.start()
        return None

    def counts(self) -> Mapping[tuple[str, str, str], int]:
        """Requests by (rule, action, outcome) since the start: ``storwatch_policy_actions_total``."""
        with self._lock:
            return dict(self._counts)

    def recent(self) -> list[ActionRecord]:
        """The last results, oldest first."""
        with self._lock:
            return list(self._recent)

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
        for lane in self._lanes.values():
            while True:
                try:
                    item = lane.queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    self._finish(item[0], item[1], ActionResult("skipped", "the runner shut down"))
            with contextlib.suppress(queue.Full):
                lane.queue.put_nowait(None)
            lane.worker.stop()
            close = getattr(lane.action, "close", None)
            if callable(close):
                close()

    # -- the lanes

    def _serve(self, lane: _Lane) -> None:
        while True:
            item = lane.queue.get()
            if item is None:
                return
            request, key, _ = item
            self._finish(request, key, self._run(lane, request))

    def _run(self, lane: _Lane, request: ActionRequest) -> ActionResult:
        if request.dry_run:
            log.info("dry run, %s not run: %s", request.action, describe(request))
            return ActionResult("dry_run", "dry run: logged, nothing done")
        timeout = lane.limits.timeout
        if lane.worker.busy:
            return ActionResult("failed", f"an earlier {request.action} run has not returned: not started")
        outcome = lane.worker.run(lambda: lane.action.run(request, timeout), timeout + GRACE_SECONDS)
        if outcome is None:
            return ActionResult(
                "failed",
                f"did not finish within {timeout:g} s: left running, no other {request.action} runs until it returns",
            )
        value, error = outcome
        if error is not None:
            return ActionResult("failed", f"{type(error).__name__}: {printable(str(error))}")
        if not isinstance(value, ActionResult):
            return ActionResult("failed", f"the action answered {type(value).__name__}, not a result")
        return value

    def _finish(self, request: ActionRequest, key: tuple[str, ...], result: ActionResult) -> None:
        with self._lock:
            if result.outcome == "failed":
                self._accepted.pop(key, None)  # a failed request is not done: the next one tries again
            self._pending -= 1
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
