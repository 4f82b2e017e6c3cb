"""The ``request_checkpoint`` action: asks a training run for a checkpoint now, through the request file that
``storwatch.training.checkpoint_requested()`` polls (placed by :mod:`.request_file` in a helper process, see there
for what is never touched), and, opt-in, a signal to the run's writer processes.

A signal goes only to a run's own writer: a process whose work the agent's own looks saw holding one of the run's
checkpoint files (or a temporary of one) open for writing (``Entity.writers_seen``, never a PID a file names), and
only when, at the moment of acting, the kernel confirms it: the process held by a pidfd (so the signal reaches the
very process looked at, or none: ESRCH) started before that look (a PID is never reused while its process lives, so
a process alive now that started before the look is the one seen), and it catches the signal (``SigCgt`` in its
``status``: the default action of SIGUSR1 ends a job that installed no handler). Never for a run directory others may
write (world-writable or sticky, as the helper that placed the request file saw it: anyone could have made it a
run), never PID 1, this agent or its parent, and never where the agent's procfs is not of its own PID namespace
(without ``hostPID`` the PIDs it reads name other processes here). Where no signal may go, the request file alone
asks, and the result says why.

Params: ``signal`` (default false), ``signal_name`` (``SIGUSR1``, the default: Slurm's ``--signal`` and Lightning's
requeue handler use it; ``SIGUSR2``; ``SIGTERM``, for loops that checkpoint on a preemption notice). A resolution asks
for nothing (``skipped``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from storwatch.actions._request_worker import OP, command
from storwatch.actions.base import ActionRequest, ActionResult, Entity, acted_on
from storwatch.actions.params import Params
from storwatch.calls.blocking import BlockingCalls
from storwatch.paths import HostPaths
from storwatch.printable import printable
from storwatch.sources.writers import catches, started_at

SIGNALS: Mapping[str, signal.Signals] = {
    "SIGUSR1": signal.SIGUSR1,
    "SIGUSR2": signal.SIGUSR2,
    "SIGTERM": signal.SIGTERM,
}
MAX_SIGNALLED = 16
"""Writer PIDs looked at per request (a run written by every rank of a large job signals this many at most)."""
START_SLACK_SECONDS = 1.0
"""How much later than the look that saw it writing a writer may seem to have started: the kernel gives the boot time
to the second."""
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
        entity = acted_on(request.entity)  # an alert's: the run its labels name
        if entity.kind == "alert":
            return ActionResult("failed", "the alert names no run of this node")
        if entity.run_dir is None:
            return ActionResult("failed", f"a {entity.kind} entity names no run directory to ask in")
        placed, mode = self._place(entity.run_dir, entity.run_root, request_text(request), min(timeout, FILE_SECONDS))
        if placed.outcome == "ok":
            self.asked.asked(entity.run_dir)
        if placed.outcome != "ok" or not params.signal:
            return placed
        if mode is not None and mode & (stat.S_IWOTH | stat.S_ISVTX):
            why = "world-writable" if mode & stat.S_IWOTH else "sticky (a shared directory)"
            return ActionResult(
                "ok",
                f"{placed.detail}; {params.signal_name} sent to no process: the run's directory is {why}, so anyone "
                "could have made it a run; the request file alone asks",
            )
        sent, refused = self._signal(entity, SIGNALS[params.signal_name])
        detail = f"{placed.detail}; {params.signal_name} " + (
            f"sent to PID {', '.join(map(str, sent))}" if sent else "sent to no process: the request file alone asks"
        )
        if refused:
            detail += "; not sent to " + "; ".join(refused)
        return ActionResult("ok", detail)

    def _place(self, run_dir: str, root: str | None, text: str, timeout: float) -> tuple[ActionResult, int | None]:
        """The request file placed, and the run directory's mode as the helper saw it (None: not known)."""
        shown = printable(run_dir)
        args = json.dumps({"root": root, "text": text}, allow_nan=False).encode("ascii").hex()
        outcome = self.calls.call_many(OP, {run_dir: [run_dir, args]}, timeout=timeout)[run_dir]
        if outcome.text is not None:
            try:
                answer = json.loads(outcome.text)
            except ValueError:
                answer = {}
            if isinstance(answer.get("done"), str):
                mode = answer.get("mode")
                return ActionResult("ok", f"request file {answer['done']} in {shown}"), (
                    mode if isinstance(mode, int) and not isinstance(mode, bool) else None
                )
            return ActionResult("failed", printable(str(answer.get("refused", "no answer from the helper")))), None
        if outcome.stuck or outcome.in_flight_seconds:
            return ActionResult("failed", f"{shown} did not answer within {timeout:g} s (a hung mount?)"), None
        why = printable(outcome.error or "no answer")
        return ActionResult("failed", f"request file not placed in {shown}: {why}"), None

    def _own_pid_namespace(self) -> bool:
        try:
            return os.readlink(self.paths.proc("self")) == str(os.getpid())
        except OSError:
            return False

    def _signal(self, entity: Entity, sig: signal.Signals) -> tuple[list[int], list[str]]:
        """(PIDs signalled, why each other was not)."""
        seen = entity.writers_seen
        pids = tuple(dict.fromkeys((*seen, *entity.writer_pids)))
        if not pids:
            return [], ["any process: the kernel has shown no process writing the run's checkpoints"]
        if not self._own_pid_namespace():
            return [], ["any process: the agent's procfs is not of its own PID namespace (hostPID off?)"]
        sent: list[int] = []
        refused: list[str] = []
        never = {1: "it is PID 1", os.getpid(): "it is this agent", os.getppid(): "it is this agent's parent"}
        for pid in pids[:MAX_SIGNALLED]:
            if pid <= 0 or pid in never:
                refused.append(f"PID {pid}: {never.get(pid, 'not a process ID')}")
                continue
            if pid not in seen:
                refused.append(f"PID {pid}: the agent's own looks never saw it writing the run's checkpoints")
                continue
            why = self._signal_writer(pid, seen[pid], sig)
            if why is None:
                sent.append(pid)
            else:
                refused.append(f"PID {pid}: {why}")
        if len(pids) > MAX_SIGNALLED:
            refused.append(f"{len(pids) - MAX_SIGNALLED} more writers: past the limit of {MAX_SIGNALLED}")
        return sent, refused

    def _signal_writer(self, pid: int, seen_at: float, sig: signal.Signals) -> str | None:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return "no such process"
        except OSError as err:
            return f"cannot hold the process (pidfd_open: {err.strerror or err})"
        try:
            # Looked at while held: if the process exits and its PID is reused, the signal below goes nowhere.
            started = started_at(self.paths, pid)
            if started is None:
                return "no such process (or its start time cannot be read)"
            if started > seen_at + START_SLACK_SECONDS:
                return "the PID names a process started after the writer was seen: another process, not signalled"
            caught = catches(self.paths, pid, sig)
            if caught is None:
                return "its signal handlers cannot be read (SigCgt)"
            if not caught:
                return f"it does not catch {sig.name} (SigCgt), whose default action would end it"
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
