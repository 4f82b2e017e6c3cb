"""Calls that can hang in the kernel (statvfs, probes, checkpoint scans), with a deadline each and at most one in
flight per key.

The calls run in a helper process (``_blocking_worker.py``, or another worker script built on it), so a call stuck in
the kernel strands a thread there and never one of the agent's: the agent's scrapes, its other sources and its exit on
SIGTERM never wait on a mount. A key whose call is still in flight past its deadline is reported stuck and gets no
second call until the first returns.

Two bounds keep the helper's threads bounded without letting hung mounts starve healthy ones:

* ``max_inflight``: calls within their deadline (the working set). A call past its deadline leaves the working set
  for the stuck set, freeing its slot, as long as the stuck set has room.
* ``max_stuck``: calls past their deadline still waiting in the helper. While the stuck set is full, only keys that
  answered in time on their last call are called (a key never called, or whose last call was late, is left out and
  reported ``skipped``), and a call that then goes past its deadline keeps its working slot. So the helper never
  holds more than ``max_inflight + max_stuck`` calls, and so threads.

Each round calls the keys that answered in time last round first, then new keys, then keys whose last call was late:
a node with a hundred hung mounts still measures every healthy one each round.

Several pools may share one helper process (a :class:`Helper`): each keeps its own bounds and its own calls, the
process and its interpreter (about 10 MB resident) are paid once. The agent's statvfs calls and checkpoint walks share
one this way (``registry.shared_helper``); a pool made with a ``command`` has a helper of its own.
"""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from storwatch.threadname import name_this_thread

log = logging.getLogger(__name__)

_TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_WORKER_CODE = f"import sys; sys.path.insert(0, {_TREE!r}); from storwatch.calls._blocking_worker import main; main()"
"""The helper's program: the tree this module comes from first on ``sys.path`` (``-I`` leaves it off)."""
FORGET_SECONDS = 3600.0
"""What the pool remembers of a key (answered in time or late) is forgotten this long after it was last asked for."""
HELPER_START_SECONDS = 30.0
"""How long a new helper may take to say it is ready (an interpreter starting on a node whose CPUs are all busy) before
calls are sent to it anyway. The calls' deadlines count from its answer: its start is not theirs."""
MIN_KEYS_KEPT = 256
"""Keys remembered, at least, whatever their age: past twice this, or twice the largest round asked for, the keys
asked for longest ago go first (pod volumes mounted and unmounted every second must not pile up for an hour)."""


@dataclass(frozen=True)
class CallOutcome:
    values: tuple[str, ...] | None = None
    """The call's answer when it returned successfully (``text`` split into words)."""
    error: str | None = None
    """Why the call failed (an errno message), or why it was not made."""
    stuck: bool = False
    """Still in flight past its deadline."""
    in_flight_seconds: float = 0.0
    """How long the call has been in flight (stuck, or still within its deadline)."""
    skipped: bool = False
    """Not called this round because of a limit (``max_inflight`` or ``max_stuck``): nothing is known of the key."""
    text: str | None = None
    """The answer as one string (a JSON answer is not split into words)."""


@dataclass
class _Pending:
    key: str
    started: float
    deadline: float
    stuck_slot: bool = False
    """Moved from the working set to the stuck set (past its deadline, while the stuck set had room)."""


@dataclass
class _Done:
    outcome: CallOutcome
    at: float


def _outcome(status: str, rest: str) -> CallOutcome:
    """A reply's status and the rest of its line as the call's outcome."""
    if status == "ok":
        return CallOutcome(values=tuple(rest.split(" ")) if rest else (), text=rest)
    if status == "json":
        return CallOutcome(values=(), text=rest)
    return CallOutcome(error=rest.partition(" ")[2] or "failed")


