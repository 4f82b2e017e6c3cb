"""Calls that can hang in the kernel (statvfs, probes), with a deadline each and at most one in flight per key.

The calls run in one helper process (``_blocking_worker.py``), so a call stuck in uninterruptible sleep strands a
thread there and never one of the agent's: the agent's scrapes, its other sources and its exit on SIGTERM never wait
on a mount. A key whose call is still in flight is reported stuck and gets no second call until the first returns;
the number of calls in flight, and so the helper's threads, is bounded.
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

log = logging.getLogger(__name__)

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_blocking_worker.py")


@dataclass(frozen=True)
class CallOutcome:
    values: tuple[str, ...] | None = None
    """The call's answer when it returned successfully."""
    error: str | None = None
    """Why the call failed (an errno message), or why it was not made."""
    stuck: bool = False
    """Still in flight past its deadline."""
    in_flight_seconds: float = 0.0


@dataclass
class _Pending:
    key: str
    started: float


class BlockingCalls:
    def __init__(self, max_inflight: int = 16, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_inflight = max_inflight
        self._clock = clock
        self._lock = threading.Condition()
        self._ids = itertools.count(1)
        self._pending: dict[str, _Pending] = {}  # request id -> pending call
        self._by_key: dict[str, str] = {}  # key -> request id in flight
        self._done: dict[str, CallOutcome] = {}  # key -> outcome not yet collected
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False

    # -- the helper process

    def _ensure_worker(self) -> subprocess.Popen[bytes]:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            return proc
        if proc is not None:
            log.warning("blocking-call helper exited with %s; starting a new one", proc.returncode)
            self._fail_all("helper process exited")
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", _WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        self._proc = proc
        threading.Thread(target=self._read_replies, args=(proc,), name="blocking-replies", daemon=True).start()
        return proc

    def _read_replies(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            parts = raw.decode("utf-8", "replace").rstrip("\n").split(" ")
            if len(parts) < 2:
                continue
            req_id, status, rest = parts[0], parts[1], parts[2:]
            if status == "ok":
                outcome = CallOutcome(values=tuple(rest))
            else:
                outcome = CallOutcome(error=" ".join(rest[1:]) or "failed")
            with self._lock:
                pending = self._pending.pop(req_id, None)
                if pending is None:
                    continue
                if self._by_key.get(pending.key) == req_id:
                    del self._by_key[pending.key]
                self._done[pending.key] = outcome
                self._lock.notify_all()

    def _fail_all(self, why: str) -> None:
        for pending in self._pending.values():
            self._done[pending.key] = CallOutcome(error=why)
        self._pending.clear()
        self._by_key.clear()

    # -- calls

    def call_many(
        self, op: str, requests: Mapping[str, Sequence[bytes | str]], timeout: float
    ) -> dict[str, CallOutcome]:
        """Run ``op`` for every key, wait at most ``timeout`` seconds in all, and say how each went.

        The first argument of each request is a path (bytes or str); the rest are plain words.
        """
        deadline = self._clock() + timeout
        with self._lock:
            if self._closed:
                return {k: CallOutcome(error="shutting down") for k in requests}
            # One call per key: a key whose earlier call has not returned gets no second one.
            queue = [k for k in requests if k not in self._by_key]
            queue.reverse()
            while True:
                # Send as many as the bound allows; quick calls free their slots for the rest of the queue.
                self._send(op, requests, queue)
                if not queue and not any(k in self._by_key for k in requests):
                    break
                left = deadline - self._clock()
                if left <= 0:
                    break
                self._lock.wait(left)
            now = self._clock()
            result: dict[str, CallOutcome] = {}
            for key in requests:
                if key in self._done:
                    result[key] = self._done.pop(key)
                elif key in self._by_key:
                    # Still out after a whole deadline of waiting: stuck, however long ago it started.
                    age = now - self._pending[self._by_key[key]].started
                    result[key] = CallOutcome(stuck=True, in_flight_seconds=age)
                else:
                    result[key] = CallOutcome(
                        error=f"not called: {len(self._pending)} calls already in flight (limit {self.max_inflight})"
                    )
            return result

    def _send(self, op: str, requests: Mapping[str, Sequence[bytes | str]], queue: list[str]) -> None:
        if not queue or len(self._pending) >= self.max_inflight:
            return
        proc = self._ensure_worker()
        assert proc.stdin is not None
        lines = []
        while queue and len(self._pending) < self.max_inflight:
            key = queue.pop()
            args = requests[key]
            req_id = str(next(self._ids))
            path = os.fsencode(args[0]).hex() if args else ""
            lines.append(" ".join([req_id, op, path, *(str(a) for a in args[1:])]) + "\n")
            self._pending[req_id] = _Pending(key, self._clock())
            self._by_key[key] = req_id
        try:
            proc.stdin.write("".join(lines).encode())
            proc.stdin.flush()
        except OSError as err:
            self._fail_all(f"helper process unreachable: {err}")

    def in_flight(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        """Stop the helper without waiting on it: a thread stuck in the kernel must not hold the agent."""
        with self._lock:
            self._closed = True
            proc, self._proc = self._proc, None
            self._fail_all("shutting down")
            self._lock.notify_all()
        if proc is None:
            return
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
