"""The ``request_checkpoint`` action: asks a training run for a checkpoint now, through the request file that
``storwatch.training.checkpoint_requested()`` polls (placed by :mod:`.request_file` in a helper process, see there
for what is never touched), and, opt-in, a signal to the run's writer processes.

A signal goes only to a PID the entity lists as the run's writer (``Entity.writer_pids``: the kernel showed it with
files open for writing under the run) and only after the kernel shows it again, at the moment of acting, writing
under the run (``sources.writers.WriterCheck``, with nothing remembered: a PID reused since by another process must
prove itself). The process is held by a pidfd from before that look until the signal, so the signal reaches the very
process that was looked at, or none (it exited: ESRCH). Never PID 1, this agent or its parent, and never where the
agent's procfs is not of its own PID namespace (without ``hostPID`` the PIDs it reads name other processes here).

Params: ``signal`` (default false), ``signal_name`` (``SIGUSR1``, the default: Slurm's ``--signal`` and Lightning's
requeue handler use it; ``SIGUSR2``; ``SIGTERM``, for loops that checkpoint on a preemption notice). A resolution asks
for nothing (``skipped``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from storwatch.actions._request_worker import OP, command
from storwatch.actions.base import ActionRequest, ActionResult
from storwatch.actions.params import Params
from storwatch.blocking import BlockingCalls
from storwatch.paths import HostPaths
from storwatch.printable import printable
from storwatch.sources.writers import GONE, WriterCheck

SIGNALS: Mapping[str, signal.Signals] = {
    "SIGUSR1": signal.SIGUSR1,
    "SIGUSR2": signal.SIGUSR2,
    "SIGTERM": signal.SIGTERM,
}
MAX_SIGNALLED = 16
"""Writer PIDs looked at per request (a run written by every rank of a large job signals this many at most)."""
FILE_SECONDS = 10.0
"""The longest the request file's placing is waited for (a hung mount): the rest of the run's time is the signal's."""


MAX_ASKED = 4096
"""Runs whose last request is remembered (the oldest forgotten first past it)."""