class Helper:
    """One helper process and the pools whose calls it runs: started at a pool's first call, again after it exits,
    and stopped once the last pool using it is closed (a later call starts a new one). Each pool's request ids carry
    its tag (``TAG.N``), by which the answers find their pool; the lines of requests are written whole, one pool at a
    time."""

    def __init__(self, command: Sequence[str] | None = None) -> None:
        """``command`` starts the helper (default: ``_blocking_worker`` under ``python -I -S``)."""
        self.command = list(command) if command is not None else [sys.executable, "-I", "-S", "-c", _WORKER_CODE]
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._ended: subprocess.Popen[bytes] | None = None
        """The last process whose output ended: it is exiting, whether or not the kernel has reaped it yet."""
        self._pools: dict[str, BlockingCalls] = {}
        self._tags = itertools.count(1)

    def attach(self, pool: BlockingCalls) -> str:
        """Route the answers to ``pool``'s requests to it: the tag its request ids start with."""
        with self._lock:
            tag = str(next(self._tags))
            self._pools[tag] = pool
            return tag

    def detach(self, tag: str) -> None:
        """The pool of ``tag`` is closed: stop the process without waiting on it once no pool is left."""
        with self._lock:
            self._pools.pop(tag, None)
            if self._pools:
                return
            proc, self._proc = self._proc, None
        if proc is not None:
            _stop(proc)

    @property
    def pid(self) -> int | None:
        """The process's PID while one runs."""
        proc = self._proc
        return proc.pid if proc is not None and self._alive(proc) else None

    def _alive(self, proc: subprocess.Popen[bytes]) -> bool:
        """Whether ``proc`` can still answer: not exited, and its output not ended (a process whose output ended is
        gone even before the kernel reaps it, while poll() still says None)."""
        return proc is not self._ended and proc.poll() is None

    def running(self) -> subprocess.Popen[bytes]:
        """The process, started (and waited for until it reads requests, at most HELPER_START_SECONDS) when none
        runs."""
        with self._lock:
            proc = self._proc
            if proc is not None and self._alive(proc):
                return proc
            if proc is not None:
                code = proc.poll()
                log.warning(
                    "blocking-call helper exited (%s); starting a new one",
                    "its output ended" if code is None else f"status {code}",
                )
                _stop(proc)  # whatever is left of it can answer nothing: killed, and reaped
            proc = subprocess.Popen(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
            self._proc = proc
            ready = threading.Event()
            reader = threading.Thread(target=self._read_replies, args=(proc, ready), daemon=True)
            reader.name = "blocking-replies"
            reader.start()
            # No call goes to the helper, and no deadline starts, before it reads requests (or exits: its reader then
            # sets ``ready`` too, and the calls fail as sent to a helper that is gone).
            if not ready.wait(HELPER_START_SECONDS):
                log.warning("blocking-call helper not ready after %.0f s; sending to it anyway", HELPER_START_SECONDS)
            return proc

    def write(self, proc: subprocess.Popen[bytes], data: bytes) -> None:
        """Send lines of requests to ``proc`` (OSError where it is gone)."""
        assert proc.stdin is not None
        with self._write_lock:
            proc.stdin.write(data)
            proc.stdin.flush()

    def _read_replies(self, proc: subprocess.Popen[bytes], ready: threading.Event) -> None:
        name_this_thread()
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                parts = raw.decode("utf-8", "surrogateescape").rstrip("\n").split(" ", 2)
                if len(parts) < 2:
                    continue
                req_id, status = parts[0], parts[1]
                if req_id == "0" and status == "ready":
                    ready.set()
                    continue
                with self._lock:
                    pool = self._pools.get(req_id.partition(".")[0])
                if pool is not None:
                    pool._answered(req_id, _outcome(status, parts[2] if len(parts) > 2 else ""))
        finally:
            ready.set()  # a helper that exited before it was ready: nobody waits on it any longer
            with self._lock:
                self._ended = proc
                pools = list(self._pools.values())
            for pool in pools:
                pool._helper_gone(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End a helper without waiting on it: a thread stuck in the kernel must not hold the agent."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.kill()
        proc.wait(timeout=0.2)
    except (OSError, subprocess.TimeoutExpired):
        log.info("blocking-call helper %d is stuck in the kernel; leaving it behind", proc.pid)


class BlockingCalls:
    def __init__(
        self,
        max_inflight: int = 16,
        clock: Callable[[], float] = time.monotonic,
        max_stuck: int = 128,
        command: Sequence[str] | None = None,
        helper: Helper | None = None,
    ) -> None:
        """``helper``: the helper process shared with other pools; without it, one of this pool's own, started by
        ``command`` (default: ``_blocking_worker`` under ``python -I -S``)."""
        self.max_inflight = max_inflight
        self.max_stuck = max_stuck
        self._clock = clock
        self._helper = helper if helper is not None else Helper(command)
        self._lock = threading.Condition()
        self._ids = itertools.count(1)
        self._pending: dict[str, _Pending] = {}  # request id -> pending call, in the order sent
        self._by_key: dict[str, str] = {}  # key -> request id in flight
        self._done: dict[str, _Done] = {}  # key -> outcome not yet collected
        self._late: dict[str, bool] = {}  # key -> whether its last finished call came back past its deadline
        self._asked: dict[str, float] = {}  # key -> when it was last asked for
        self._largest_round = 0
        self._start_waited = 0.0
        """Seconds spent starting a new helper and waiting for it to be ready, not yet added to a round's end."""
        self._gone: subprocess.Popen[bytes] | None = None
        """The last helper whose output ended (it exited, or closed it): calls sent to it are failed at once."""
        self._stuck_slots = 0
        self._next_forget = 0.0
        self._proc: subprocess.Popen[bytes] | None = None
        """The helper process this pool's calls in flight went to."""
        self._closed = False
        self._tag = self._helper.attach(self)

    # -- the helper process

    def _ensure_worker(self) -> subprocess.Popen[bytes]:
        proc = self._helper.running()
        if self._proc is not None and proc is not self._proc:
            self._fail_all("helper process exited")  # the calls sent to the one before will never be answered
        self._proc = proc
        return proc

    def _answered(self, req_id: str, outcome: CallOutcome) -> None:
        """The helper's answer to one of this pool's requests (called on the helper's reader thread)."""
        with self._lock:
            pending = self._pending.pop(req_id, None)
            if pending is None:
                return
            if pending.stuck_slot:
                self._stuck_slots -= 1
            if self._by_key.get(pending.key) == req_id:
                del self._by_key[pending.key]
            now = self._clock()
            self._done[pending.key] = _Done(outcome, now)
            self._late[pending.key] = now > pending.deadline
            self._lock.notify_all()

    def _helper_gone(self, proc: subprocess.Popen[bytes]) -> None:
        """``proc``'s output ended: the calls sent to it will never be answered, and fail now, not at their
        deadline."""
        with self._lock:
            self._gone = proc
            if self._proc is proc:
                self._fail_all("helper process exited")
                self._lock.notify_all()

    def _fail_all(self, why: str) -> None:
        now = self._clock()
        for pending in self._pending.values():
            self._done[pending.key] = _Done(CallOutcome(error=why), now)
        self._pending.clear()
        self._by_key.clear()
        self._stuck_slots = 0

    # -- the two sets

    def _working(self) -> int:
        return len(self._pending) - self._stuck_slots

    def _admit_stuck(self, now: float) -> float | None:
        """Move calls past their deadline into the stuck set while it has room; the next deadline still ahead."""
        upcoming: float | None = None
        for pending in self._pending.values():
            if pending.stuck_slot:
                continue
            if pending.deadline <= now:
                if self._stuck_slots < self.max_stuck:
                    pending.stuck_slot = True
                    self._stuck_slots += 1
            elif upcoming is None or pending.deadline < upcoming:
                upcoming = pending.deadline
        return upcoming

    def _forget(self, now: float) -> None:
        bound = 2 * max(MIN_KEYS_KEPT, self._largest_round)
        if now < self._next_forget and len(self._asked) <= bound and len(self._done) <= bound:
            return
        self._next_forget = now + 60.0
        old = {k for k, t in self._asked.items() if now - t > FORGET_SECONDS and k not in self._by_key}
        if len(self._asked) - len(old) > bound // 2:
            # Too many keys for their age to bound them: keep the half of the bound asked for most recently.
            by_age = sorted((t, k) for k, t in self._asked.items() if k not in old and k not in self._by_key)
            excess = len(self._asked) - len(old) - bound // 2
            old.update(k for _, k in by_age[:excess])
        for key in old:
            del self._asked[key]
            self._late.pop(key, None)
            self._done.pop(key, None)
        for key in [k for k, d in self._done.items() if now - d.at > FORGET_SECONDS or k not in self._asked]:
            del self._done[key]

    # -- calls

    def call_many(
        self,
        op: str,
        requests: Mapping[str, Sequence[bytes | str]],
        timeout: float,
        wait: float | None = None,
    ) -> dict[str, CallOutcome]:
        """Run ``op`` for every key (each call with a deadline of ``timeout`` seconds), wait at most ``wait`` seconds
        (``timeout`` by default) in all, and say how each went.

        The first argument of each request is a path (bytes or str); the rest are plain words. A key whose earlier
        call has not returned gets no new one: its outcome says how long it has been in flight, and whether that is
        past its deadline (``stuck``). An answer that came back after an earlier round ended is returned once, unless
        a newer one arrives within this round.
        """
        started = self._clock()
        round_end = started + (timeout if wait is None else wait)
        with self._lock:
            if self._closed:
                return {k: CallOutcome(error="shutting down") for k in requests}
            self._largest_round = max(self._largest_round, len(requests))
            for key in requests:
                self._asked[key] = started
            self._forget(started)
            # Keys that answered in time last round first, then new ones, then those whose last call was late.
            order = {False: 0, None: 1, True: 2}
            queue = sorted((k for k in requests if k not in self._by_key), key=lambda k: order[self._late.get(k)])
            while True:
                now = self._clock()
                upcoming = self._admit_stuck(now)
                if now < round_end:
                    # Once the round is over, a call started now could not be reported in it: it would only hold
                    # a working slot into the next round, ahead of the keys that answer in time there.
                    queue = self._send(op, requests, queue, now, timeout)
                    round_end += self._start_waited  # a helper's start is not the round's time either
                    self._start_waited = 0.0
                if self._closed:
                    break
                # Worth waiting for: calls still within their deadline, and keys waiting only for a working slot.
                waiting = any(
                    k in self._by_key and self._pending[self._by_key[k]].deadline > now for k in requests
                ) or any(not self._blocked_by_stuck(k) for k in queue)
                if not waiting or now >= round_end:
                    break
                wake = round_end if upcoming is None else min(round_end, upcoming)
                self._lock.wait(max(0.0, wake - now))
            now = self._clock()
            self._admit_stuck(now)
            result: dict[str, CallOutcome] = {}
            for key in requests:
                done = self._done.pop(key, None)
                if done is not None:
                    result[key] = done.outcome
                elif key in self._by_key:
                    pending = self._pending[self._by_key[key]]
                    result[key] = CallOutcome(stuck=now >= pending.deadline, in_flight_seconds=now - pending.started)
                elif self._closed:
                    result[key] = CallOutcome(error="shutting down")
                elif self._blocked_by_stuck(key):
                    result[key] = CallOutcome(
                        skipped=True,
                        error=f"not called: {self._stuck_slots} calls stuck past their deadline (limit "
                        f"{self.max_stuck}); only what answered in time last round is called",
                    )
                else:
                    result[key] = CallOutcome(
                        skipped=True,
                        error=f"not called: {self._working()} calls in flight (limit {self.max_inflight})",
                    )
            return result

    def _blocked_by_stuck(self, key: str) -> bool:
        """While the stuck set is full, a key is called only if its last call answered in time."""
        return self._stuck_slots >= self.max_stuck and self._late.get(key) is not False

    def _send(
        self, op: str, requests: Mapping[str, Sequence[bytes | str]], queue: list[str], now: float, timeout: float
    ) -> list[str]:
        """Send what the bounds allow, in queue order; the keys left unsent."""
        if not queue or self._working() >= self.max_inflight:
            return queue
        left: list[str] = []
        chosen: list[str] = []
        free = self.max_inflight - self._working()
        for key in queue:
            if len(chosen) >= free or self._blocked_by_stuck(key):
                left.append(key)
            else:
                chosen.append(key)
        if not chosen:
            return left
        before = self._proc
        proc = self._ensure_worker()  # before the new calls are counted: a restart fails only the old ones
        if proc is not before:  # a new helper's start, waited for there, is not the calls' time, nor the round's
            started, now = now, self._clock()
            self._start_waited += now - started
        lines = []
        for key in chosen:
            args = requests[key]
            req_id = f"{self._tag}.{next(self._ids)}"
            path = os.fsencode(args[0]).hex() if args else ""
            lines.append(" ".join([req_id, op, path, *(str(a) for a in args[1:])]) + "\n")
            self._pending[req_id] = _Pending(key, now, now + timeout)
            self._by_key[key] = req_id
        try:
            self._helper.write(proc, "".join(lines).encode("utf-8", "surrogateescape"))
        except OSError as err:
            self._fail_all(f"helper process unreachable: {err}")
        if self._gone is proc:  # it exited after it was started (or ready), before these calls were written
            self._fail_all("helper process exited")
        return left

    @property
    def helper_pid(self) -> int | None:
        """The helper process's PID while one runs (its threads are the bound this module keeps, with those of the
        other pools sharing it)."""
        return self._helper.pid

    def remembered(self) -> int:
        """Keys the pool holds anything of (when last asked, whether late, an answer not yet collected)."""
        with self._lock:
            return len(self._asked.keys() | self._late.keys() | self._done.keys() | self._by_key.keys())

    def in_flight(self) -> int:
        with self._lock:
            return len(self._pending)

    def stuck(self) -> int:
        """Calls in the stuck set (past their deadline, still waiting in the helper)."""
        with self._lock:
            return self._stuck_slots

    def close(self) -> None:
        """Fail what is in flight and let go of the helper: stopped without waiting on it (a thread stuck in the
        kernel must not hold the agent) once no other pool shares it."""
        with self._lock:
            self._closed = True
            self._proc = None
            self._fail_all("shutting down")
            self._lock.notify_all()
        self._helper.detach(self._tag)