class AskedRuns:
    """When this agent last placed a checkpoint request in each run's directory, as its clock read then: what the
    ``sync`` action waits on to copy the checkpoint it asked for rather than an older one. Bounded; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._asked: dict[str, float] = {}

    def asked(self, run_dir: str) -> None:
        with self._lock:
            self._asked.pop(run_dir, None)  # re-inserted last: the dict stays in order of asking
            if len(self._asked) >= MAX_ASKED:
                self._asked.pop(next(iter(self._asked)))
            self._asked[run_dir] = self.clock()

    def asked_at(self, run_dir: str) -> float | None:
        with self._lock:
            return self._asked.get(run_dir)


@dataclass(frozen=True)
class RequestParams:
    signal: bool
    signal_name: str


def _read(params: Mapping[str, object]) -> tuple[RequestParams, list[str]]:
    p = Params(params, ("signal", "signal_name"))
    send = p.flag("signal", False)
    name = p.choice("signal_name", tuple(SIGNALS), "SIGUSR1")
    if "signal_name" in params and not send:
        p.problem("signal_name", "given without signal: true (no signal would be sent)")
    return RequestParams(send, name), p.errors


def request_text(request: ActionRequest) -> str:
    """What the request file says, for a person who finds it (the loop reads only its mtime)."""
    return (
        "storwatch asks for a checkpoint of this run\n"
        f"rule: {printable(request.rule)}\n"
        f"severity: {request.severity}\n"
        f"why: {printable(request.message)}\n"
        f"asked at: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(request.at or time.time()))}\n"
    )


class RequestCheckpointAction:
    name = "request_checkpoint"

    def __init__(
        self, paths: HostPaths | None = None, calls: BlockingCalls | None = None, asked: AskedRuns | None = None
    ) -> None:
        """``calls``: the helper pool the request file is placed through (its own, started on first use, unless
        given); ``asked``: where each request placed is noted (for ``sync``)."""
        self.paths = paths or HostPaths()
        self._calls = calls
        self.asked = asked or AskedRuns()

    @property
    def calls(self) -> BlockingCalls:
        if self._calls is None:
            self._calls = BlockingCalls(max_inflight=4, max_stuck=8, command=command())
        return self._calls

    def close(self) -> None:
        if self._calls is not None:
            self._calls.close()

    def check(self, params: Mapping[str, object]) -> list[str]:
        return _read(params)[1]

    def run(self, request: ActionRequest, timeout: float) -> ActionResult:
        params, errors = _read(request.params)
        if errors:
            return ActionResult("failed", "; ".join(errors))
        if request.transition == "resolved":
            return ActionResult("skipped", "a resolved rule asks for no checkpoint")
        entity = request.entity
        if entity.run_dir is None:
            return ActionResult("failed", f"a {entity.kind} entity names no run directory to ask in")
        placed = self._place(entity.run_dir, entity.run_root, request_text(request), min(timeout, FILE_SECONDS))
        if placed.outcome == "ok":
            self.asked.asked(entity.run_dir)
        if placed.outcome != "ok" or not params.signal:
            return placed
        sent, refused = self._signal(entity.run_dir, entity.writer_pids, SIGNALS[params.signal_name])
        detail = f"{placed.detail}; {params.signal_name} " + (
            f"sent to PID {', '.join(map(str, sent))}" if sent else "sent to no process"
        )
        if refused:
            detail += "; not sent to " + "; ".join(refused)
        return ActionResult("ok" if sent else "failed", detail)

    def _place(self, run_dir: str, root: str | None, text: str, timeout: float) -> ActionResult:
        shown = printable(run_dir)
        args = json.dumps({"root": root, "text": text}).encode().hex()
        outcome = self.calls.call_many(OP, {run_dir: [run_dir, args]}, timeout=timeout)[run_dir]
        if outcome.text is not None:
            try:
                answer = json.loads(outcome.text)
            except ValueError:
                answer = {}
            if isinstance(answer.get("done"), str):
                return ActionResult("ok", f"request file {answer['done']} in {shown}")
            return ActionResult("failed", printable(str(answer.get("refused", "no answer from the helper"))))
        if outcome.stuck or outcome.in_flight_seconds:
            return ActionResult("failed", f"{shown} did not answer within {timeout:g} s (a hung mount?)")
        return ActionResult("failed", f"request file not placed in {shown}: {printable(outcome.error or 'no answer')}")

    def _own_pid_namespace(self) -> bool:
        try:
            return os.readlink(self.paths.proc("self")) == str(os.getpid())
        except OSError:
            return False

    def _signal(self, run_dir: str, pids: tuple[int, ...], sig: signal.Signals) -> tuple[list[int], list[str]]:
        """(PIDs signalled, why each other was not)."""
        if not pids:
            return [], ["the run has no writer the kernel showed"]
        if not self._own_pid_namespace():
            return [], ["any process: the agent's procfs is not of its own PID namespace (hostPID off?)"]
        sent: list[int] = []
        refused: list[str] = []
        never = {1: "it is PID 1", os.getpid(): "it is this agent", os.getppid(): "it is this agent's parent"}
        for pid in dict.fromkeys(pids[:MAX_SIGNALLED]):
            if pid <= 0 or pid in never:
                refused.append(f"PID {pid}: {never.get(pid, 'not a process ID')}")
                continue
            why = self._signal_writer(pid, run_dir, sig)
            if why is None:
                sent.append(pid)
            else:
                refused.append(f"PID {pid}: {why}")
        if len(pids) > MAX_SIGNALLED:
            refused.append(f"{len(pids) - MAX_SIGNALLED} more writers: past the limit of {MAX_SIGNALLED}")
        return sent, refused

    def _signal_writer(self, pid: int, run_dir: str, sig: signal.Signals) -> str | None:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return "no such process"
        except OSError as err:
            return f"cannot hold the process (pidfd_open: {err.strerror or err})"
        try:
            # A fresh check, so nothing remembered vouches for the PID: the process must write under the run now.
            verdict = WriterCheck(self.paths).look(pid, run_dir)
            if verdict == GONE:
                return "no such process"
            if verdict is not None:
                return "not writing under the run (the kernel shows no file of it open for writing there)"
            try:
                signal.pidfd_send_signal(pidfd, sig)
            except ProcessLookupError:
                return "exited before the signal"
            except OSError as err:
                return f"signal refused: {err.strerror or err}"
            return None
        finally:
            with contextlib.suppress(OSError):
                os.close(pidfd)
